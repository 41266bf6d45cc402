"""The text prefix cache: compute the text tokens' keys and values once, reuse them every step and tick.

In Cosmos3's transformer the text (understanding) tokens attend only causally among themselves: their
hidden states, and so the keys and values they offer the generation tokens in every layer, depend on
nothing but the token ids (and their positions, which start at 0). They are the same at every
denoising step, and on every control tick of a session whose prompt and settings are unchanged.

So the first forward for a given token sequence runs the whole joint sequence and records, per layer,
the keys (normed, rotated) and values the generation pathway reads from the text. Every later forward
with the same ids runs the generation tokens alone (``und_len = 0``) and the attention processor puts
the recorded keys and values in front of the generation keys and values. The text pathway's
projections, causal attention and MLPs are skipped entirely.

This goes through diffusers' attention processor mechanism (``set_attn_processor``); the model is not
forked. The key is the full token-id sequence, which already encodes everything the prefix depends on
(prompt, view point, horizon, canvas, fps, mode; cond or uncond), so any change misses. The cache is an
LRU bounded in bytes.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, _rotate_half


class PrefixMode(enum.Enum):
    OFF = "off"  # the stock computation
    RECORD = "record"  # full sequence; store the text keys/values of every layer
    REPLAY = "replay"  # generation tokens only; read the text keys/values from the entry


@dataclass
class PrefixEntry:
    """Per-layer text keys and values for one token-id sequence."""

    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values()))


@dataclass
class PrefixCacheState:
    """What the processors should do during the current forward (set by the sampler around each call)."""

    mode: PrefixMode = PrefixMode.OFF
    entry: PrefixEntry | None = None


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
            return  # larger than the whole budget: use it for this request only
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

    def stats(self) -> dict:
        return {"entries": len(self), "bytes": self.bytes, "budget_bytes": self.budget_bytes,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}


class PrefixCachingAttnProcessor(Cosmos3AttnProcessor):
    """``Cosmos3AttnProcessor`` that can record or replay the text pathway's keys and values.

    With the state's mode ``OFF`` it computes exactly what the stock processor computes.
    """

    def __init__(self, layer_index: int, state: PrefixCacheState):
        self.layer_index = layer_index
        self.state = state

    def __call__(self, attn, und_seq, gen_seq, rotary_emb):
        state = self.state
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        if state.mode is PrefixMode.REPLAY:
            prefix_k = state.entry.keys[self.layer_index]
            prefix_v = state.entry.values[self.layer_index]
            und_out = torch.zeros_like(und_seq)  # no text tokens in this forward
        else:
            q_und = attn.to_q(und_seq).view(-1, attn.num_attention_heads, attn.head_dim)
            k_und = attn.to_k(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            v_und = attn.to_v(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            q_und = attn.norm_q(q_und)
            k_und = attn.norm_k(k_und)
            k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und
            cos_und, sin_und = cos_und.unsqueeze(1), sin_und.unsqueeze(1)
            q_und = q_und * cos_und + _rotate_half(q_und) * sin_und
            k_und = k_und * cos_und + _rotate_half(k_und) * sin_und
            prefix_k = k_und_for_gen * cos_und + _rotate_half(k_und_for_gen) * sin_und
            prefix_v = v_und
            causal_out = dispatch_attention_fn(
                q_und.unsqueeze(0), k_und.unsqueeze(0), v_und.unsqueeze(0), is_causal=True, enable_gqa=True,
                backend=self._attention_backend, parallel_config=self._parallel_config,
            )
            und_out = attn.to_out(causal_out.squeeze(0).flatten(-2, -1))
            if state.mode is PrefixMode.RECORD:
                state.entry.keys[self.layer_index] = prefix_k
                state.entry.values[self.layer_index] = prefix_v

        q_gen = attn.add_q_proj(gen_seq).view(-1, attn.num_attention_heads, attn.head_dim)
        k_gen = attn.add_k_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
        v_gen = attn.add_v_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
        q_gen = attn.norm_added_q(q_gen)
        k_gen = attn.norm_added_k(k_gen)
        cos_gen, sin_gen = cos_gen.unsqueeze(1), sin_gen.unsqueeze(1)
        q_gen = q_gen * cos_gen + _rotate_half(q_gen) * sin_gen
        k_gen = k_gen * cos_gen + _rotate_half(k_gen) * sin_gen
        full_out = dispatch_attention_fn(
            q_gen.unsqueeze(0),
            torch.cat([prefix_k, k_gen], dim=0).unsqueeze(0),
            torch.cat([prefix_v, v_gen], dim=0).unsqueeze(0),
            is_causal=False, enable_gqa=True,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        gen_out = attn.to_add_out(full_out.squeeze(0).flatten(-2, -1))
        return und_out, gen_out


def install_prefix_processors(transformer) -> PrefixCacheState:
    """Give every attention layer of ``transformer`` a prefix-caching processor sharing one state."""
    state = PrefixCacheState()
    names = list(transformer.attn_processors)
    processors = {name: PrefixCachingAttnProcessor(i, state) for i, name in enumerate(names)}
    transformer.set_attn_processor(processors)
    return state


def generation_only(pack: dict) -> dict:
    """The same forward inputs with the text segment removed (its keys/values come from the cache)."""
    und_len = pack["und_len"]
    shifted = {}
    for key in ("vision_sequence_indexes", "vision_mse_loss_indexes", "action_sequence_indexes",
                "action_mse_loss_indexes"):
        shifted[key] = pack[key] - und_len
    return {
        **pack,
        **shifted,
        "input_ids": pack["input_ids"][:0],
        "text_indexes": pack["text_indexes"][:0],
        "und_len": 0,
        "position_ids": pack["position_ids"][:, und_len:],
        "sequence_length": pack["sequence_length"] - und_len,
    }
