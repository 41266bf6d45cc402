"""Reading a published recording back, and ``cosmos3-replay``: its observations through another checkpoint.

:class:`RecordedEpisode` reads the recorder's own files (the LeRobot layout plus ``meta/cosmos3/``) with
pyarrow and ffmpeg, LeRobot itself not needed; camera frames are streamed one row at a time from every
camera's MP4 in step, so a long episode does not have to fit in memory.

``cosmos3-replay`` is a regression check before a model or a setting goes to the robot. Offline: no
server, the engine is loaded here (``cosmos3_runtime``), and every recorded observation that got a chunk
is sent again as the same engine request (same camera frame, prompt, settings, prefix actions and seed),
with the changes given on the command line. The report compares each new chunk with the recorded one
(largest and mean absolute difference; over the common steps when the horizons differ), sets the engine
time beside the recorded one, and lists every error; as a table, and as JSON with ``--json``::

    cosmos3-replay recordings/20260101T120000Z_0a1b2c3d4e5f_000 --model ./other-checkpoint
    cosmos3-replay RECORDING --model ./same-checkpoint --num-steps 2 --json report.json --fail-above 0.05

The recorded seed is reused, so replaying against the recording's own model and settings gives the same
chunks back (a difference of 0 up to the engine's determinism on that device).

Exit status: 0; 1 with ``--fail-above`` when a chunk differs by more than the bound or a request fails;
2 when the recording cannot be read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from cosmos3_runtime.lerobot_layout import (
    ANSWERED_KIND,
    CODEBASE_VERSION,
    DATA_PATH,
    INFO_PATH,
    RESPONSE_KIND,
    TASKS_PATH,
)
from cosmos3_runtime.requests import ActionRequest
from robot_clients.client_frames import ACTION_MODE, FPS, REQUEST_SETTINGS

from ..foundation.camera_intake import side_by_side
from ..foundation.durable_files import read_lines
from .assembly import column_values
from .episode_writer import REQUEST_FIELDS
from .lerobot_format import (
    EVENTS_JSONL,
    FORMAT_NAME,
    NO_VALUE,
    SESSION_JSON,
    TIMING_NAMES,
    EpisodeLayout,
    video_path,
)


class RecordingFormatError(ValueError):
    """The folder is not a recording this server wrote (or not a whole one)."""


@dataclass(frozen=True)
class RecordedRow:
    """One observation of a recording and how it was answered."""

    frame_index: int
    seq: int
    received_at: float  # seconds since the episode started
    request: dict[str, Any] | None  # the engine request's settings (see episode_writer.request_json)
    kind: str  # one of RESPONSE_KINDS
    reason: str
    message: str
    actions: np.ndarray | None  # (horizon, action_dim) float32 when kind is ANSWERED_KIND
    seed: int | None
    timing_ms: dict[str, float | None]
    task: str


class RecordedEpisode:
    """A published recording folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.info = json.loads((self.path / INFO_PATH).read_text())
            self.session = json.loads((self.path / SESSION_JSON).read_text())
        except (OSError, ValueError) as exc:
            raise RecordingFormatError(f"{self.path} is not a recording: {exc}") from None
        if self.info.get("codebase_version") != CODEBASE_VERSION or self.session.get("format") != FORMAT_NAME:
            raise RecordingFormatError(f"{self.path} is not a {FORMAT_NAME} in LeRobot's {CODEBASE_VERSION} layout")
        self.layout = EpisodeLayout.from_json(self.session["layout"])
        self.fps = int(self.info["fps"])
        self._data = pq.read_table(self.path / DATA_PATH)

    @property
    def name(self) -> str:
        return str(self.session.get("name", self.path.name))

    @property
    def num_frames(self) -> int:
        return int(self._data.num_rows)

    def rows(self) -> list[RecordedRow]:
        data = self._data
        features = self.info["features"]
        actions = column_values(data.column("action"), tuple(features["action"]["shape"]))
        timing = column_values(data.column("response.timing_ms"), (len(TIMING_NAMES),))
        tasks_by_index = self._tasks()
        columns = {
            name: data.column(name).to_pylist()
            for name in (
                "frame_index",
                "observation.seq",
                "observation.received_at",
                "observation.request",
                RESPONSE_KIND,
                "response.reason",
                "response.message",
                "response.seed",
                "task_index",
            )
        }
        rows = []
        for i in range(data.num_rows):
            kind = columns[RESPONSE_KIND][i]
            seed = columns["response.seed"][i]
            rows.append(
                RecordedRow(
                    frame_index=columns["frame_index"][i],
                    seq=columns["observation.seq"][i],
                    received_at=columns["observation.received_at"][i],
                    request=json.loads(columns["observation.request"][i]),
                    kind=kind,
                    reason=columns["response.reason"][i],
                    message=columns["response.message"][i],
                    actions=actions[i] if kind == ANSWERED_KIND else None,
                    seed=None if seed < 0 else seed,
                    timing_ms={
                        name: None if value == NO_VALUE else float(value)
                        for name, value in zip(TIMING_NAMES, timing[i])
                    },
                    task=tasks_by_index.get(columns["task_index"][i], ""),
                )
            )
        return rows

    def _tasks(self) -> dict[int, str]:
        table = pq.read_table(self.path / TASKS_PATH)
        return dict(zip(table.column("task_index").to_pylist(), table.column("__index_level_0__").to_pylist()))

    def frames(self) -> Iterator[dict[str, np.ndarray]]:
        """Each row's camera frames (the robot's camera name -> H×W×3 uint8, as sent), in row order."""
        import imageio_ffmpeg

        readers, sizes = {}, {}
        try:
            for key, name in self.layout.camera_names.items():
                reader = imageio_ffmpeg.read_frames(str(self.path / video_path(key)), pix_fmt="rgb24")
                width, height = reader.__next__()["size"]
                readers[name], sizes[name] = reader, (height, width, self.layout.frame_sizes[key])
            for _ in range(self.num_frames):
                frames = {}
                for name, reader in readers.items():
                    height, width, (rows, cols) = sizes[name]
                    try:
                        chunk = next(reader)
                    except StopIteration:
                        raise RecordingFormatError(f"{self.path}: camera {name!r} has fewer frames than rows") from None
                    frames[name] = np.frombuffer(chunk, dtype=np.uint8).reshape(height, width, 3)[:rows, :cols]
                yield frames
        except (OSError, RuntimeError) as exc:  # imageio-ffmpeg reports an undecodable file either way
            raise RecordingFormatError(f"{self.path}: a camera's video cannot be decoded: {exc}") from None
        finally:
            for reader in readers.values():
                reader.close()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in read_lines(self.path / EVENTS_JSONL)]


# Settings the command line may change, as ActionRequest field -> type: the recorded ones, but the mode and
# the rate (what the recorded media and chunk were made for).
OVERRIDABLE: dict[str, type] = {
    setting.name: setting.types[0]
    for setting in REQUEST_SETTINGS
    if setting.recorded and setting not in (ACTION_MODE, FPS)
}


class NotReplayable(ValueError):
    """The recording does not hold what it takes to send this observation again."""


@dataclass
class ChunkComparison:
    """One recorded observation sent again."""

    seq: int
    frame_index: int
    recorded: str  # the recorded outcome, one of RESPONSE_KINDS
    status: str  # compared | replayed | error | skipped
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    recorded_shape: list[int] | None = None
    replayed_shape: list[int] | None = None
    recorded_engine_ms: float | None = None
    replay_engine_ms: float | None = None
    note: str = ""


@dataclass
class ReplayReport:
    recording: str
    recorded_model: dict[str, Any]
    model: dict[str, Any]
    overrides: dict[str, Any]
    chunks: list[ChunkComparison] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        compared = [c for c in self.chunks if c.status == "compared"]

        def median(values: list[float | None]) -> float | None:
            present = [v for v in values if v is not None]
            return statistics.median(present) if present else None

        return {
            "observations": len(self.chunks),
            "compared": len(compared),
            "errors": sum(c.status == "error" for c in self.chunks),
            "skipped": sum(c.status == "skipped" for c in self.chunks),
            "max_abs_diff": max((c.max_abs_diff for c in compared if c.max_abs_diff is not None), default=None),
            "mean_abs_diff": statistics.fmean([c.mean_abs_diff for c in compared if c.mean_abs_diff is not None])
            if compared
            else None,
            "recorded_engine_ms_p50": median([c.recorded_engine_ms for c in self.chunks]),
            "replay_engine_ms_p50": median([c.replay_engine_ms for c in self.chunks]),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "recording": self.recording,
            "recorded_model": self.recorded_model,
            "model": self.model,
            "overrides": self.overrides,
            "summary": self.summary(),
            "chunks": [asdict(c) for c in self.chunks],
        }


def rebuild_request(row: RecordedRow, frames: dict[str, np.ndarray], overrides: dict[str, Any]) -> ActionRequest:
    """The engine request ``row`` was answered with, from its recorded settings and camera frames."""
    spec = row.request
    if spec is None:
        raise NotReplayable("the observation never became an engine request")
    source = spec.get("image_source")
    if source is None:
        raise NotReplayable("the model's image was not one of the recorded cameras")
    if "clip" in source:
        raise NotReplayable("the observation was a video clip; a recording keeps one frame per observation")
    try:
        if "camera" in source:
            image = frames[source["camera"]]
        else:
            image = side_by_side([frames[name] for name in source["side_by_side"]])
    except KeyError as exc:
        raise NotReplayable(f"camera {exc} is not in the recording") from None
    values: dict[str, Any] = {name: spec.get(name) for name in REQUEST_FIELDS}
    if values["guidance_interval"] is not None:
        values["guidance_interval"] = tuple(values["guidance_interval"])
    if values["seed"] is None:
        values["seed"] = row.seed  # the seed the engine drew for the recorded chunk
    values.update(overrides)
    prefix = spec.get("prefix_actions")
    return ActionRequest(
        image=image, prefix_actions=None if prefix is None else np.asarray(prefix, np.float32), **values
    )


def compare(recorded: np.ndarray, replayed: np.ndarray) -> tuple[float, float, str]:
    """Largest and mean absolute difference over the steps and dimensions both chunks have."""
    steps, dims = min(recorded.shape[0], replayed.shape[0]), min(recorded.shape[1], replayed.shape[1])
    note = "" if recorded.shape == replayed.shape else f"compared the first {steps}×{dims}"
    diff = np.abs(recorded[:steps, :dims].astype(np.float64) - replayed[:steps, :dims].astype(np.float64))
    return float(diff.max()), float(diff.mean()), note


def replay(
    episode: RecordedEpisode,
    engine: Any,
    overrides: dict[str, Any],
    *,
    all_observations: bool = False,
    limit: int | None = None,
) -> ReplayReport:
    """Send ``episode``'s observations through ``engine`` (a Cosmos3Engine) and compare the chunks."""
    report = ReplayReport(
        episode.name, dict(episode.session.get("model", {})), engine.describe().identity(), dict(overrides)
    )
    for row, frames in zip(episode.rows(), episode.frames()):
        if limit is not None and len(report.chunks) >= limit:
            break
        if row.kind != ANSWERED_KIND and not all_observations:
            continue
        entry = ChunkComparison(
            row.seq,
            row.frame_index,
            row.kind,
            "skipped",
            recorded_shape=None if row.actions is None else list(row.actions.shape),
            recorded_engine_ms=row.timing_ms.get("engine_ms"),
        )
        report.chunks.append(entry)
        try:
            request = rebuild_request(row, frames, overrides)
        except NotReplayable as exc:
            entry.note = str(exc)
            continue
        started = time.perf_counter()
        try:
            chunk = engine.predict_actions(request)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, and the replay goes on
            entry.status, entry.note = "error", f"{getattr(exc, 'code', type(exc).__name__)}: {exc}"
            entry.replay_engine_ms = (time.perf_counter() - started) * 1e3
            continue
        entry.replay_engine_ms = (time.perf_counter() - started) * 1e3
        entry.replayed_shape = list(chunk.actions.shape)
        if row.actions is None:
            entry.status = "replayed"
            continue
        entry.status = "compared"
        entry.max_abs_diff, entry.mean_abs_diff, entry.note = compare(row.actions, chunk.actions)
    return report


def format_table(report: ReplayReport) -> str:
    def number(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    header = ("seq", "recorded", "replay", "max|Δ|", "mean|Δ|", "rec engine ms", "replay ms", "note")
    lines = [header]
    for c in report.chunks:
        lines.append(
            (
                str(c.seq),
                c.recorded,
                c.status,
                number(c.max_abs_diff, 5),
                number(c.mean_abs_diff, 5),
                number(c.recorded_engine_ms, 1),
                number(c.replay_engine_ms, 1),
                c.note,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    text = [
        "  ".join(cell.rjust(widths[i]) if i < len(widths) else cell for i, cell in enumerate(line)).rstrip()
        for line in lines
    ]
    s = report.summary()
    text.append("")
    text.append(
        f"{report.recording}: {s['compared']} of {s['observations']} chunks compared, {s['errors']} errors, "
        f"{s['skipped']} skipped; max |Δ| {number(s['max_abs_diff'], 5)}, mean |Δ| "
        f"{number(s['mean_abs_diff'], 5)}; engine ms p50 recorded {number(s['recorded_engine_ms_p50'], 1)}, "
        f"replay {number(s['replay_engine_ms_p50'], 1)}"
    )
    return "\n".join(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cosmos3-replay",
        description="Send a recorded session's observations through a checkpoint (offline) and compare the chunks.",
    )
    parser.add_argument("recording", help="a recording folder (one episode, as the server published it)")
    parser.add_argument("--model", required=True, help="checkpoint folder or Hub id to replay against")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16... (default: the engine's choice)")
    for name, kind in OVERRIDABLE.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=None,
            help=f"replay with this {name} instead of the recorded one",
        )
    parser.add_argument(
        "--all",
        action="store_true",
        dest="all_observations",
        help="also send observations that were dropped or failed (nothing to compare them with)",
    )
    parser.add_argument("--limit", type=int, default=None, help="at most this many observations")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON ('-': stdout)")
    parser.add_argument(
        "--fail-above",
        type=float,
        default=None,
        metavar="DIFF",
        help="exit 1 if a chunk differs by more than DIFF (max abs) or a request fails",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        episode = RecordedEpisode(args.recording)
    except RecordingFormatError as exc:
        print(f"cosmos3-replay: {exc}", file=sys.stderr)
        return 2
    from cosmos3_runtime.engine import Cosmos3Engine

    engine = Cosmos3Engine.load(args.model, device=args.device, dtype=args.dtype)
    overrides = {name: value for name, value in vars(args).items() if name in OVERRIDABLE and value is not None}
    try:
        report = replay(episode, engine, overrides, all_observations=args.all_observations, limit=args.limit)
    except RecordingFormatError as exc:
        print(f"cosmos3-replay: {exc}", file=sys.stderr)
        return 2
    table_out = sys.stderr if args.json == "-" else sys.stdout
    print(format_table(report), file=table_out)
    if args.json is not None:
        text = json.dumps(report.to_json(), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as handle:
                handle.write(text + "\n")
    summary = report.summary()
    if args.fail_above is not None and (summary["errors"] or (summary["max_abs_diff"] or 0.0) > args.fail_above):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
