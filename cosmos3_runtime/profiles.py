"""Policy profiles: what each embodiment means to the model.

A profile maps an embodiment ``domain_name`` to its domain id (which selects the action head's
weights), its raw action width, its default horizon, the camera view point the model was trained with,
and the statistics that turn model-space actions (roughly in [-1, 1]) back into robot units.

Sources, later ones overriding earlier ones field by field:

1. diffusers' own Cosmos3 tables (domain ids and canonical widths);
2. ``policy_profiles.json`` shipped in the checkpoint, when there is one;
3. a profile file the operator gives the server.

Profile file format::

    {"domains": {"bridge_orig_lerobot": {"domain_id": 7, "raw_action_dim": 10,
                                         "default_horizon": 16, "view_point": "third_person_view",
                                         "normalization": {"q01": [...], "q99": [...]}},
                 "droid_lerobot": {"normalization_file": "stats/droid.json"}}}

A normalization is quantile (``q01``/``q99``), mean/std (``mean``/``std``) or min/max (``min``/``max``),
given inline or in its own JSON file (path relative to the profile file), optionally nested under
``"global"`` and/or ``"action"`` as common training exports write them. Profiles are loaded once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CheckpointError

VIEW_POINTS = ("ego_view", "third_person_view", "wrist_view", "concat_view")
DEFAULT_ACTION_HORIZON = 16
_EPS = 1e-8


@dataclass(frozen=True)
class NormalizationStats:
    """Per-dimension affine map between raw robot actions and the model's normalized space.

    ``quantile`` and ``min_max`` map [low, high] to [-1, 1]; ``mean_std`` standardizes.
    """

    kind: str  # "quantile", "mean_std" or "min_max"
    offset: np.ndarray  # the raw value that maps to 0
    scale: np.ndarray  # raw units per normalized unit

    @classmethod
    def from_mapping(cls, data: dict, where: str) -> "NormalizationStats":
        for nested in ("global", "action"):
            if isinstance(data.get(nested), dict):
                data = data[nested]
        pairs = {"quantile": ("q01", "q99"), "mean_std": ("mean", "std"), "min_max": ("min", "max")}
        for kind, (a_key, b_key) in pairs.items():
            if a_key in data and b_key in data:
                a = np.asarray(data[a_key], dtype=np.float64)
                b = np.asarray(data[b_key], dtype=np.float64)
                if a.ndim != 1 or a.shape != b.shape:
                    raise CheckpointError(f"{where}: {a_key}/{b_key} must be 1-D lists of equal length")
                if kind == "mean_std":
                    return cls(kind, a, np.maximum(b, _EPS))
                return cls(kind, (a + b) / 2.0, np.maximum((b - a) / 2.0, _EPS))
        raise CheckpointError(f"{where}: no q01/q99, mean/std or min/max statistics found")

    @property
    def dim(self) -> int:
        return int(self.offset.shape[0])

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return ((raw - self.offset) / self.scale).astype(np.float32)

    def denormalize(self, normalized: np.ndarray) -> np.ndarray:
        return (normalized * self.scale + self.offset).astype(np.float32)


@dataclass(frozen=True)
class PolicyProfile:
    """Everything the runtime needs to know about one embodiment."""

    domain_name: str
    domain_id: int
    raw_action_dim: int
    default_horizon: int = DEFAULT_ACTION_HORIZON
    view_point: str = "ego_view"
    normalization: NormalizationStats | None = None

    def describe(self) -> dict:
        return {
            "domain_id": self.domain_id,
            "raw_action_dim": self.raw_action_dim,
            "default_horizon": self.default_horizon,
            "view_point": self.view_point,
            "normalization": self.normalization.kind if self.normalization else None,
        }


def load_profiles(
    checkpoint_dir: Path,
    *,
    action_dim: int,
    num_domains: int,
    override_file: str | Path | None = None,
) -> dict[str, PolicyProfile]:
    """Build the profile table for a checkpoint (see the module docstring for the sources)."""
    from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as cosmos3

    fields: dict[str, dict] = {}
    for name, domain_id in cosmos3._EMBODIMENT_TO_DOMAIN_ID.items():
        width = cosmos3._EMBODIMENT_TO_RAW_ACTION_DIM.get(name)
        if width is not None:
            fields[name] = {"domain_id": domain_id, "raw_action_dim": width}
    for source in (checkpoint_dir / "policy_profiles.json", override_file):
        if source is not None and Path(source).is_file():
            _merge_profile_file(fields, Path(source))
        elif source is not None and source == override_file:
            raise CheckpointError(f"profile file {source} does not exist")

    profiles = {}
    for name, entry in fields.items():
        profile = _profile_from_fields(name, entry)
        if profile.domain_id >= num_domains or profile.raw_action_dim > action_dim:
            continue  # this checkpoint's action head cannot represent the domain
        profiles[name] = profile
    return profiles


def _merge_profile_file(fields: dict[str, dict], path: Path) -> None:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"profile file {path} is not valid JSON: {exc}") from exc
    domains = data.get("domains")
    if not isinstance(domains, dict):
        raise CheckpointError(f"profile file {path} needs a top-level 'domains' mapping")
    for name, entry in domains.items():
        if not isinstance(entry, dict):
            raise CheckpointError(f"profile file {path}: domain {name!r} must map to an object")
        entry = dict(entry)
        stats_file = entry.pop("normalization_file", None)
        if stats_file is not None:
            stats_path = (path.parent / stats_file).resolve()
            try:
                entry["normalization"] = json.loads(stats_path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise CheckpointError(f"profile file {path}: cannot read stats {stats_path}: {exc}") from exc
        if "normalization" in entry:
            entry["normalization"] = NormalizationStats.from_mapping(entry["normalization"], f"{path}:{name}")
        fields.setdefault(name, {}).update(entry)


def _profile_from_fields(name: str, entry: dict) -> PolicyProfile:
    missing = [key for key in ("domain_id", "raw_action_dim") if key not in entry]
    if missing:
        raise CheckpointError(f"profile for domain {name!r} lacks {', '.join(missing)} and diffusers has no default")
    view_point = entry.get("view_point", "ego_view")
    if view_point not in VIEW_POINTS:
        raise CheckpointError(f"profile for domain {name!r}: unknown view_point {view_point!r}")
    stats = entry.get("normalization")
    width = int(entry["raw_action_dim"])
    if stats is not None and stats.dim != width:
        raise CheckpointError(
            f"profile for domain {name!r}: normalization has {stats.dim} dimensions, the domain has {width}"
        )
    return PolicyProfile(
        domain_name=name,
        domain_id=int(entry["domain_id"]),
        raw_action_dim=width,
        default_horizon=int(entry.get("default_horizon", DEFAULT_ACTION_HORIZON)),
        view_point=view_point,
        normalization=stats,
    )
