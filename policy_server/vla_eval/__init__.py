"""vla-eval's model-server protocol (PyPI ``vla-eval``, allenai/vla-evaluation-harness), served at the
server's edge on a path of its own, ``/v1/vla-eval``, with its HTTP ``/health`` and ``/config``.

The frames, the observation mapping, the chunked-policy convention and the settings (:mod:`.translation`)
are pure translation, with no I/O; :mod:`.session` puts them on the server's session machinery and hands
the path and the HTTP answers (``/health``, ``/config``) to the server (``policy_server.assembly.cli.assemble_server``).
``docs/vla_eval.md`` is the reference.
"""

from .translation import VLA_EVAL_PATH, ChunkPlan, MappingFileError, ObservationMapping, VlaEvalSettings

__all__ = ["VLA_EVAL_PATH", "ChunkPlan", "MappingFileError", "ObservationMapping", "VlaEvalSettings"]
