"""Policy profiles: what each embodiment means to the model, read from the checkpoint's own files.

A profile maps an embodiment ``domain_name`` to everything the runtime needs to serve it the way the
policy was trained: its domain id (which selects the action head's weights), its action space and
width, the chunk it predicts, the frame rate and resolution tier its clips had, the camera view point
(and, for composed views, how the cameras are laid out), the caption format of its prompts, the
guidance interval, how the robot's state conditions it (state width, history rows, a flipped gripper)
and the statistics that turn model-space actions back into robot units.

Sources, later ones overriding earlier ones field by field:

1. diffusers' own Cosmos3 tables (domain ids and canonical widths), and for NVIDIA's released DROID
   policies, which ship no profile, their contract (:data:`NVIDIA_DROID_CONTRACT`, NVIDIA's server's values);
2. the ``policy`` block of the checkpoint's ``checkpoint.json`` (NVIDIA's exported policies: the chunk, the
   conditioning fps, the domain, optionally the width and whether the state conditions it);
3. ``policy_profiles.json`` shipped in the checkpoint, when there is one;
4. a profile file the operator gives the server.

The file format is documented, with a worked DROID example, in ``docs/runtime.md``.

A normalization is quantile (``q01``/``q99``), mean/std (``mean``/``std``) or min/max (``min``/``max``),
given inline or in its own JSON file (``normalization_file``, relative to the profile file), optionally
nested under ``"global"`` and/or ``"action"`` as common training exports write them; ``"none"`` (or
``null``) says the model works in raw robot units. Unknown keys are refused, so a misspelt field never
silently falls back to a default. Profiles are loaded once.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoints import CheckpointInfo
from .errors import CheckpointError, InvalidFieldError, InvalidRequestError, MissingFieldError

VIEW_POINTS = ("ego_view", "third_person_view", "wrist_view", "concat_view")
# "json": the structured action caption (diffusers' builder, and cosmos-framework's
# format_prompt_as_json, which Edge checkpoints are trained with); "prose": the task followed by
# the view point, duration/FPS and resolution sentences (cosmos-framework's default appenders).
PROMPT_FORMATS = ("json", "prose")
# "joint_pos": the model's rows are the robot's (joints and gripper, or whatever the domain acts in);
# "midtrain": the robot's rows are end-effector poses [x, y, z, qx, qy, qz, qw, gripper], the model's are
# 10 wide, [translation, rot6d, gripper], relative poses (cosmos3_runtime.poses; docs/runtime.md).
ACTION_SPACES = ("joint_pos", "midtrain")
MIDTRAIN_POSE_WIDTH = 8  # the robot's midtrain rows
MIDTRAIN_MODEL_WIDTH = 10  # the model's midtrain rows
# Tiers diffusers' action path has canvases for; a variant may support fewer (checked at engine load).
RESOLUTION_TIERS = (256, 480, 704, 720)
DEFAULT_ACTION_HORIZON = 16
DEFAULT_FPS = 24.0  # diffusers' Cosmos3 pipeline default
MAX_HISTORY_LENGTH = 16
# Bounds on a profile's sampler settings: the engine's request limits (EngineLimits), and a flow shift
# that keeps the sigmas ordered (shift > 0) and the schedule meaningful.
MAX_STEPS = 200
MAX_GUIDANCE_SCALE = 30.0
MIN_SHIFT, MAX_SHIFT = 0.01, 100.0
_EPS = 1e-8


@dataclass(frozen=True, eq=False)
class NormalizationStats:
    """Per-dimension affine map between raw robot actions and the model's normalized space.

    ``quantile`` and ``min_max`` map [low, high] to [-1, 1]; ``mean_std`` standardizes.
    """

    kind: str  # "quantile", "mean_std" or "min_max"
    offset: np.ndarray  # the raw value that maps to 0
    scale: np.ndarray  # raw units per normalized unit

    @classmethod
    def from_mapping(cls, data: dict[str, Any], where: str) -> NormalizationStats:
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

    def __eq__(self, other: object) -> bool:
        # By value, so that a profile (and a model description) equals its copy from another process.
        if not isinstance(other, NormalizationStats):
            return NotImplemented
        return (
            self.kind == other.kind
            and np.array_equal(self.offset, other.offset)
            and np.array_equal(self.scale, other.scale)
        )

    __hash__ = None  # type: ignore[assignment]  # arrays: equal by value, not hashable

    @property
    def dim(self) -> int:
        return int(self.offset.shape[0])

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        normalized: np.ndarray = ((raw - self.offset) / self.scale).astype(np.float32)
        return normalized

    def denormalize(self, normalized: np.ndarray) -> np.ndarray:
        raw: np.ndarray = (normalized * self.scale + self.offset).astype(np.float32)
        return raw


# The keys of :attr:`PolicyProfile.state_contract`, for a reply that names them when no domain is known.
STATE_CONTRACT_FIELDS = ("state_dim", "use_state", "history_length", "action_space")


@dataclass(frozen=True)
class PolicyProfile:
    """Everything the runtime needs to know about one embodiment (see the module docstring)."""

    domain_name: str
    domain_id: int
    raw_action_dim: int  # the width of the robot's rows: each action, each state row, each prefix row
    action_space: str = "joint_pos"  # one of ACTION_SPACES: how the robot's rows become the model's
    default_horizon: int = DEFAULT_ACTION_HORIZON  # the chunk: actions predicted per request
    fps: float = DEFAULT_FPS  # the frame rate of the clips (and actions) the policy was trained on
    resolution_tier: int | None = None  # None: the variant's default tier
    view_point: str = "ego_view"
    view_description: str | None = None  # how a composed view is laid out, added to the view sentence
    prompt_format: str = "json"
    # How the policy was evaluated: its sampler settings, above the variant's defaults and below a
    # request's own values (None: the variant's). Non-distilled checkpoints only.
    num_steps: int | None = None
    guidance_scale: float | None = None
    shift: float | None = None  # the flow shift of the scheduler's sigmas
    guidance_interval: tuple[float, float] | None = None  # sigmas; guidance only inside (non-distilled)
    gripper_flip_index: int | None = None  # the model sees 1 - value there (open/closed swapped)
    normalization: NormalizationStats | None = None
    # How the robot's state conditions the model: ``history_length`` state rows become clean action
    # frames in front of the chunk (``use_state``: the last of them is the state at the conditioning
    # frame). State rows are action-space rows, so ``state_dim`` equals ``raw_action_dim``; None when
    # the domain takes no state.
    use_state: bool = False
    history_length: int = 0
    state_dim: int | None = None
    # The longest real-time-chunking prefix the policy was trained to continue (cosmos3-train's --max-prefix).
    # A longer prefix is clamped to it: only its first max_prefix rows condition the chunk, never an error (a
    # robot's delay grows past what training saw); the reply still starts with every row sent (the robot
    # executes them regardless). None: no bound known, every row conditions.
    max_prefix: int | None = None

    @property
    def model_action_dim(self) -> int:
        """The width of the model's rows: the robot's, or 10 for a ``midtrain`` pose of 8."""
        return MIDTRAIN_MODEL_WIDTH if self.action_space == "midtrain" else self.raw_action_dim

    @property
    def state_contract(self) -> dict[str, object]:
        """What the profile says about the state a robot sends (:data:`STATE_CONTRACT_FIELDS`): its shape, and
        what its rows are (joints and the like as the model takes them, or midtrain's end-effector poses)."""
        return {
            "state_dim": self.state_dim,
            "use_state": self.use_state,
            "history_length": self.history_length,
            "action_space": self.action_space,
        }

    def check_state(self, state: object) -> np.ndarray | None:
        """The robot's state as float32 rows ``[history_length, state_dim]``, or None
        for a domain that takes no state; raises :class:`MissingFieldError` / :class:`InvalidFieldError`
        (field ``state``) for an absent, refused or misshapen one."""
        rows, name = self.history_length, self.domain_name
        if not rows or self.state_dim is None:
            if state is not None:
                raise InvalidFieldError(
                    f"domain {name!r} does not condition on the robot's state (its profile has no state_dim, "
                    "see the metadata's `domains`): leave state unset",
                    "state",
                )
            return None
        shape = f"[{self.state_dim}]" if rows == 1 else f"[{rows}, {self.state_dim}]"
        if state is None:
            raise MissingFieldError(
                f"domain {name!r} conditions on the robot's state: send state, a float array "
                f"{shape}" + (" (oldest row first)" if rows > 1 else ""),
                "state",
            )
        if not isinstance(state, np.ndarray) or state.dtype.kind not in "fiu":
            raise InvalidFieldError(f"state must be a numeric array {shape}", "state")
        matrix = state[None] if state.ndim == 1 else state
        if matrix.ndim != 2 or matrix.shape[1] != self.state_dim or matrix.shape[0] != rows:
            raise InvalidFieldError(
                f"state has shape {list(state.shape)}; domain {name!r} has state_dim {self.state_dim} and "
                f"history_length {rows}, so state must be {shape}",
                "state",
            )
        matrix = matrix.astype(np.float32)
        if not np.isfinite(matrix).all():
            raise InvalidFieldError(f"state contains NaN or infinity; send finite values {shape}", "state")
        return matrix

    def check_actions(self, actions: object, field: str = "actions") -> np.ndarray:
        """Raw actions of this domain as float32 rows ``[T, raw_action_dim]``, T >= 1, finite; raises
        :class:`InvalidRequestError` naming ``field`` (a rollout's ``actions``, a chunk's ``prefix_actions``)."""
        if not isinstance(actions, np.ndarray) or actions.dtype.kind not in "fiu":
            raise InvalidRequestError(f"{field} must be a numeric array (T x {self.raw_action_dim})", field)
        if actions.ndim != 2 or actions.shape[0] < 1:
            raise InvalidRequestError(f"{field} must have shape T x D, got {list(actions.shape)}", field)
        if actions.shape[1] != self.raw_action_dim:
            raise InvalidRequestError(
                f"{field} has width {actions.shape[1]} but domain {self.domain_name!r} has "
                f"{self.raw_action_dim} action dimensions",
                field,
            )
        with np.errstate(over="ignore"):
            rows = actions.astype(np.float32)
        if not np.isfinite(rows).all():
            raise InvalidRequestError(f"{field} contains NaN or infinity", field)
        return rows

    def check_prefix(self, prefix: object, mode: str, horizon: int) -> np.ndarray:
        """A real-time-chunking prefix (the actions the robot still executes while the chunk is made) as
        float32 rows: a ``policy`` request's only, of this domain's width, shorter than the chunk of
        ``horizon`` actions. Raises :class:`InvalidRequestError` (field ``prefix_actions``)."""
        if mode != "policy":
            raise InvalidRequestError(
                f"prefix_actions (real-time chunking) apply to policy requests only, not {mode}", "prefix_actions"
            )
        rows = self.check_actions(prefix, "prefix_actions")
        if rows.shape[0] >= horizon:
            raise InvalidRequestError(
                f"prefix_actions must be shorter than the chunk ({horizon} actions), got {rows.shape[0]} rows",
                "prefix_actions",
            )
        return rows

    def trained_prefix(self, rows: np.ndarray) -> np.ndarray | None:
        """The rows of a checked prefix that condition the chunk: at most :attr:`max_prefix` (clamped, never
        refused), or None when the policy was trained with none."""
        if self.max_prefix is None:
            return rows
        return rows[: self.max_prefix] if self.max_prefix > 0 else None

    def to_model(self, raw: np.ndarray) -> np.ndarray:
        """Raw rows of the model's width (actions, or state rows) -> the model's action space.

        For ``midtrain`` the robot's poses become such rows first (:mod:`cosmos3_runtime.poses`).
        """
        rows = np.array(raw, dtype=np.float32)
        if self.gripper_flip_index is not None:
            rows[..., self.gripper_flip_index] = 1.0 - rows[..., self.gripper_flip_index]
        return self.normalization.normalize(rows) if self.normalization is not None else rows

    def to_robot(self, model: np.ndarray) -> np.ndarray:
        """Model-space action rows -> raw units, still of the model's width: :meth:`to_model` inverted."""
        rows = self.normalization.denormalize(model) if self.normalization is not None else model
        rows = np.array(rows, dtype=np.float32)
        if self.gripper_flip_index is not None:
            rows[..., self.gripper_flip_index] = 1.0 - rows[..., self.gripper_flip_index]
        return rows


# What a domain's entry in a profile file may hold: the profile's fields (its name is the entry's key),
# and ``normalization_file``, statistics kept in a file of their own.
_PROFILE_KEYS = (
    *(profile_field.name for profile_field in dataclasses.fields(PolicyProfile) if profile_field.name != "domain_name"),
    "normalization_file",
)


@dataclass(frozen=True)
class ProfileTable:
    """The profiles of one checkpoint and the domain to use when a caller names none."""

    domains: dict[str, PolicyProfile]
    default_domain: str | None  # None only when there are no domains

    @classmethod
    def build(cls, domains: dict[str, PolicyProfile], named_default: str | None) -> ProfileTable:
        if named_default is not None:
            if named_default not in domains:
                raise CheckpointError(
                    f"default_domain {named_default!r} is not a domain this checkpoint's action head can serve; "
                    f"it serves: {', '.join(sorted(domains)) or 'none'}"
                )
            return cls(domains, named_default)
        # Unnamed: the first domain the checkpoint ships statistics for, else the first by name.
        with_stats = [n for n, p in domains.items() if p.normalization is not None]
        ranked = with_stats or sorted(domains)
        return cls(domains, ranked[0] if ranked else None)


# NVIDIA's released DROID policies ship no policy_profiles.json: NVIDIA's own server (cosmos-framework's
# RoboLab server) holds their contract in its flags' defaults, and TensorRT-LLM in a code preset. The runtime
# holds it here, once, for the checkpoints it recognises (:func:`is_nvidia_droid_policy`), so that serving
# NVIDIA's repo id needs no profile file. The chunk and the fps are also in the Edge export's checkpoint.json.
NVIDIA_DROID_REPOS = ("nvidia/Cosmos3-Nano-Policy-DROID", "nvidia/Cosmos3-Edge-Policy-DROID")
NVIDIA_DROID_DOMAIN = "droid_lerobot"
NVIDIA_DROID_CONTRACT: dict[str, Any] = {
    "action_space": "joint_pos",  # 7 joint positions and the gripper
    "raw_action_dim": 8,
    "default_horizon": 32,
    "fps": 15.0,
    "use_state": True,  # the robot's state is the plan's first action row
    "history_length": 1,
    "gripper_flip_index": 7,  # the model sees 1 - gripper_position
    "normalization": None,  # raw joint positions
    "resolution_tier": 480,
    "view_point": "concat_view",  # the wrist camera on top, the two exterior cameras side by side below
    "view_description": "The top row is from the wrist-mounted camera. The bottom row contains two horizontally "
    "concatenated third-person perspective views of the scene from opposite sides, with the robot visible.",
    "prompt_format": "json",
}
# Its sampler: 4 UniPC steps, guidance 3.0, shift 5.0; the Edge recipe adds guidance only in timesteps
# 960-1001 (``--guidance-interval 960 1001``: the first of the 4 steps).
NVIDIA_DROID_SAMPLER: dict[str, Any] = {"num_steps": 4, "guidance_scale": 3.0, "shift": 5.0}
NVIDIA_EDGE_DROID_INTERVAL = [960, 1001]


def is_nvidia_droid_policy(checkpoint_dir: Path, source: str | None = None) -> bool:
    """Whether the checkpoint is one of NVIDIA's DROID policies: its ``checkpoint.json`` names the DROID
    domain in its ``policy`` block (the Edge export), or it was named by, or downloaded from, one of
    :data:`NVIDIA_DROID_REPOS` (a Hub id, or a folder of the Hub's cache, ``models--nvidia--...``)."""
    names = [source or "", str(checkpoint_dir)]
    for repo in NVIDIA_DROID_REPOS:
        cached = "models--" + repo.replace("/", "--")
        if any(name.lower().startswith(repo.lower()) or cached.lower() in name.lower() for name in names):
            return True
    path = checkpoint_dir / "checkpoint.json"
    try:
        policy = json.loads(path.read_text()).get("policy") if path.is_file() else None
    except (OSError, json.JSONDecodeError, AttributeError):
        return False  # _merge_checkpoint_policy names what is wrong with it
    return isinstance(policy, dict) and policy.get("domain_name") == NVIDIA_DROID_DOMAIN


def nvidia_droid_profile(info: CheckpointInfo) -> dict[str, Any]:
    """NVIDIA's DROID contract for this checkpoint: with NVIDIA's sampler unless it is distilled (it runs its
    own list), and the guidance interval on Edge."""
    profile = dict(NVIDIA_DROID_CONTRACT)
    if not info.is_distilled:
        profile.update(NVIDIA_DROID_SAMPLER)
        if info.is_edge:
            profile["guidance_interval"] = NVIDIA_EDGE_DROID_INTERVAL
    return profile


def profiles_for_checkpoint(
    checkpoint_dir: Path, info: CheckpointInfo, override_file: str | Path | None = None, source: str | None = None
) -> ProfileTable:
    """The profile table of an inspected checkpoint (empty without an action head), an operator file merged in.

    ``source``: how the checkpoint was named (a Hub id), to recognise NVIDIA's DROID policies by."""
    if not info.has_action_head or info.action_dim is None:
        return ProfileTable({}, None)
    preset = {NVIDIA_DROID_DOMAIN: nvidia_droid_profile(info)} if is_nvidia_droid_policy(checkpoint_dir, source) else {}
    return load_profiles(
        checkpoint_dir,
        action_dim=info.action_dim,
        num_domains=info.num_embodiment_domains,
        override_file=override_file,
        num_train_timesteps=int(info.scheduler_config.get("num_train_timesteps", 1000)),
        preset=preset,
    )


def load_profiles(
    checkpoint_dir: Path,
    *,
    action_dim: int,
    num_domains: int,
    override_file: str | Path | None = None,
    num_train_timesteps: int = 1000,
    preset: dict[str, dict[str, Any]] | None = None,
) -> ProfileTable:
    """Build the profile table for a checkpoint (see the module docstring for the sources).

    ``num_train_timesteps`` (the scheduler's) converts a guidance interval written in timesteps. ``preset``:
    profiles the runtime knows for this checkpoint (NVIDIA's DROID contract), above diffusers' tables and
    below the checkpoint's own files; a preset's domain is the default one unless a later source names another.
    """
    from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as cosmos3

    fields: dict[str, dict[str, Any]] = {}
    for name, domain_id in cosmos3._EMBODIMENT_TO_DOMAIN_ID.items():
        width = cosmos3._EMBODIMENT_TO_RAW_ACTION_DIM.get(name)
        if width is not None:
            fields[name] = {"domain_id": domain_id, "raw_action_dim": width}
    for name, entry in (preset or {}).items():
        fields.setdefault(name, {}).update(entry)
    named_default = next(iter(preset), None) if preset else None
    named_default = _merge_checkpoint_policy(fields, checkpoint_dir / "checkpoint.json") or named_default
    for source in (checkpoint_dir / "policy_profiles.json", override_file):
        if source is not None and Path(source).is_file():
            named_default = _merge_profile_file(fields, Path(source)) or named_default
        elif source is not None and source == override_file:
            raise CheckpointError(f"profile file {source} does not exist")

    profiles = {}
    for name, entry in fields.items():
        profile = _profile_from_fields(name, entry, num_train_timesteps)
        if profile.domain_id >= num_domains or profile.model_action_dim > action_dim:
            continue  # this checkpoint's action head cannot represent the domain
        profiles[name] = profile
    return ProfileTable.build(profiles, named_default)


# checkpoint.json's "policy" block (NVIDIA's exported policy checkpoints) -> the profile fields it sets.
CHECKPOINT_POLICY_KEYS = {
    "action_chunk_size": "default_horizon",
    "conditioning_fps": "fps",
    "raw_action_dim": "raw_action_dim",
    "use_state": "use_state",
}


def _merge_checkpoint_policy(fields: dict[str, dict[str, Any]], path: Path) -> str | None:
    """Merge the ``policy`` block of the checkpoint's ``checkpoint.json`` into ``fields``; return its domain.

    NVIDIA's exported policy checkpoints (Cosmos3-Edge-Policy-DROID) write the contract the policy was
    trained with there: ``{"policy": {"action_chunk_size": 32, "conditioning_fps": 15.0, "domain_name":
    "droid_lerobot"}}``, optionally ``raw_action_dim`` and ``use_state``. It is the first source after
    diffusers' tables; ``policy_profiles.json`` and an operator's file add to or override it.
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    policy = data.get("policy") if isinstance(data, dict) else None
    if policy is None:
        return None  # a checkpoint.json without a policy contract (Nano's carries its training config)
    domain = policy.get("domain_name") if isinstance(policy, dict) else None
    if not isinstance(domain, str) or not domain:
        raise CheckpointError(f"{path}: policy must be an object naming its domain_name")
    entry = {target: policy[key] for key, target in CHECKPOINT_POLICY_KEYS.items() if policy.get(key) is not None}
    fields.setdefault(domain, {}).update(entry)
    return domain


def _merge_profile_file(fields: dict[str, dict[str, Any]], path: Path) -> str | None:
    """Merge one profile file into ``fields``; return the default domain it names, if any."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"profile file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"profile file {path} must hold a JSON object")
    unknown = sorted(set(data) - {"domains", "default_domain"})
    if unknown:
        raise CheckpointError(
            f"profile file {path}: unknown top-level key(s) {', '.join(unknown)}; "
            "expected 'domains' and optionally 'default_domain'"
        )
    domains = data.get("domains")
    if not isinstance(domains, dict):
        raise CheckpointError(f"profile file {path} needs a top-level 'domains' mapping")
    default = data.get("default_domain")
    if default is not None and not isinstance(default, str):
        raise CheckpointError(f"profile file {path}: default_domain must be a domain name")
    for name, entry in domains.items():
        if not isinstance(entry, dict):
            raise CheckpointError(f"profile file {path}: domain {name!r} must map to an object")
        unknown = sorted(set(entry) - set(_PROFILE_KEYS))
        if unknown:
            raise CheckpointError(
                f"profile file {path}: domain {name!r} has unknown key(s) {', '.join(unknown)}; "
                f"known keys: {', '.join(_PROFILE_KEYS)}"
            )
        entry = dict(entry)
        stats_file = entry.pop("normalization_file", None)
        if stats_file is not None:
            stats_path = (path.parent / stats_file).resolve()
            try:
                entry["normalization"] = json.loads(stats_path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise CheckpointError(f"profile file {path}: cannot read stats {stats_path}: {exc}") from exc
        if "normalization" in entry:
            stats = entry["normalization"]
            if stats is None or stats == "none":
                entry["normalization"] = None  # raw robot units: overrides statistics from an earlier source
            elif isinstance(stats, dict):
                entry["normalization"] = NormalizationStats.from_mapping(stats, f"{path}:{name}")
            else:
                raise CheckpointError(
                    f"profile file {path}: domain {name!r} normalization must be statistics "
                    '(q01/q99, mean/std or min/max), "none" or null'
                )
        fields.setdefault(name, {}).update(entry)
    return default


def _profile_from_fields(name: str, entry: dict[str, Any], num_train_timesteps: int) -> PolicyProfile:
    where = f"profile for domain {name!r}"
    missing = [key for key in ("domain_id", "raw_action_dim") if key not in entry]
    if missing:
        raise CheckpointError(f"{where} lacks {', '.join(missing)} and diffusers has no default")
    width = _integer(entry, "raw_action_dim", where, low=1)  # the model's rows
    action_space = entry.get("action_space", "joint_pos")
    if action_space not in ACTION_SPACES:
        raise CheckpointError(f"{where}: action_space must be one of {', '.join(ACTION_SPACES)}, got {action_space!r}")
    if action_space == "midtrain" and width != MIDTRAIN_MODEL_WIDTH:
        raise CheckpointError(
            f"{where}: a midtrain domain's model rows are [translation(3), rot6d(6), gripper(1)]: "
            f"raw_action_dim must be {MIDTRAIN_MODEL_WIDTH}, got {width}"
        )
    view_point = entry.get("view_point", "ego_view")
    if view_point not in VIEW_POINTS:
        raise CheckpointError(f"{where}: unknown view_point {view_point!r}; expected one of {', '.join(VIEW_POINTS)}")
    prompt_format = entry.get("prompt_format", "json")
    if prompt_format not in PROMPT_FORMATS:
        raise CheckpointError(
            f"{where}: prompt_format must be one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}"
        )
    tier = entry.get("resolution_tier")
    if tier is not None and (isinstance(tier, bool) or tier not in RESOLUTION_TIERS):
        raise CheckpointError(
            f"{where}: resolution_tier must be one of {', '.join(map(str, RESOLUTION_TIERS))}, got {tier!r}"
        )
    fps = entry.get("fps", DEFAULT_FPS)
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 1.0 <= fps <= 240.0:
        raise CheckpointError(f"{where}: fps must be a number in [1, 240], got {fps!r}")
    flip = entry.get("gripper_flip_index")
    if flip is not None:
        flip = _integer(entry, "gripper_flip_index", where, low=0, high=width - 1)
    stats = entry.get("normalization")
    if stats is not None and stats.dim != width:
        raise CheckpointError(f"{where}: normalization has {stats.dim} dimensions, the domain has {width}")
    robot_width = MIDTRAIN_POSE_WIDTH if action_space == "midtrain" else width
    use_state, history, state_dim = _state_conditioning(entry, where, robot_width)
    if action_space == "midtrain" and not use_state:
        raise CheckpointError(
            f"{where}: a midtrain domain's actions are composed from the robot's current pose, "
            "so it needs use_state (its state rows are poses [x, y, z, qx, qy, qz, qw, gripper])"
        )
    return PolicyProfile(
        domain_name=name,
        domain_id=_integer(entry, "domain_id", where, low=0),
        raw_action_dim=robot_width,
        action_space=action_space,
        default_horizon=_integer(entry, "default_horizon", where, low=1)
        if "default_horizon" in entry
        else DEFAULT_ACTION_HORIZON,
        fps=float(fps),
        resolution_tier=tier,
        view_point=view_point,
        view_description=_optional_text(entry, "view_description", where),
        prompt_format=prompt_format,
        num_steps=_integer(entry, "num_steps", where, low=1, high=MAX_STEPS)
        if entry.get("num_steps") is not None
        else None,
        guidance_scale=_number(entry, "guidance_scale", where, low=0.0, high=MAX_GUIDANCE_SCALE),
        shift=_number(entry, "shift", where, low=MIN_SHIFT, high=MAX_SHIFT),
        guidance_interval=_guidance_interval(entry.get("guidance_interval"), where, num_train_timesteps),
        gripper_flip_index=flip,
        normalization=stats,
        use_state=use_state,
        history_length=history,
        state_dim=state_dim,
        max_prefix=_integer(entry, "max_prefix", where, low=0) if entry.get("max_prefix") is not None else None,
    )


def _state_conditioning(entry: dict[str, Any], where: str, width: int) -> tuple[bool, int, int | None]:
    """``use_state``, ``history_length`` and ``state_dim``, checked against each other and the width."""
    use_state = entry.get("use_state", False)
    if not isinstance(use_state, bool):
        raise CheckpointError(f"{where}: use_state must be true or false, got {use_state!r}")
    history = (
        _integer(entry, "history_length", where, low=0, high=MAX_HISTORY_LENGTH)
        if "history_length" in entry
        else int(use_state)
    )
    if use_state and history < 1:
        raise CheckpointError(f"{where}: use_state needs history_length >= 1 (the state row is one of them)")
    if not history:
        if entry.get("state_dim") is not None:
            raise CheckpointError(
                f"{where}: state_dim is set but the domain takes no state (set use_state or history_length)"
            )
        return False, 0, None
    state_dim = _integer(entry, "state_dim", where, low=1) if entry.get("state_dim") is not None else width
    if state_dim != width:
        raise CheckpointError(
            f"{where}: state_dim {state_dim} differs from the width of the robot's rows, {width}; state rows "
            "are conditioned as action frames, so they have the action width (a midtrain pose's is 8)"
        )
    return use_state, history, state_dim


def _integer(entry: dict[str, Any], key: str, where: str, low: int, high: int | None = None) -> int:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise CheckpointError(f"{where}: {key} must be an integer {bound}, got {value!r}")
    return value


def _number(entry: dict[str, Any], key: str, where: str, low: float, high: float) -> float | None:
    """``entry[key]`` as a finite number in [low, high], or None where the entry leaves it out."""
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise CheckpointError(f"{where}: {key} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _optional_text(entry: dict[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise CheckpointError(f"{where}: {key} must be a non-empty string")
    return value.strip() if value is not None else None


def _guidance_interval(value: Any, where: str, num_train_timesteps: int) -> tuple[float, float] | None:
    """``[low, high]`` in sigmas, or in timesteps (values above 1, as cosmos-framework's servers take them).

    Timesteps are divided by ``num_train_timesteps``; ``[960, 1001]`` (NVIDIA's Edge DROID setting) becomes
    sigmas [0.96, 1.0]: no sigma exceeds 1.
    """
    if value is None:
        return None
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: guidance_interval must be two numbers [low, high]") from None
    if not (math.isfinite(low) and math.isfinite(high)) or not 0.0 <= low <= high:
        raise CheckpointError(f"{where}: guidance_interval must satisfy 0 <= low <= high, got {list(value)}")
    if high > 1.0:
        low, high = low / num_train_timesteps, high / num_train_timesteps
    return min(low, 1.0), min(high, 1.0)
