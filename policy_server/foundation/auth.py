"""Token access control: one token set, one check, used by every door of the server.

The server is open when no token is configured (a lab bench on a private network). With tokens
(``cosmos3-serve --auth-token`` and/or ``--auth-token-file``) every request must carry one of them,
except ``/healthz`` (liveness probes) and the dashboard's static files (they carry no data; the
dashboard's live data comes through the observer channel, which is closed). ``docs/security.md`` lists
what is open and why.

Where a token may travel, in the order checked:

* ``Authorization: Bearer <token>``: robots, scripts, proxies; or ``Authorization: Api-Key <token>``, the
  scheme openpi-client (its ``api_key``) and strands-robots send, taken as the same token (scheme names are
  case-insensitive, as HTTP says);
* ``?token=<token>`` or ``?access_token=<token>`` in the URL: browsers cannot set headers on a
  WebSocket (the dashboard uses ``access_token``). URLs end up in logs: prefer the header;
* a ``Sec-WebSocket-Protocol`` entry ``bearer.<token>``: the other way a browser can send something on a
  WebSocket handshake. The server then selects that entry as the subprotocol, because a browser fails a
  handshake whose answer names none of the protocols it offered. The token must then be an RFC 7230
  token (``secrets.token_urlsafe`` output is).

Comparison is constant-time in the token's content and length: the candidate and every configured token
are hashed (SHA-256) and compared with :func:`hmac.compare_digest`, always against every configured
token, so neither which token matched nor how much of one matched shows in the timing.

The check runs before anything else: in the WebSocket server's ``process_request`` hook (HTTP 401 before
the upgrade, before any frame is decoded) and in an ASGI middleware outside the sidecar's application
(401 before routing, body parsing or model work).

Browsers are a second door: a page from any site can open a WebSocket to the server or send a
"no-cors" POST to it, and the browser attaches whatever the user's session would (on a private network,
nothing is needed at all). :class:`OriginPolicy` closes it: a WebSocket upgrade or a state-changing HTTP
request whose ``Origin`` header names another site is refused with 403. Allowed are requests without
``Origin`` (robots, scripts, curl: browsers always send it on these requests), the server's own origin
(the ``Host`` the request was sent to, on this port or the server's other port, where the dashboard is
served), and the origins listed with ``--allowed-origin``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

# The ASGI shapes of the two middlewares (Starlette's own, spelled here: the WebSocket port's server imports
# this module without loading Starlette).
AsgiScope = MutableMapping[str, Any]
AsgiMessage = MutableMapping[str, Any]
AsgiReceive = Callable[[], Awaitable[AsgiMessage]]
AsgiSend = Callable[[AsgiMessage], Awaitable[None]]
AsgiApp = Callable[[AsgiScope, AsgiReceive, AsgiSend], Awaitable[None]]

# Paths anyone may fetch: liveness, and the dashboard's static files (no data in them).
OPEN_PATHS = frozenset({"/healthz"})
OPEN_PREFIXES = ("/dashboard",)
QUERY_PARAMETERS = ("token", "access_token")
SUBPROTOCOL_PREFIX = "bearer."
# The ``Authorization`` schemes that carry a token, compared in lower case: the standard one, and openpi's.
AUTHORIZATION_SCHEMES = frozenset({"bearer", "api-key"})
CHALLENGE = 'Bearer realm="cosmos3-policy-server"'
UNAUTHORIZED_CODE = "unauthorized"
# The ASGI scope key where BearerAuthMiddleware leaves the admitted token's id (see AuthResult.token_id).
TOKEN_ID_SCOPE_KEY = "cosmos3.token_id"
FORBIDDEN_ORIGIN_CODE = "forbidden_origin"
# Methods that change nothing; browsers cannot read a cross-origin answer to them without CORS headers,
# which this server never sends.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class TokenConfigError(ValueError):
    """The configured tokens are unusable (empty, or a file that cannot be read)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _token_id(token: str) -> str:
    return _digest(token).hex()[:16]


def is_open_path(path: str) -> bool:
    """Whether ``path`` (no query) is served without a token."""
    return path in OPEN_PATHS or any(path == p or path.startswith(p + "/") for p in OPEN_PREFIXES)


@dataclass(frozen=True)
class AuthResult:
    """The outcome of a check: ``ok``, the subprotocol to select (when the token came as one), why not.

    ``token_id`` names the token that matched (the start of its SHA-256, never the token itself), so
    per-client bounds can count by token: it is the matching one even when the request also carried
    invalid candidates.
    """

    ok: bool
    subprotocol: str | None = None
    reason: str = ""
    token_id: str | None = None


class TokenSet:
    """The tokens that open the server. Build with :meth:`load`; an empty set is an error, not "open"."""

    def __init__(self, tokens: Iterable[str]) -> None:
        cleaned = [t.strip() for t in tokens if t and t.strip()]
        if not cleaned:
            raise TokenConfigError("no usable token: every configured token is empty")
        for token in cleaned:
            if any(c.isspace() for c in token):
                raise TokenConfigError(
                    "a token contains whitespace; use e.g. `python -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))'`"
                )
        self._digests = tuple(_digest(t) for t in cleaned)

    def __len__(self) -> int:
        return len(self._digests)

    @classmethod
    def load(cls, token: str | None = None, token_file: str | Path | None = None) -> TokenSet | None:
        """Tokens from a flag value and/or a file (one per line, ``#`` comments); None when neither is given."""
        tokens: list[str] = []
        if token:
            tokens.append(token)
        if token_file:
            try:
                text = Path(token_file).read_text(encoding="utf-8")
            except OSError as exc:
                raise TokenConfigError(f"cannot read the token file {token_file}: {exc.strerror}") from None
            tokens += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            if not tokens:
                raise TokenConfigError(f"the token file {token_file} holds no token")
        if token is None and token_file is None:
            return None
        return cls(tokens)

    def matches(self, candidate: str | None) -> bool:
        """Whether ``candidate`` is one of the tokens; constant-time (see the module's docstring)."""
        if not candidate:
            return False
        digest = _digest(candidate)
        found = False
        for known in self._digests:  # no early exit: every token is compared every time
            found |= hmac.compare_digest(digest, known)
        return found

    def check(self, get_header: Callable[[str], list[str]], query: str) -> AuthResult:
        """Check one request. ``get_header(name)`` returns every value of that header; ``query`` is raw."""
        offered = False
        for value in get_header("authorization"):
            scheme, _, credentials = value.strip().partition(" ")
            if scheme.lower() in AUTHORIZATION_SCHEMES:
                offered = True
                candidate = credentials.strip()
                if self.matches(candidate):
                    return AuthResult(True, token_id=_token_id(candidate))
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name in QUERY_PARAMETERS:
                offered = True
                if self.matches(value):
                    return AuthResult(True, token_id=_token_id(value))
        for header in get_header("sec-websocket-protocol"):
            for entry in header.split(","):
                entry = entry.strip()
                if entry.lower().startswith(SUBPROTOCOL_PREFIX):
                    offered = True
                    candidate = entry[len(SUBPROTOCOL_PREFIX) :]
                    if self.matches(candidate):
                        return AuthResult(True, subprotocol=entry, token_id=_token_id(candidate))
        if offered:
            return AuthResult(False, reason="the token is not valid for this server")
        return AuthResult(
            False,
            reason="this server requires a token: send `Authorization: Bearer <token>` (or `Api-Key <token>`, "
            "openpi's scheme; browsers: `?access_token=<token>` or the subprotocol `bearer.<token>`)",
        )


def bearer_subprotocol(offered: Iterable[str]) -> str | None:
    """The ``bearer.<token>`` entry among the client's offered subprotocols, to select it (echo it back).

    Called only after :meth:`TokenSet.check` accepted the handshake, so the entry is a valid token the
    client itself sent; echoing it is what the WebSocket handshake requires when it is the only entry.
    """
    for entry in offered:
        if entry.lower().startswith(SUBPROTOCOL_PREFIX):
            return entry
    return None


class BearerAuthMiddleware:
    """Pure ASGI: refuses every HTTP request without a valid token with 401, before the application runs.

    Outside every other middleware, so an unauthenticated client learns nothing (not even the body
    limit) and costs no body reading. ``on_refused(path)`` is called for every refusal (metrics).
    """

    def __init__(self, app: AsgiApp, *, tokens: TokenSet, on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.tokens = tokens
        self.on_refused = on_refused

    async def __call__(self, scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
        if scope["type"] != "http" or is_open_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])

        def get_header(name: str) -> list[str]:
            key = name.encode()
            return [v.decode("latin-1") for k, v in headers if k.lower() == key]

        result = self.tokens.check(get_header, scope.get("query_string", b"").decode("latin-1"))
        if result.ok:
            scope[TOKEN_ID_SCOPE_KEY] = result.token_id  # who this is, for per-client turns (http.turns)
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused(scope.get("path", ""))
        body = json.dumps({"error": {"code": UNAUTHORIZED_CODE, "message": result.reason, "field": None}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", CHALLENGE.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class OriginConfigError(ValueError):
    """An ``--allowed-origin`` value is not an origin (``scheme://host[:port]``, ``null`` or ``*``)."""


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a serialized origin, ports made explicit; None if it is not one."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if (
        scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.username is not None
    ):
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def _host_key(host: str, scheme: str) -> tuple[str, int] | None:
    """(host, port) of a ``Host`` header; a missing port is the default of the origin's ``scheme``."""
    try:
        parts = urlsplit("//" + host.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


class OriginPolicy:
    """Which browser origins may open a WebSocket or change state over HTTP (module docstring).

    ``allowed``: extra origins, e.g. ``https://ops.example.com``; ``null`` allows pages without an
    origin of their own (sandboxed frames, ``file://``); ``*`` allows any origin (turns the check off).
    """

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.any = False
        self.null = False
        keys: set[tuple[str, str, int]] = set()
        for origin in allowed:
            if origin.strip() == "*":
                self.any = True
            elif origin.strip().lower() == "null":
                self.null = True
            else:
                key = _origin_key(origin)
                if key is None:
                    raise OriginConfigError(
                        f"--allowed-origin {origin!r} is not an origin: write it as a browser "
                        "sends it, scheme://host[:port] (e.g. https://ops.example.com)"
                    )
                keys.add(key)
        self.allowed = frozenset(keys)

    def refusal(self, origin: str | None, host: str | None, own_ports: Iterable[int]) -> str | None:
        """None when a request with this ``Origin`` (None: absent) to this ``Host`` may proceed, else why not.

        ``own_ports``: this server's ports; an origin on the requested host and one of them is the server's
        own page (the dashboard is served by the HTTP sidecar and talks to the WebSocket port).
        """
        if origin is None or self.any:
            return None
        shown = repr(origin[:100])
        if origin.strip().lower() == "null":
            return None if self.null else "a page without an origin (null) may not use this server"
        key = _origin_key(origin)
        if key is None:
            return f"Origin {shown} is not an origin"
        if key in self.allowed:
            return None
        target = _host_key(host, key[0]) if host else None
        if target is not None and key[1] == target[0] and (key[2] == target[1] or key[2] in set(own_ports)):
            return None
        return f"cross-origin request from {shown} refused; allow that origin with --allowed-origin"


class OriginCheckMiddleware:
    """Pure ASGI: a state-changing HTTP request (not GET, HEAD or OPTIONS) from a foreign origin gets 403.

    Outermost, like :class:`BearerAuthMiddleware`: a refused request reads no body and runs nothing.
    ``own_ports()`` gives the server's ports at request time; ``on_refused(path)`` counts refusals.
    """

    def __init__(
        self,
        app: AsgiApp,
        *,
        policy: OriginPolicy,
        own_ports: Callable[[], Iterable[int]],
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.policy = policy
        self.own_ports = own_ports
        self.on_refused = on_refused

    async def __call__(self, scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
        if scope["type"] != "http" or scope.get("method") in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        reason = self.policy.refusal(headers.get(b"origin"), headers.get(b"host"), self.own_ports())
        if reason is None:
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused(scope.get("path", ""))
        body = json.dumps({"error": {"code": FORBIDDEN_ORIGIN_CODE, "message": reason, "field": None}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
