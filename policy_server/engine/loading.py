"""How an engine is loaded from the command line's flags: one :class:`EngineLoader` for every backend.

The local worker calls :meth:`EngineLoader.load` on its thread; the Ray backend pickles the same loader to each
replica, which calls it there. So every flag that shapes the engine (the request cost bound
``--max-request-cost`` among them) reaches every backend by one path. No Ray import here: the local backend
never loads Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cosmos3_runtime.description import EngineLimits
from cosmos3_runtime.quantization import Quantization


@dataclass(frozen=True)
class EngineLoader:
    """How an engine is loaded (pickled to a Ray replica: paths must exist on its node).

    ``limits``: the request bounds the engine's rules enforce and its ``describe()`` states, so the front end's
    rule keeper refuses what the engine would (``max_chunk_cost``: ``--max-request-cost``). ``memory_check``:
    hold the checkpoint to the memory plan before reading weights (off where the command line did it already).
    ``torch_threads`` and ``warmup`` are for whoever runs the engine (a replica; the local worker has its own).
    """

    source: str
    device: str | None = None
    dtype: str | None = None
    profiles_path: str | None = None
    prefix_cache_mb: float = 256.0
    compile: bool = False
    quantization: Quantization | None = None
    torch_threads: int | None = None
    warmup: bool = True
    limits: EngineLimits = field(default_factory=EngineLimits)
    memory_check: bool = True

    def load(self) -> Any:
        from cosmos3_runtime.engine import Cosmos3Engine

        return Cosmos3Engine.load(
            self.source,
            device=self.device,
            dtype=self.dtype,
            profiles_path=self.profiles_path,
            prefix_cache_mb=self.prefix_cache_mb,
            compile=self.compile,
            quantization=self.quantization,
            limits=self.limits,
            memory_check=self.memory_check,
        )
