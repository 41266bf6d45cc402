"""Bearer-token access control: one token set, one check, used by every door of the server.

The server is open when no token is configured (a lab bench on a private network). With tokens
(``cosmos3-serve --auth-token`` and/or ``--auth-token-file``) every request must carry one of them,
except ``/healthz`` (liveness probes) and the dashboard's static files (they carry no data; the
dashboard's live data comes through the observer channel, which is closed). ``docs/security.md`` lists
what is open and why.

Where a token may travel, in the order checked:

* ``Authorization: Bearer <token>``: robots, scripts, proxies;
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
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Iterable
from urllib.parse import parse_qsl

# Paths anyone may fetch: liveness, and the dashboard's static files (no data in them).
OPEN_PATHS = frozenset({"/healthz"})
OPEN_PREFIXES = ("/dashboard",)
QUERY_PARAMETERS = ("token", "access_token")
SUBPROTOCOL_PREFIX = "bearer."
CHALLENGE = 'Bearer realm="cosmos3-policy-server"'
UNAUTHORIZED_CODE = "unauthorized"
# The ASGI scope key where BearerAuthMiddleware leaves the admitted token's id (see AuthResult.token_id).
TOKEN_ID_SCOPE_KEY = "cosmos3.token_id"


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
                raise TokenConfigError("a token contains whitespace; use e.g. `python -c 'import secrets; "
                                       "print(secrets.token_urlsafe(32))'`")
        self._digests = tuple(_digest(t) for t in cleaned)

    def __len__(self) -> int:
        return len(self._digests)

    @classmethod
    def load(cls, token: str | None = None, token_file: str | Path | None = None) -> "TokenSet | None":
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
            if scheme.lower() == "bearer":
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
                    candidate = entry[len(SUBPROTOCOL_PREFIX):]
                    if self.matches(candidate):
                        return AuthResult(True, subprotocol=entry, token_id=_token_id(candidate))
        if offered:
            return AuthResult(False, reason="the token is not valid for this server")
        return AuthResult(False, reason="this server requires a token: send `Authorization: Bearer <token>` "
                                        "(browsers: `?access_token=<token>` or the subprotocol `bearer.<token>`)")


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

    def __init__(self, app: Callable, *, tokens: TokenSet,
                 on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.tokens = tokens
        self.on_refused = on_refused

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http" or is_open_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])

        def get_header(name: str) -> list[str]:
            key = name.encode()
            return [v.decode("latin-1") for k, v in headers if k.lower() == key]

        result = self.tokens.check(get_header, scope.get("query_string", b"").decode("latin-1"))
        if result.ok:
            scope[TOKEN_ID_SCOPE_KEY] = result.token_id  # who this is, for per-client turns (http_turns)
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused(scope.get("path", ""))
        body = json.dumps({"error": {"code": UNAUTHORIZED_CODE, "message": result.reason, "field": None}}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", CHALLENGE.encode()),
        ]})
        await send({"type": "http.response.body", "body": body})

