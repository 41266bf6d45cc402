"""The HTTP sidecar's settings: where it listens, where video jobs live, and every limit it enforces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..media import DEFAULT_MAX_DECODED_BYTES
from ..videos.job_store import RetentionPolicy
from .codecs import DEFAULT_MAX_JSON_VALUES
from .connections import ConnectionLimits
from .turns import DEFAULT_MAX_IN_FLIGHT

# A 65-frame 256x256 clip as JSON nested lists is ~40 MB; as msgpack or an MP4 upload far less. 64 MiB
# bounds what one request can make the server buffer.
DEFAULT_MAX_BODY_BYTES = 64 * 2**20
# Two of the largest bodies at once; robots' requests are kilobytes.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 2 * DEFAULT_MAX_BODY_BYTES
DEFAULT_ACTION_TIMEOUT_S = 120.0


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
    # Pixels one request may decode to, and elements a JSON/msgpack body may hold (.codecs).
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    max_json_values: int = DEFAULT_MAX_JSON_VALUES
    # Header and body deadlines, connection caps, TCP_NODELAY (.connections).
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Body bytes all requests together may hold while they are read and parsed (.bodies.BodyBudget).
    max_buffered_body_bytes: int = DEFAULT_MAX_BUFFERED_BODY_BYTES
