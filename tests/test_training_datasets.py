"""cosmos3-train on a dataset someone else made: every hostile dataset is one clear line and exit 2.

Each hostile case runs the real ``cosmos3-train`` in a subprocess (under a small wrapper that reports the
trainer's peak RSS), and checks: a non-zero exit, exactly one line on stderr naming the file and field, no
traceback, nothing written beside or into ``--out``, and a peak RSS under 2 GiB. The datasets are the
server's own recordings (the real recorder) and demonstration datasets (the writer of
``cosmos3-reach-demos``), each broken in one way. A recording trains with the default flags, and only on
the observations the server answered with a chunk; a dataset whose files are symlinks (the Hub cache's
layout) is read as the same dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from recording_fixtures import CONFIG, MODEL, REPO_ROOT, Traffic, chunk, record_traffic

from cosmos3_runtime.lerobot_dataset import DatasetError, fill_template, read_dataset
from cosmos3_runtime.lerobot_layout import ANSWERED_KIND, DATA_PATH, RESPONSE_KIND, RESPONSE_KINDS
from policy_server.recording import Recorder, RecorderSettings
from policy_server.recording.demonstrations import Demonstration, write_dataset
from policy_server.recording.lerobot_format import SCALAR_FEATURES

pytestmark = pytest.mark.timeout(300)

MAX_RSS_BYTES = 2 * 2**30
VIDEO = "videos/observation.images.front/chunk-000/file-000.mp4"
# Runs cosmos3-train as its only child and prints that child's peak RSS (KiB on Linux) on its last line.
WRAPPER = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(done.returncode)\n"
)


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    """One episode recorded by the real recorder: 20 frames, two cameras, chunks of 4 rows of 3, no state."""
    root = tmp_path_factory.mktemp("recordings")
    recorder = Recorder(RecorderSettings(root=root))
    recorder.start()
    session = recorder.session("train")
    session.start_episode(CONFIG, MODEL)
    record_traffic(session, 20, with_state=False, drop_every=0)
    assert recorder.close(timeout=60)
    (episode,) = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return episode


@pytest.fixture(scope="module")
def mixed_recording(tmp_path_factory) -> tuple[Path, Traffic]:
    """One recorded episode of 20 observations, 12 answered with a chunk: 5 dropped (every 4th), 2 errors,
    1 never answered. Returns the episode's folder and what the session told the recorder."""
    root = tmp_path_factory.mktemp("mixed")
    recorder = Recorder(RecorderSettings(root=root))
    recorder.start()
    session = recorder.session("mixed")
    session.start_episode(CONFIG, MODEL)
    traffic = record_traffic(session, 20, with_state=False, drop_every=4, error_at=(5, 9), unanswered=(13,))
    assert recorder.close(timeout=60)
    (episode,) = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return episode, traffic


@pytest.fixture(scope="module")
def demonstrations(tmp_path_factory) -> Path:
    """Two demonstration episodes of 6 frames (32x32 PNG in the data file, state and action of width 4)."""
    rng = np.random.default_rng(0)
    episodes = [
        Demonstration(
            images=rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8),
            state=rng.normal(size=(6, 4)).astype(np.float32),
            actions=rng.normal(size=(6, 4)).astype(np.float32),
            success=True,
        )
        for _ in range(2)
    ]
    out = tmp_path_factory.mktemp("demos") / "data"
    write_dataset(out, episodes, "reach the cube", 20, "arm")
    return out


def copy(dataset: Path, tmp_path: Path) -> Path:
    target = tmp_path / "dataset"
    shutil.copytree(dataset, target, symlinks=True)
    return target


def edit_info(dataset: Path, **changes: object) -> None:
    path = dataset / "meta/info.json"
    info = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            info.pop(key)
        else:
            info[key] = value
    path.write_text(json.dumps(info))


def run_train(dataset: Path, out: Path, *flags: str) -> tuple[int, list[str], int]:
    """``cosmos3-train dataset --out out`` with a tiny model and two steps: exit code, stderr lines but the
    progress bar's, and the trainer's peak RSS in bytes."""
    command = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "cosmos3_runtime.training", str(dataset)]
    command += ["--out", str(out), "--steps", "2", "--batch-size", "2", "--hidden-size", "32", "--layers", "1"]
    command += ["--save-every", "0", "--threads", "1", *flags]
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=out.parent, timeout=240)
    *lines, rss_kib = [line for line in done.stderr.splitlines() if line.strip()]
    return done.returncode, [line for line in lines if "step/s]" not in line], int(rss_kib) * 1024


def assert_refused(dataset: Path, tmp_path: Path, *expected: str, flags: tuple[str, ...] = ()) -> str:
    """cosmos3-train refuses ``dataset``: exit 2, one line containing each of ``expected``, nothing written
    in or beside ``--out``, peak RSS under 2 GiB. Returns the line."""
    runs = tmp_path / "runs"
    runs.mkdir()
    code, lines, rss = run_train(dataset, runs / "ckpt", *flags)
    assert code == 2, lines
    assert len(lines) == 1 and not any("Traceback" in line for line in lines), lines
    line = lines[0]
    assert line.startswith(f"cosmos3-train: dataset {dataset}: "), line
    for fragment in expected:
        assert fragment in line, line
    assert sorted(p.name for p in runs.iterdir()) == [], "cosmos3-train wrote beside or into --out"
    assert rss < MAX_RSS_BYTES, f"peak RSS {rss / 2**20:.0f} MiB"
    print(f"peak RSS {rss / 2**20:.0f} MiB: {line}")  # shown with pytest -s
    return line


# -- hostile path templates ------------------------------------------------------------------------


def test_an_absolute_video_path_is_refused_though_the_file_it_names_is_a_video(recording, tmp_path):
    dataset = copy(recording, tmp_path)
    outside = tmp_path / "outside"
    shutil.copytree(dataset / "videos", outside / "videos")
    edit_info(
        dataset, video_path=f"{outside}/videos/{{video_key}}/chunk-{{chunk_index:03d}}/file-{{file_index:03d}}.mp4"
    )
    assert_refused(dataset, tmp_path, "meta/info.json: video_path", "must be relative", "(field: video_path)")


def test_a_video_path_that_climbs_out_with_dotdot_is_refused(recording, tmp_path):
    dataset = copy(recording, tmp_path)
    shutil.copytree(dataset / "videos", tmp_path / "videos")  # what ../videos would reach
    edit_info(dataset, video_path="../videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    assert_refused(dataset, tmp_path, "meta/info.json: video_path", "'..'", "(field: video_path)")


def test_a_template_that_walks_attributes_is_refused_though_str_format_would_find_a_video(recording, tmp_path):
    dataset = copy(recording, tmp_path)
    # str.format fills {video_key.__class__.__name__} with "str": the video is there for it to find.
    shutil.copytree(dataset / "videos/observation.images.front", dataset / "videos/str")
    edit_info(
        dataset, video_path="videos/{video_key.__class__.__name__}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    assert_refused(dataset, tmp_path, "{video_key.__class__.__name__}", "(field: video_path)")


def test_a_data_folder_symlinked_outside_the_dataset_is_refused(demonstrations, tmp_path):
    dataset = copy(demonstrations, tmp_path)
    shutil.move(dataset / "data", tmp_path / "elsewhere")
    (dataset / "data").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(DatasetError, match="leads outside the dataset"):
        read_dataset(dataset)


def test_a_data_file_symlinked_to_a_file_outside_the_dataset_is_refused(demonstrations, tmp_path):
    """The data folder is inside; the parquet in it is a link to a copy outside, which would train."""
    dataset = copy(demonstrations, tmp_path)
    (data_file,) = sorted((dataset / "data").rglob("*.parquet"))
    outside = tmp_path / "outside.parquet"
    shutil.move(data_file, outside)
    data_file.symlink_to(outside)
    rel = data_file.relative_to(dataset)
    assert_refused(dataset, tmp_path, f"{rel}: the data file is a link that leads outside", "(field: data_path)")


def test_a_camera_video_symlinked_to_a_file_outside_the_dataset_is_refused(recording, tmp_path):
    dataset = copy(recording, tmp_path)
    outside = tmp_path / "outside.mp4"
    shutil.move(dataset / VIDEO, outside)
    (dataset / VIDEO).symlink_to(outside)
    assert_refused(dataset, tmp_path, f"{VIDEO}: the video is a link that leads outside", "(field: video_path)")


def test_a_file_symlinked_to_another_inside_the_dataset_reads(demonstrations, tmp_path):
    dataset = copy(demonstrations, tmp_path)
    (data_file,) = sorted((dataset / "data").rglob("*.parquet"))
    kept = dataset / "kept" / "data.parquet"
    kept.parent.mkdir()
    shutil.move(data_file, kept)
    data_file.symlink_to(os.path.relpath(kept, data_file.parent))
    assert read_dataset(dataset).frames == read_dataset(demonstrations).frames


def test_a_snapshot_outside_a_hub_cache_cannot_link_into_a_blobs_folder_of_another(recording, tmp_path):
    """Only a snapshot's own repository's blob store counts as inside: a folder merely beside `blobs` does not."""
    dataset = copy(recording, tmp_path)
    (tmp_path / "blobs").mkdir()
    shutil.move(dataset / VIDEO, tmp_path / "blobs" / "video")
    (dataset / VIDEO).symlink_to(tmp_path / "blobs" / "video")
    with pytest.raises(DatasetError, match="leads outside the dataset"):
        read_dataset(dataset)


@pytest.mark.parametrize(
    ("template", "refused"),
    [
        ("data/{0}/file.parquet", "{0}"),
        ("data/{chunk_index!r}/file.parquet", "{chunk_index!r}"),
        ("data/{chunk_index:{file_index}}/file.parquet", "formats {chunk_index}"),
        ("data/{chunk_index:>999999999}/f.parquet", "formats {chunk_index}"),
        ("data/{video_key}/f.parquet", "{video_key}"),
        ("data/chunk-{chunk_index:03d}/../../x.parquet", "'..'"),
        ("data/chunk-{chunk_index:03d}\\x.parquet", "must be relative"),
        (["data"], "not a path template"),
    ],
)
def test_a_path_template_names_only_lerobots_fields(template, refused):
    with pytest.raises(DatasetError, match="data_path") as caught:
        fill_template(template, "data_path", {"chunk_index": 1, "file_index": 2})
    assert refused in str(caught.value)


def test_lerobots_own_templates_fill_as_lerobot_fills_them():
    data = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    video = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert str(fill_template(data, "data_path", {"chunk_index": 1, "file_index": 12})) == data.format(
        chunk_index=1, file_index=12
    )
    values = {"video_key": "observation.images.front", "chunk_index": 0, "file_index": 3}
    assert str(fill_template(video, "video_path", values)) == video.format(**values)


def test_a_dataset_of_symlinks_into_a_blob_store_reads_as_the_same_dataset(recording, tmp_path):
    """The Hub cache's layout: snapshots/<revision>/... are symlinks to ../../blobs/<hash>."""
    snapshot = tmp_path / "hub/snapshots/abc123"
    blobs = tmp_path / "hub/blobs"
    blobs.mkdir(parents=True)
    for k, path in enumerate(sorted(p for p in recording.rglob("*") if p.is_file())):
        rel = path.relative_to(recording)
        shutil.copyfile(path, blobs / f"blob{k}")
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / rel).symlink_to(os.path.relpath(blobs / f"blob{k}", (snapshot / rel).parent))
    assert (snapshot / VIDEO).is_symlink()
    ours, theirs = read_dataset(snapshot), read_dataset(recording)
    assert ours.frames == theirs.frames == 20
    np.testing.assert_array_equal(ours.episodes[0].images, theirs.episodes[0].images)
    np.testing.assert_array_equal(ours.episodes[0].actions, theirs.episodes[0].actions)


# -- what a dataset declares, against the data -----------------------------------------------------


def test_an_episodes_index_of_a_million_rows_over_a_few_frames_is_refused_before_it_is_read(demonstrations, tmp_path):
    dataset = copy(demonstrations, tmp_path)
    rows = 1_000_000
    index = pa.table(
        {
            "episode_index": pa.array(np.arange(rows, dtype=np.int64)),
            "tasks": pa.array([["reach the cube"]] * rows, pa.list_(pa.string())),
            "length": pa.array(np.full(rows, 6, np.int64)),
            "data/chunk_index": pa.array(np.zeros(rows, np.int64)),
            "data/file_index": pa.array(np.zeros(rows, np.int64)),
            "dataset_from_index": pa.array(np.arange(rows, dtype=np.int64) * 6),
            "dataset_to_index": pa.array(np.arange(1, rows + 1, dtype=np.int64) * 6),
        }
    )
    pq.write_table(index, dataset / "meta/episodes/chunk-000/file-000.parquet")
    edit_info(dataset, total_episodes=rows, total_frames=6 * rows)
    assert (dataset / "meta/episodes/chunk-000/file-000.parquet").stat().st_size < 20 * 2**20
    assert_refused(dataset, tmp_path, "meta/episodes: 1,000,000 episodes, more than the data's 12 frames")


def test_a_tiny_mp4_of_300_frames_at_2048_square_is_refused_from_its_header(recording, tmp_path):
    import imageio_ffmpeg

    dataset = copy(recording, tmp_path)
    video = dataset / VIDEO
    video.unlink()
    # One colour, no noise: 300 frames of 2048x2048 in a few tens of kB (7.2 GiB decoded as RGB).
    subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "color=c=gray:s=2048x2048:r=10"]
        + ["-frames:v", "300", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", str(video)],
        check=True,
        timeout=120,
    )
    assert video.stat().st_size < 200_000
    assert_refused(
        dataset, tmp_path, VIDEO, "frames of 2048x2048", "--max-image-side", "(field: observation.images.front)"
    )
    # Declared as what it is and allowed its sides, the frames read together are still bounded.
    features = json.loads((dataset / "meta/info.json").read_text())["features"]
    features["observation.images.front"]["shape"] = [2048, 2048, 3]
    edit_info(dataset, features=features)
    shutil.rmtree(tmp_path / "runs")
    flags = ("--max-image-side", "4096", "--max-frames-mib", "200")
    assert_refused(dataset, tmp_path, "20 frames of 2048x2048", "over 200 MiB", flags=flags)


def write_task_bomb(path: Path, chars: int) -> None:
    """LeRobot's task list holding one task of ``chars`` characters, dictionary-encoded and zstd-compressed:
    the string is built from one buffer, without a Python copy."""
    data = pa.py_buffer(b"a" * chars)
    offsets = pa.py_buffer(np.array([0, chars], np.int32).tobytes())
    task = pa.StringArray.from_buffers(1, offsets, data)
    table = pa.table({"task_index": pa.array([0], pa.int64()), "__index_level_0__": task})
    pq.write_table(table, path, compression="zstd", use_dictionary=True)


def test_a_task_string_bomb_is_refused_from_its_page_header_before_it_is_decompressed(recording, tmp_path):
    """Issue 45's 33 kB task list with a 1 GiB task took 6.6 GiB; a 256 MiB one shows the same here, and the
    full one is benchmarks/attack_dataset_tasks.py. Refused from the dictionary page's header: no value of it
    is decompressed, and the trainer peaks where importing torch leaves it."""
    dataset = copy(recording, tmp_path)
    write_task_bomb(dataset / "meta/tasks.parquet", 256 * 2**20)
    assert (dataset / "meta/tasks.parquet").stat().st_size < 100_000
    line = assert_refused(
        dataset, tmp_path, "meta/tasks.parquet: a dictionary page of column '__index_level_0__'", "decompresses to"
    )
    assert "decompresses to 268,435,4" in line, line


def test_a_task_longer_than_the_prompt_bound_is_refused(recording, tmp_path):
    dataset = copy(recording, tmp_path)
    write_task_bomb(dataset / "meta/tasks.parquet", 2001)
    assert_refused(dataset, tmp_path, "meta/tasks.parquet: task 0 has 2,001 characters, over the prompt bound 2,000")


def test_an_action_list_column_holding_more_values_than_its_shape_is_refused_before_it_is_decoded(
    demonstrations, tmp_path
):
    """Each row's action holds 2**20 zeros where the feature says 4: a few kB compressed, 48 MiB decoded.
    The page header says so before pyarrow decompresses it."""
    dataset = copy(demonstrations, tmp_path)
    (data_file,) = sorted((dataset / "data").rglob("*.parquet"))
    table = pq.read_table(data_file)
    column = table.schema.get_field_index("action")
    values = pa.array(np.zeros(table.num_rows * 2**20, np.float32))
    offsets = pa.array(np.arange(table.num_rows + 1, dtype=np.int32) * 2**20)
    bomb = table.set_column(column, "action", pa.ListArray.from_arrays(offsets, values))
    pq.write_table(bomb, data_file, compression="zstd")
    assert data_file.stat().st_size < 2**20
    assert_refused(dataset, tmp_path, "page of column 'action' decompresses to", "(field: action)")


def test_a_dataset_without_features_is_refused(recording, tmp_path):
    dataset = copy(recording, tmp_path)
    edit_info(dataset, features=None)
    assert_refused(dataset, tmp_path, "meta/info.json: no 'features'", "(field: features)")


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_corrupt_data_file_is_refused(demonstrations, tmp_path, damage):
    dataset = copy(demonstrations, tmp_path)
    path = dataset / "data/chunk-000/file-000.parquet"
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:  # the pages, not the footer: the file opens and its rows do not decode
        data[8 : len(data) // 2] = bytes(len(data) // 2 - 8)
    path.write_bytes(bytes(data))
    assert_refused(dataset, tmp_path, "data/chunk-000/file-000.parquet", "(field: data_path)")


def test_a_horizon_longer_than_the_recordings_chunk_is_refused(recording, tmp_path):
    assert_refused(
        recording, tmp_path, "--horizon 16", "chunks of 4 rows", "(field: horizon)", flags=("--horizon", "16")
    )


def test_a_server_recording_trains_with_the_default_flags(recording, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    code, lines, rss = run_train(recording, runs / "ckpt")
    assert code == 0, lines
    assert sorted(p.name for p in runs.iterdir()) == ["ckpt"]  # the work folder was renamed into --out
    profile = json.loads((runs / "ckpt/policy_profiles.json").read_text())
    (entry,) = profile["domains"].values()
    assert entry["default_horizon"] == 4 and entry["raw_action_dim"] == 3
    summary = json.loads((runs / "ckpt/training_summary.json").read_text())
    assert summary["steps"] == 2 and summary["frames"] == 20 and summary["samples"] == 20
    assert rss < MAX_RSS_BYTES


# -- a recording's unanswered observations -------------------------------------------------------


def test_the_runtime_reads_the_kind_column_and_values_the_recorder_writes(mixed_recording):
    episode, traffic = mixed_recording
    assert RESPONSE_KIND in SCALAR_FEATURES and SCALAR_FEATURES[RESPONSE_KIND]["dtype"] == "string"
    written = pq.read_table(episode / DATA_PATH, columns=[RESPONSE_KIND]).column(RESPONSE_KIND).to_pylist()
    assert written == [s.kind for s in traffic.sent]
    assert set(written) == set(RESPONSE_KINDS)  # the fixture plays every outcome; the runtime knows each one
    # The rows of the answered kind are exactly those the session handed a chunk, and hold it.
    assert [kind == ANSWERED_KIND for kind in written] == [s.actions is not None for s in traffic.sent]
    (read,) = read_dataset(episode).episodes
    assert read.answered is not None and read.answered.tolist() == [s.kind == "chunk" for s in traffic.sent]
    for s in traffic.sent:
        expected = s.actions if s.actions is not None else np.zeros_like(chunk(0))
        np.testing.assert_array_equal(read.actions[s.seq], expected)


def test_a_demonstration_dataset_has_every_row_as_a_target(demonstrations):
    for episode in read_dataset(demonstrations).episodes:
        assert episode.answered is None and episode.target_frames.tolist() == list(range(6))


def test_a_recording_trains_only_on_its_answered_observations(mixed_recording, tmp_path):
    from cosmos3_runtime.training import STD_FLOOR, TrainConfig, prepare_training

    episode, traffic = mixed_recording
    answered = [s for s in traffic.sent if s.kind == "chunk"]
    assert len(answered) == 12
    cfg = TrainConfig(dataset=episode, out=tmp_path / "ckpt", steps=1, batch_size=2, hidden_size=32, layers=1)
    samples = prepare_training(cfg).trainer.samples
    assert len(samples.latents) == 20  # every frame is encoded: unanswered ones still show the camera
    assert len(samples.chunks) == len(answered)
    np.testing.assert_array_equal(samples.chunks, np.stack([s.actions for s in answered]))
    conditioning = samples.frame_of[:, 0].tolist()
    assert conditioning == [s.seq for s in answered]
    assert {5, 9} & set(samples.frame_of[:, 1:].ravel().tolist())  # an error frame is another sample's future
    profile = json.loads((tmp_path / ".ckpt.training/policy_profiles.json").read_text())
    (entry,) = profile["domains"].values()
    rows = np.concatenate([s.actions for s in answered]).astype(np.float64)
    np.testing.assert_allclose(entry["normalization"]["mean"], rows.mean(0), rtol=1e-6)
    np.testing.assert_allclose(entry["normalization"]["std"], np.maximum(rows.std(0), STD_FLOOR), rtol=1e-6)


def rewrite_kinds(dataset: Path, kinds: pa.Array) -> None:
    path = dataset / DATA_PATH
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index(RESPONSE_KIND), RESPONSE_KIND, kinds)
    pq.write_table(table, path)


def test_a_recording_the_server_never_answered_is_refused(mixed_recording, tmp_path):
    dataset = copy(mixed_recording[0], tmp_path)
    rewrite_kinds(dataset, pa.array(["dropped"] * 10 + ["error"] * 10, pa.string()))
    assert_refused(
        dataset, tmp_path, "answered none of its 20 observations", "nothing to train on", "(field: response.kind)"
    )


@pytest.mark.parametrize(
    ("kinds", "refused"),
    [
        (pa.array(["chunk"] * 19 + ["answered"], pa.string()), "holds 'answered', not one of chunk, dropped"),
        (pa.array(["chunk"] * 19 + [None], pa.string()), "not strings without gaps"),
        (pa.array(range(20), pa.int64()), "is int64, not strings"),
    ],
)
def test_a_kind_the_recorder_never_writes_is_refused(mixed_recording, tmp_path, kinds, refused):
    dataset = copy(mixed_recording[0], tmp_path)
    rewrite_kinds(dataset, kinds)
    with pytest.raises(DatasetError) as caught:
        read_dataset(dataset)
    assert caught.value.field == RESPONSE_KIND and refused in str(caught.value), str(caught.value)
    assert str(caught.value).startswith(f"{DATA_PATH}: column 'response.kind'")


def test_the_checkpoint_is_built_beside_out_and_renamed_into_it_when_whole(recording, tmp_path):
    from cosmos3_runtime.training import TrainConfig, prepare_training, train

    out = tmp_path / "runs" / "ckpt"
    out.mkdir(parents=True)
    (out / "previous.txt").write_text("the checkpoint an earlier run left")
    cfg = TrainConfig(dataset=recording, out=out, steps=2, batch_size=2, hidden_size=32, layers=1, save_every=0)
    prep = prepare_training(cfg)
    assert prep.ckpt == tmp_path / "runs" / ".ckpt.training" and (prep.ckpt / "policy_profiles.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["previous.txt"]  # --out untouched while a run builds
    summary = train(cfg)
    assert summary["checkpoint"] == str(out) and summary["steps"] == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["ckpt"]
    assert (out / "training_summary.json").is_file() and not (out / "previous.txt").exists()
