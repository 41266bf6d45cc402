"""vla-eval's model-server protocol (PyPI ``vla-eval``, allenai/vla-evaluation-harness) as a WebSocket
dialect of the server, on ``/v1/vla-eval``, with its HTTP ``/health`` and ``/config``.

The frames (:mod:`.frames`), the observation mapping (:mod:`.mapping`), the chunked-policy convention
(:mod:`.chunks`) and the HTTP answers (:mod:`.control`) are pure translation, with no I/O; the session
(:mod:`.session`) puts them on the server's session machinery. ``docs/vla_eval.md`` is the reference.
"""

from .chunks import ChunkPlan
from .mapping import MappingFileError, ObservationMapping
from .settings import VLA_EVAL_PATH, VlaEvalSettings

__all__ = ["VLA_EVAL_PATH", "ChunkPlan", "MappingFileError", "ObservationMapping", "VlaEvalSettings"]
