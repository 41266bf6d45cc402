"""Sequence packing: each job's joint [text][vision][action] sequence, several jobs' sequences in one
transformer call, and attention that keeps each job to itself in that call.

- **One job's sequence** (:class:`SequencePass`, :func:`pack_sequence`): built by diffusers' own segment
  helpers (``Cosmos3OmniPipeline._prepare_text_segment``, ``_prepare_vision_segment``,
  ``_prepare_action_segment``), once per pass (cond, and uncond under guidance) of a job, since it does not
  change across denoising steps. Two changes of the serving runtime: robot state rows get
  cosmos-framework's positions (:func:`state_action_positions`), and a pass whose text keys/values the
  prefix cache holds can drop its text segment (:attr:`SequencePass.generation_only`).
- **Several jobs in one call** (:func:`pack_batch`): the joint sequence is [text of the jobs that need it]
  + [generation tokens of every job]. Text the prefix cache holds is not sent at all (``REPLAY``), text it
  does not hold yet is recorded on the way (``RECORD``), and a text that an earlier job of the call already
  sends is sent once (``SHARED``: robots with one prompt, every sample of a training batch); every job's
  positions are moved to where its tokens sit, and :attr:`PackedBatch.layout` says which tokens are whose.
- **Attention per job** (:class:`PackedAttnProcessor`): diffusers' Cosmos3 transformer already takes
  per-item lists, but its attention processor lets every token see every other. Ours keeps item *i*'s
  text tokens attending causally to its own text, its generation tokens to its own text and generation
  tokens, and records or replays the text keys/values (the prefix cache). Projections and MLPs run once
  over the whole packed sequence, which is where batching pays, and the attention of jobs of one shape
  runs as one batched call. With no layout set (any caller but the sampler, e.g. diffusers' own pipeline)
  it computes what the stock ``Cosmos3AttnProcessor`` computes. It is installed through diffusers'
  ``set_attn_processor``; the model is not forked.
- **The text prefix cache** (:class:`TextPrefixCache`), what that attention records and replays. In
  Cosmos3's transformer the text (understanding) tokens attend only causally among themselves: their
  keys and values in every layer depend on nothing but the token ids (and their positions, which start at
  0), so they are the same at every denoising step and on every control tick of a session whose prompt
  and settings are unchanged. The first forward for a token sequence records them; later forwards run
  the generation tokens alone and read them from the cache. The key is the full token-id sequence, which
  already encodes everything the prefix depends on (prompt, view point, horizon, canvas, fps, mode; cond
  or uncond), so any change misses. The cache is an LRU bounded in bytes.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, _rotate_half
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_vae_tokens

from .description import PrefixCacheStats
from .validation import DenoiseJob

# Pack fields holding positions in the joint sequence; they move when items are packed together.
_SEQUENCE_INDEX_FIELDS = (
    "vision_sequence_indexes",
    "vision_mse_loss_indexes",
    "action_sequence_indexes",
    "action_mse_loss_indexes",
)


# -- the text prefix cache ---------------------------------------------------------------------------


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


# -- one job's sequence -----------------------------------------------------------------------------


@dataclass
class SequencePass:
    """One transformer pass of one job (cond, or uncond under guidance) and its text prefix."""

    key: tuple[int, ...]
    full: dict[str, Any]  # the job's whole joint sequence, as the pipeline's segment helpers build it
    entry: PrefixEntry | None = None  # the text keys/values, once known
    _generation_only: dict[str, Any] | None = None

    @property
    def generation_only(self) -> dict[str, Any]:
        """The same inputs with the text segment removed (its keys/values come from the cache)."""
        if self._generation_only is None:
            und_len = self.full["und_len"]
            shifted = {k: self.full[k] - und_len for k in _SEQUENCE_INDEX_FIELDS}
            self._generation_only = {
                **self.full,
                **shifted,
                "input_ids": self.full["input_ids"][:0],
                "text_indexes": self.full["text_indexes"][:0],
                "und_len": 0,
                "position_ids": self.full["position_ids"][:, und_len:],
                "sequence_length": self.full["sequence_length"] - und_len,
            }
        return self._generation_only


def pack_sequence(
    pipe: Any,
    device: torch.device,
    input_ids: list[int],
    latents: torch.Tensor,
    action_latents: torch.Tensor,
    vision_frames: list[int],
    clean_action_frames: list[int],
    job: DenoiseJob,
) -> dict[str, Any]:
    """The step-invariant part of one job's joint sequence, built by the pipeline's own segment helpers."""
    fps = job.settings.fps
    text = pipe._prepare_text_segment(input_ids, device=device)
    vision = pipe._prepare_vision_segment(
        input_vision_tokens=latents,
        has_image_condition=True,
        mrope_offset=text["vision_start_temporal_offset"],
        vision_fps=fps,
        curr=text["und_len"],
        device=device,
        condition_frame_indexes=vision_frames,
    )
    action = pipe._prepare_action_segment(
        input_action_tokens=action_latents,
        condition_frame_indexes=clean_action_frames,
        mrope_offset=text["vision_start_temporal_offset"],
        action_fps=fps,
        curr=text["und_len"] + vision["num_vision_tokens"],
        device=device,
    )
    if job.leading_rows:
        action["action_mrope_ids"] = state_action_positions(
            pipe, device, action["action_len"], job.leading_rows, text["vision_start_temporal_offset"], fps
        )
    return {
        **text,
        **vision,
        **action,
        "position_ids": torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"], action["action_mrope_ids"]], 1),
        "sequence_length": text["und_len"] + vision["num_vision_tokens"] + action["action_len"],
    }


def state_action_positions(
    pipe: Any, device: torch.device, action_len: int, leading_rows: int, mrope_offset: int, fps: float
) -> torch.Tensor:
    """mRoPE ids of an action segment whose first ``leading_rows`` rows are the robot's state rows.

    diffusers places action row 0 at video frame 1: the first action follows the conditioning frame.
    cosmos-framework places state rows before that, at frames ``1 - leading_rows`` .. 0 (with
    ``use_state`` the current state sits at the conditioning frame 0), so the chunk still starts at
    frame 1: its sequence plan's ``action_start_frame_offset`` is ``1 - leading_rows``. This is the call
    ``Cosmos3OmniPipeline._prepare_action_segment`` makes, with that offset.
    """
    config = pipe.transformer.config
    ids, _ = get_3d_mrope_ids_vae_tokens(
        grid_t=action_len,
        grid_h=1,
        grid_w=1,
        temporal_offset=mrope_offset,
        reset_spatial_indices=config.unified_3d_mrope_reset_spatial_ids,
        fps=fps if config.enable_fps_modulation else None,
        base_fps=float(config.base_fps),
        temporal_compression_factor=1,
        base_temporal_compression_factor=pipe.vae_scale_factor_temporal,
        start_frame_offset=1 - leading_rows,
    )
    positions: torch.Tensor = ids.to(device)
    return positions


# -- several jobs in one transformer call ------------------------------------------------------------


@dataclass
class PackedBatch:
    """One transformer call over several jobs."""

    arguments: dict[str, Any]  # the transformer's keyword arguments, but return_dict
    layout: list[PackedItem]  # where each job's tokens sit, for the packed attention
    recording: list[tuple[SequencePass, PrefixEntry]]  # passes whose text keys/values this call records


def pack_batch(
    passes: Sequence[SequencePass],
    vision_tokens: Sequence[torch.Tensor],
    action_tokens: Sequence[torch.Tensor],
    domain_ids: Sequence[torch.Tensor],
    *,
    record: bool,
    timestep: float | Sequence[float],
    dtype: torch.dtype,
    device: torch.device,
) -> PackedBatch:
    """The joint call of the jobs whose passes, current latents and domain ids are given (in one order).

    ``record``: a prefix cache is on, so text it does not hold yet is recorded into a new entry.
    ``timestep``: one value for every noisy token (sampling), or one per job (training draws a noise level
    per sample).
    """
    # (pack, its und_len, where its generation tokens start among all jobs' generation tokens)
    packs: list[tuple[dict[str, Any], int, int]] = []
    layout: list[PackedItem] = []
    recording: list[tuple[SequencePass, PrefixEntry]] = []
    # Text segments this call computes, by token ids: a later item with the same text shares its keys/values
    # (text attends only to itself, so they are the same), and its text tokens are not sent twice.
    owners: dict[tuple[int, ...], PackedItem] = {}
    und_at, gen_at = 0, 0
    for p in passes:
        owner = owners.get(p.key) if p.entry is None else None
        entry: PrefixEntry | None
        if p.entry is not None:
            pack, mode, entry = p.generation_only, PrefixMode.REPLAY, p.entry
        elif owner is not None:
            pack, mode, entry = p.generation_only, PrefixMode.SHARED, owner.entry
            if owner.entry is not None:
                recording.append((p, owner.entry))
        elif record:
            pack, mode, entry = p.full, PrefixMode.RECORD, PrefixEntry()
            recording.append((p, entry))
        else:
            pack, mode, entry = p.full, PrefixMode.OFF, None
        und_len = pack["und_len"]
        gen_len = pack["sequence_length"] - und_len
        if owner is not None:
            item = PackedItem(owner.und_start, owner.und_len, gen_at, gen_len, mode, entry)
        else:
            item = PackedItem(und_at, und_len, gen_at, gen_len, mode, entry)
        if mode in (PrefixMode.RECORD, PrefixMode.OFF):
            owners[p.key] = item
        layout.append(item)
        packs.append((pack, und_len, gen_at))
        und_at += und_len
        gen_at += gen_len
    und_total = und_at  # every text this call sends comes before every generation token

    def cat(key: str) -> torch.Tensor:
        return torch.cat([pack[key] for pack, _, _ in packs])

    def moved(
        key: str,
    ) -> torch.Tensor:  # an item's sequence positions, moved to where its tokens sit in the joint sequence
        return torch.cat([pack[key] - und_len + und_total + gen_start for pack, und_len, gen_start in packs])

    def per_item(key: str) -> list[Any]:
        return [x for pack, _, _ in packs for x in pack[key]]

    def timesteps(modality: str) -> torch.Tensor:  # one value for the batch, or one per job
        if isinstance(timestep, (int, float)):
            noisy_tokens = sum(pack[f"num_noisy_{modality}_tokens"] for pack, _, _ in packs)
            return torch.full((noisy_tokens,), float(timestep), device=device)
        return torch.cat(
            [
                torch.full((pack[f"num_noisy_{modality}_tokens"],), float(t), device=device)
                for (pack, _, _), t in zip(packs, timestep, strict=True)
            ]
        )

    def modality_inputs(
        modality: str, tokens: Sequence[torch.Tensor]
    ) -> dict[str, Any]:  # the transformer's vision_* or action_* arguments, built alike
        return {
            f"{modality}_tokens": [x.to(dtype) for x in tokens],
            f"{modality}_token_shapes": per_item(f"{modality}_token_shapes"),
            f"{modality}_sequence_indexes": moved(f"{modality}_sequence_indexes"),
            f"{modality}_mse_loss_indexes": moved(f"{modality}_mse_loss_indexes"),
            f"{modality}_timesteps": timesteps(modality),
            f"{modality}_noisy_frame_indexes": per_item(f"{modality}_noisy_frame_indexes"),
        }

    position_ids = torch.cat(
        [pack["position_ids"][:, :und_len] for pack, und_len, _ in packs]
        + [pack["position_ids"][:, und_len:] for pack, und_len, _ in packs],
        dim=1,
    )
    arguments = dict(
        input_ids=cat("input_ids"),
        text_indexes=torch.arange(und_total, dtype=torch.long, device=device),
        position_ids=position_ids,
        und_len=und_total,
        sequence_length=und_total + gen_at,
        **modality_inputs("vision", vision_tokens),
        **modality_inputs("action", action_tokens),
        action_domain_ids=list(domain_ids),
    )
    return PackedBatch(arguments, layout, recording)


# -- attention per job in the packed call -----------------------------------------------------------


class PrefixMode(enum.Enum):
    OFF = "off"  # text tokens present, nothing kept
    RECORD = "record"  # text tokens present; keep their keys/values in the entry
    REPLAY = "replay"  # no text tokens in this forward; keys/values come from the entry
    SHARED = "shared"  # no text tokens of its own; keys/values are an earlier item's of this call, same text


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

        # Text: each segment this call computes attends causally to itself; segments of one length run as one
        # batch. SHARED items have no text rows of their own, REPLAY items read theirs from the cache.
        computed = [item for item in items if item.mode in (PrefixMode.OFF, PrefixMode.RECORD)]
        und_parts = []
        for run in _runs(
            computed, lambda item: (item.und_len,), lambda item: item.und_start, lambda item: item.und_len
        ):
            u, b, n = slice(run[0].und_start, run[0].und_start + len(run) * run[0].und_len), len(run), run[0].und_len
            q, k, v = (x[u].view(b, n, *x.shape[1:]) for x in (q_und, k_und, v_und))
            und_parts.append(self._attend(q, k, v, causal=True).flatten(0, 1))
        for item in computed:
            if item.mode is PrefixMode.RECORD:
                assert item.entry is not None, "a recorded item writes its entry"
                u = slice(item.und_start, item.und_start + item.und_len)
                # Copies, so a cached entry does not pin the whole packed batch's tensors.
                item.entry.keys[self.layer_index] = k_und_for_gen[u].clone()
                item.entry.values[self.layer_index] = v_und[u].clone()

        def text_of(item: PackedItem) -> tuple[torch.Tensor, torch.Tensor]:  # the keys/values item's tokens see
            if item.mode is PrefixMode.REPLAY:
                assert item.entry is not None, "a replayed item reads its entry"
                return item.entry.keys[self.layer_index], item.entry.values[self.layer_index]
            u = slice(item.und_start, item.und_start + item.und_len)
            return k_und_for_gen[u], v_und[u]

        def text_source(item: PackedItem) -> tuple[str, int]:  # items with one source see the same tensors
            return ("entry", id(item.entry)) if item.mode is PrefixMode.REPLAY else ("rows", item.und_start)

        # Generation: each item attends to its text and its own tokens; items of one shape run as one batch.
        gen_parts = []
        for run in _runs(
            items, lambda item: (item.gen_len, text_of(item)[0].shape[0]), lambda i: i.gen_start, lambda i: i.gen_len
        ):
            b, n = len(run), run[0].gen_len
            g = slice(run[0].gen_start, run[0].gen_start + b * n)
            q, k, v = (x[g].view(b, n, *x.shape[1:]) for x in (q_gen, k_gen, v_gen))
            texts = [text_of(item) for item in run]
            if len({text_source(item) for item in run}) == 1:
                text_k = texts[0][0].expand(b, *texts[0][0].shape)
                text_v = texts[0][1].expand(b, *texts[0][1].shape)
            else:
                text_k, text_v = torch.stack([t[0] for t in texts]), torch.stack([t[1] for t in texts])
            out = self._attend(q, torch.cat([text_k, k], 1), torch.cat([text_v, v], 1), causal=False)
            gen_parts.append(out.flatten(0, 1))

        und_out = attn.to_out(torch.cat(und_parts)) if und_parts else torch.zeros_like(und_seq)
        gen_out = attn.to_add_out(torch.cat(gen_parts))
        return und_out, gen_out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        """Attention over sequences ``(batch, tokens, heads, head_dim)``, as ``(batch, tokens, heads * head_dim)``."""
        out = dispatch_attention_fn(
            q,
            k,
            v,
            is_causal=causal,
            enable_gqa=True,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        flat: torch.Tensor = out.flatten(-2, -1)
        return flat


def _runs(
    items: Sequence[PackedItem],
    shape: Callable[[PackedItem], tuple[int, ...]],
    start: Callable[[PackedItem], int],
    length: Callable[[PackedItem], int],
) -> list[list[PackedItem]]:
    """``items`` cut into runs of one ``shape`` whose tokens follow each other, so that each run is one batch."""
    runs: list[list[PackedItem]] = []
    for item in items:
        last = runs[-1][-1] if runs else None
        if last is not None and shape(last) == shape(item) and start(last) + length(last) == start(item):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def install_packed_attention(transformer: Any) -> PackedAttentionState:
    """Give every attention layer of ``transformer`` a packed-attention processor sharing one state."""
    state = PackedAttentionState()
    names = list(transformer.attn_processors)
    transformer.set_attn_processor({name: PackedAttnProcessor(i, state) for i, name in enumerate(names)})
    return state
