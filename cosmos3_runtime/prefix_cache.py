"""The text prefix cache: the text tokens' per-layer keys and values, computed once per token sequence.

In Cosmos3's transformer the text (understanding) tokens attend only causally among themselves: their
hidden states, and so the keys and values they offer the generation tokens in every layer, depend on
nothing but the token ids (and their positions, which start at 0). They are the same at every
denoising step, and on every control tick of a session whose prompt and settings are unchanged.

The first forward for a token sequence records them (see :mod:`cosmos3_runtime.sequence_packing`);
later forwards run the generation tokens alone and read them from here. The key is the full token-id
sequence, which already encodes everything the prefix depends on (prompt, view point, horizon, canvas,
fps, mode; cond or uncond), so any change misses. The cache is an LRU bounded in bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .description import PrefixCacheStats


@dataclass
class PrefixEntry:
    """Per-layer text keys (normed, rotated) and values for one token-id sequence."""

    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values()))


class TextPrefixCache:
    """An LRU of :class:`PrefixEntry` keyed by token ids, bounded to ``budget_bytes``."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: tuple[int, ...]) -> PrefixEntry | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: tuple[int, ...], entry: PrefixEntry) -> None:
        size = entry.nbytes
        if size > self.budget_bytes:
            return  # larger than the whole budget: used for this request only
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._entries[key] = entry
        self.bytes += size
        while self.bytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(len(self), self.bytes, self.budget_bytes, self.hits, self.misses, self.evictions)
