"""vla-eval's model-server protocol (PyPI ``vla-eval``, allenai/vla-evaluation-harness), served at the
server's edge on a path of its own, ``/v1/vla-eval``, with its HTTP ``/health`` and ``/config``.

The frames (:mod:`.frames`), the observation mapping (:mod:`.mapping`) and the chunked-policy convention
(:mod:`.chunks`) are pure translation, with no I/O; the session (:mod:`.session`) puts them on the
server's session machinery, and :mod:`.endpoints` hands the path and the HTTP answers (``/health``,
``/config``) to the server (``policy_server.cli.assemble_server``). ``docs/vla_eval.md`` is the reference.
"""

from .chunks import ChunkPlan
from .mapping import MappingFileError, ObservationMapping
from .settings import VLA_EVAL_PATH, VlaEvalSettings

__all__ = ["VLA_EVAL_PATH", "ChunkPlan", "MappingFileError", "ObservationMapping", "VlaEvalSettings"]
