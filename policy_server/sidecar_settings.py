"""The HTTP sidecar's settings: where it listens, where video jobs live, and every limit it enforces.

They live beside the core's :mod:`~policy_server.server_settings`, outside ``http/``: the command line reads
and defaults them whether or not the sidecar runs, and a WebSocket-only server must load no sidecar code
(no ``policy_server.http``, no ``policy_server.videos``, no pydantic). The sidecar takes them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .foundation.camera_intake import DEFAULT_MAX_DECODED_BYTES

# A 65-frame 256x256 clip as JSON nested lists is ~40 MB; as msgpack or an MP4 upload far less. 64 MiB
# bounds what one request can make the server buffer.
DEFAULT_MAX_BODY_BYTES = 64 * 2**20
# Two of the largest bodies at once; robots' requests are kilobytes.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 2 * DEFAULT_MAX_BODY_BYTES
DEFAULT_ACTION_TIMEOUT_S = 120.0
# Elements (numbers, lists, maps) a JSON or msgpack body may hold. Parsed, each is a Python object or a
# pointer to one (a pixel as `[r, g, b]` costs about 90 bytes): 2 million stay under 200 MiB at their
# worst; that is a 700×700 image as nested lists. Larger pixel arrays travel as encoded images or as
# msgpack arrays, which cost one byte per value.
DEFAULT_MAX_JSON_VALUES = 2_000_000
# Requests of one client admitted at once. Enough to overlap one request's upload and decoding with
# another's engine turn; more would only wait in the client's own line.
DEFAULT_MAX_IN_FLIGHT = 4
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_CONNECTIONS_PER_PEER = 32
# Request line plus headers. Tokens and cookies fit many times over; httptools itself sets no bound.
MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True)
class SidecarConnectionLimits:
    """Deadlines and caps of the sidecar's connections (flags in ``docs/security.md``)."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    max_header_bytes: int = MAX_HEADER_BYTES
    tcp_nodelay: bool = True


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished video jobs are kept and how much disk their results may take."""

    max_age_s: float = 24 * 3600.0
    max_bytes: int = 2 * 2**30  # inputs of jobs still to run plus finished results
    max_queued: int = 100


@dataclass
class SidecarSettings:
    """Where the sidecar listens, where jobs live, and its limits."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8001
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S
    # Action generations one client (token, or peer address without auth) may have in flight; more: 429.
    max_actions_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    # Pixels one request may decode to, and elements a JSON/msgpack body may hold (http/codecs.py).
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    max_json_values: int = DEFAULT_MAX_JSON_VALUES
    # Header and body deadlines, connection caps, TCP_NODELAY (http/connections.py).
    connections: SidecarConnectionLimits = field(default_factory=SidecarConnectionLimits)
    # Body bytes all requests together may hold while they are read and parsed (http/bodies.py's BodyBudget).
    max_buffered_body_bytes: int = DEFAULT_MAX_BUFFERED_BODY_BYTES
