"""Several jobs' sequences joined into the arguments of one transformer call, with its attention layout.

Each job brings one :class:`~cosmos3_runtime.sequence_packing.SequencePass` per pass (cond, or uncond under
guidance). The joint sequence is [text of the jobs that need it] + [generation tokens of every job]: text
the prefix cache holds is not sent at all (``REPLAY``), text it does not hold yet is recorded on the way
(``RECORD``). Every job's sequence positions are moved to where its tokens sit in the joint sequence, and
:attr:`PackedBatch.layout` tells :mod:`cosmos3_runtime.packed_attention` which tokens are whose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .packed_attention import PackedItem, PrefixMode
from .prefix_cache import PrefixEntry
from .sequence_packing import SequencePass


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
    packs: list[tuple[dict[str, Any], int, int]] = []  # (pack, its und_len, where its generation tokens start)
    layout: list[PackedItem] = []
    recording: list[tuple[SequencePass, PrefixEntry]] = []
    und_total = sum(0 if p.entry is not None else p.full["und_len"] for p in passes)
    und_at, gen_at = 0, 0
    for p in passes:
        if p.entry is not None:
            pack, mode, entry = p.generation_only, PrefixMode.REPLAY, p.entry
        elif record:
            pack, mode, entry = p.full, PrefixMode.RECORD, PrefixEntry()
            recording.append((p, entry))
        else:
            pack, mode, entry = p.full, PrefixMode.OFF, None
        und_len = pack["und_len"]
        gen_len = pack["sequence_length"] - und_len
        layout.append(PackedItem(und_at, und_len, gen_at, gen_len, mode, entry))
        packs.append((pack, und_len, und_total + gen_at))
        und_at += und_len
        gen_at += gen_len

    def cat(key: str) -> torch.Tensor:
        return torch.cat([pack[key] for pack, _, _ in packs])

    def moved(
        key: str,
    ) -> torch.Tensor:  # an item's sequence positions, moved to where its tokens sit in the joint sequence
        return torch.cat([pack[key] - und_len + gen_start for pack, und_len, gen_start in packs])

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
