"""Attention over a packed sequence of several requests, with the text prefix recorded or replayed.

diffusers' Cosmos3 transformer already packs several items into one joint sequence (its inputs are
per-item lists: vision tokens, shapes, noisy frames, action tokens, domain ids), but its attention
processor lets every token see every other. :class:`PackedAttnProcessor` keeps each item's attention
to itself: the text tokens of item *i* attend causally to item *i*'s text, its generation tokens to
item *i*'s text and generation tokens. Projections and MLPs run once over the whole packed sequence,
which is where batching several robots' requests pays.

Per item the processor can also record the text keys/values (``RECORD``) or take them from a cache
entry and see no text tokens at all (``REPLAY``): that is the text prefix cache of
:mod:`cosmos3_runtime.prefix_cache`. With no layout set (any caller that is not the sampler, e.g.
diffusers' own pipeline) it computes what the stock ``Cosmos3AttnProcessor`` computes.

It is installed through diffusers' attention processor mechanism (``set_attn_processor``); the model
is not forked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, _rotate_half

from .prefix_cache import PrefixEntry


class PrefixMode(enum.Enum):
    OFF = "off"  # text tokens present, nothing kept
    RECORD = "record"  # text tokens present; keep their keys/values in the entry
    REPLAY = "replay"  # no text tokens in this forward; keys/values come from the entry


@dataclass(frozen=True)
class PackedItem:
    """Where one item's tokens sit in the understanding and generation halves of the packed sequence."""

    und_start: int
    und_len: int
    gen_start: int
    gen_len: int
    mode: PrefixMode = PrefixMode.OFF
    entry: PrefixEntry | None = None


class PackedAttentionState:
    """The layout of the current forward, shared by every layer's processor (set by the sampler)."""

    def __init__(self) -> None:
        self.items: list[PackedItem] | None = None


class PackedAttnProcessor(Cosmos3AttnProcessor):  # type: ignore[misc]  # diffusers is read as Any
    """``Cosmos3AttnProcessor`` with per-item attention and text prefix record/replay."""

    def __init__(self, layer_index: int, state: PackedAttentionState) -> None:
        self.layer_index = layer_index
        self.state = state

    def __call__(
        self, attn: Any, und_seq: torch.Tensor, gen_seq: torch.Tensor, rotary_emb: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        items = self.state.items or [PackedItem(0, und_seq.shape[0], 0, gen_seq.shape[0])]
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim

        if und_seq.shape[0]:
            q_und = attn.norm_q(attn.to_q(und_seq).view(-1, heads, head_dim))
            k_und = attn.norm_k(attn.to_k(und_seq).view(-1, kv_heads, head_dim))
            v_und = attn.to_v(und_seq).view(-1, kv_heads, head_dim)
            k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und
            cos_und, sin_und = cos_und.unsqueeze(1), sin_und.unsqueeze(1)
            q_und = q_und * cos_und + _rotate_half(q_und) * sin_und
            k_und = k_und * cos_und + _rotate_half(k_und) * sin_und
            k_und_for_gen = k_und_for_gen * cos_und + _rotate_half(k_und_for_gen) * sin_und

        q_gen = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, heads, head_dim))
        k_gen = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, kv_heads, head_dim))
        v_gen = attn.add_v_proj(gen_seq).view(-1, kv_heads, head_dim)
        cos_gen, sin_gen = cos_gen.unsqueeze(1), sin_gen.unsqueeze(1)
        q_gen = q_gen * cos_gen + _rotate_half(q_gen) * sin_gen
        k_gen = k_gen * cos_gen + _rotate_half(k_gen) * sin_gen

        und_parts, gen_parts = [], []
        for item in items:
            if item.mode is PrefixMode.REPLAY:
                assert item.entry is not None, "a replayed item reads its entry"
                prefix_k = item.entry.keys[self.layer_index]
                prefix_v = item.entry.values[self.layer_index]
            else:
                u = slice(item.und_start, item.und_start + item.und_len)
                und_parts.append(self._attend(q_und[u], k_und[u], v_und[u], causal=True))
                prefix_k, prefix_v = k_und_for_gen[u], v_und[u]
                if item.mode is PrefixMode.RECORD:
                    assert item.entry is not None, "a recorded item writes its entry"
                    # Copies, so a cached entry does not pin the whole packed batch's tensors.
                    item.entry.keys[self.layer_index] = prefix_k.clone()
                    item.entry.values[self.layer_index] = prefix_v.clone()
            g = slice(item.gen_start, item.gen_start + item.gen_len)
            gen_parts.append(
                self._attend(q_gen[g], torch.cat([prefix_k, k_gen[g]]), torch.cat([prefix_v, v_gen[g]]), causal=False)
            )

        und_out = attn.to_out(torch.cat(und_parts)) if und_parts else torch.zeros_like(und_seq)
        gen_out = attn.to_add_out(torch.cat(gen_parts))
        return und_out, gen_out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        out = dispatch_attention_fn(
            q.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            is_causal=causal,
            enable_gqa=True,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        flat: torch.Tensor = out.squeeze(0).flatten(-2, -1)
        return flat


def install_packed_attention(transformer: Any) -> PackedAttentionState:
    """Give every attention layer of ``transformer`` a packed-attention processor sharing one state."""
    state = PackedAttentionState()
    names = list(transformer.attn_processors)
    transformer.set_attn_processor({name: PackedAttnProcessor(i, state) for i, name in enumerate(names)})
    return state
