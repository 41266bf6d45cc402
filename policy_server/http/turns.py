"""Fair engine turns for one-shot HTTP action generations: whose request it is, and how many it may have.

A robot's WebSocket session holds one place in the request queue's ring, and a newer observation
replaces its waiting one. A ``POST /v1/actions/generations`` cannot be replaced (every request wants its
answer), so if each request were a session of its own, one client with 16 requests in flight would get
16 places in the ring for every robot's one. Instead:

* **One turn per client.** Every request of one client waits for that client's turn
  (:attr:`~policy_server.engine.request_queue.PendingObservation.turn`): the client as a whole gets one engine
  slot per round of the ring, like one robot, and its own requests go oldest first.
* **A bounded number in flight per client.** At most ``max_per_client`` requests of one client are
  admitted at once (being read, decoded, waiting or running); one more is refused at once with 429
  ``too_many_in_flight`` and ``Retry-After``, never left to wait without bound. It is refused before its
  body is read, so a refusal costs no decoding.

**Who is a client.** With authentication on, the bearer token the request was admitted with (its id
from :class:`~policy_server.foundation.auth.BearerAuthMiddleware`, never the token itself): tokens are what the
server trusts, and every holder of one token shares its turn and its bound. Without authentication, the
peer's IP address: every client behind one proxy or NAT is then one client (turn authentication on in
that setup; the server never trusts ``X-Forwarded-For``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from ..foundation.api_errors import ApiError, HttpErrorCode
from ..foundation.auth import TOKEN_ID_SCOPE_KEY
from ..sidecar_settings import DEFAULT_MAX_IN_FLIGHT

RETRY_AFTER_S = 1


def client_identity(scope: Mapping[str, Any]) -> str:
    """Who sent this HTTP request: ``token:<id>`` with authentication on, else ``peer:<address>``."""
    token_id = scope.get(TOKEN_ID_SCOPE_KEY)
    if token_id:
        return f"token:{token_id}"
    client = scope.get("client")
    return f"peer:{client[0] if client else 'unknown'}"


class InFlightLimit:
    """Counts each client's admitted requests and refuses one beyond ``max_per_client``.

    Used on the event loop only (admission and release happen there), so it needs no lock.
    """

    def __init__(self, max_per_client: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if max_per_client < 1:
            raise ValueError("max_per_client must be at least 1")
        self.max_per_client = max_per_client
        self._counts: dict[str, int] = {}
        # The most requests one client has had in flight at once since the start, and refusals.
        self.peak = 0
        self.refused = 0

    def in_flight(self, client: str) -> int:
        return self._counts.get(client, 0)

    @contextlib.contextmanager
    def admit(self, client: str) -> Iterator[None]:
        """Hold one of ``client``'s places for the ``with`` block, or raise 429 ``too_many_in_flight``."""
        count = self._counts.get(client, 0)
        if count >= self.max_per_client:
            self.refused += 1
            raise ApiError(
                HttpErrorCode.TOO_MANY_IN_FLIGHT,
                f"this client already has {count} action generations in flight, the most this server allows "
                f"per client; send the next one when one of them is answered",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self._counts[client] = count + 1
        self.peak = max(self.peak, count + 1)
        try:
            yield
        finally:
            left = self._counts[client] - 1
            if left:
                self._counts[client] = left
            else:
                del self._counts[client]
