"""The sidecar's routes, one router per resource: each module's ``router(parts)`` returns a FastAPI
``APIRouter`` whose handlers use only the :class:`~policy_server.http.parts.SidecarParts` they are given.

* :mod:`.videos`: ``/v1/videos`` (forward_dynamics rollouts as asynchronous jobs);
* :mod:`.actions`: ``POST /v1/actions/generations`` (one chunk of actions per request);
* :mod:`.metadata`: ``GET /v1/actions/metadata`` and the operations routes ``/healthz``, ``/readyz``,
  ``/metrics``;
* :mod:`.recordings`: ``/v1/recordings`` (recorded sessions, read-only, for the dashboard's replay).
"""
