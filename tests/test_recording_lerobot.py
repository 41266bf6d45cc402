"""Recordings are readable by LeRobot itself: the real ``LeRobotDataset`` from PyPI (``lerobot-dataset``,
in its own virtualenv as openpi-client is) loads them, and the frames, actions and timestamps it returns
are what the session sent and answered.

Two recordings are read: one recorded to its end (two cameras, a state, chunks, drops, an error, two
tasks, a last segment padded past the episode's end) and one cut short by SIGKILL and recovered at the
next start; then both merged into one dataset by LeRobot's ``aggregate_datasets``. ``make test`` builds
``.venv-lerobot``; tests/lerobot_dataset_script.py runs inside it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from recording_fixtures import (
    CONFIG,
    MODEL,
    REPO_ROOT,
    assert_frames_match,
    frame,
    only_recording,
    record_traffic,
    recorders,  # noqa: F401 - fixture
)
from test_recording_crash import kill_and_damage_a_segment, record_then_kill

from policy_server.recording.assembly import QUARANTINE_DIR

LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_PYTHON", REPO_ROOT / ".venv-lerobot" / "bin" / "python"))
SCRIPT = Path(__file__).with_name("lerobot_dataset_script.py")
pytestmark = pytest.mark.timeout(300)

if not LEROBOT_PYTHON.exists():
    # `make test` builds it; in CI a missing one is a broken set-up, not a reason to skip.
    if os.environ.get("CI"):
        raise RuntimeError(f"{LEROBOT_PYTHON} is missing: `make test` should have built LeRobot's virtualenv")
    pytest.skip(f"LeRobot's virtualenv is missing ({LEROBOT_PYTHON}); `make test` builds it", allow_module_level=True)


def read_with_lerobot(tmp_path: Path, roots: list[Path]) -> tuple[dict, dict[str, np.ndarray]]:
    out = tmp_path / "read.npz"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "*"}
    result = subprocess.run(
        [
            str(LEROBOT_PYTHON),
            str(SCRIPT),
            "--out",
            str(out),
            "--aggregate",
            str(tmp_path / "merged"),
            *map(str, roots),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with np.load(out) as arrays:
        return json.loads(result.stdout.strip().splitlines()[-1]), dict(arrays)


def test_lerobot_loads_a_recording_and_a_recovered_one_with_what_was_sent_and_answered(tmp_path, recorders):
    finished_root, killed_root = tmp_path / "finished", tmp_path / "killed"
    recorder = recorders(finished_root, segment_frames=8)
    recording = recorder.session("lerobot")
    recording.start_episode(CONFIG, MODEL)
    traffic = record_traffic(
        recording, 18, error_at=(9,), prompts=("pick", "place"), cameras={"front": (48, 64), "wrist": (32, 40)}
    )  # segments of 8, 8, then 2 (padded)
    recording.end_episode("closed")
    assert recorder.sync()
    record_then_kill(killed_root, until_committed=6)
    assert recorders(killed_root).sync()  # recovers it
    finished, recovered = only_recording(finished_root), only_recording(killed_root)

    summary, arrays = read_with_lerobot(tmp_path, [finished, recovered])
    assert summary["codebase_version"] == "v3.0" and summary["decoder"] == "torchcodec"
    assert summary["torch"].startswith("2.13.0")

    first = summary["datasets"][0]
    sent = traffic.sent
    assert (first["frames"], first["episodes"], first["fps"]) == (18, 1, 10)
    assert first["video_keys"] == ["observation.images.front", "observation.images.wrist"]
    assert first["tasks"] == [s.prompt for s in sent] and first["kinds"] == [s.kind for s in sent]
    assert first["video_spans"]["observation.images.front"] == pytest.approx([0.0, 1.8])
    np.testing.assert_allclose(arrays["0/timestamp"], np.arange(18) / 10, atol=1e-6)
    np.testing.assert_array_equal(arrays["0/frame_index"], np.arange(18))
    np.testing.assert_array_equal(arrays["0/observation.seq"], [s.seq for s in sent])
    np.testing.assert_array_equal(arrays["0/observation.state"], np.stack([s.state for s in sent]))
    for i, s in enumerate(sent):
        if s.kind == "chunk":
            np.testing.assert_array_equal(arrays["0/action"][i], s.actions)
        else:
            assert not arrays["0/action"][i].any()  # zeros: no chunk (response.kind says so)
        for name in ("front", "wrist"):
            assert_frames_match(arrays[f"0/observation.images.{name}"][i], [t.cameras[name] for t in sent], i)

    second = summary["datasets"][1]
    frames = second["frames"]
    assert frames >= 6 and second["kinds"] == ["chunk"] * frames
    np.testing.assert_allclose(arrays["1/timestamp"], np.arange(frames) / 10, atol=1e-6)
    np.testing.assert_array_equal(arrays["1/observation.seq"], np.arange(frames))
    originals = [frame(i, 48, 64) for i in range(frames)]
    for i in range(frames):
        assert_frames_match(arrays["1/observation.images.front"][i], originals, i)

    # LeRobot merges the two into one dataset (the first one's video carries padding past its end).
    merged = summary["datasets"][2]
    assert summary["merged_episodes"] == 2 and merged["frames"] == 18 + frames
    np.testing.assert_array_equal(arrays["merged/episode_index"], [0] * 18 + [1] * frames)
    np.testing.assert_array_equal(arrays["merged/observation.seq"], [s.seq for s in sent] + list(range(frames)))
    for i in range(18 + frames):
        own = [t.cameras["front"] for t in sent] if i < 18 else originals
        assert_frames_match(arrays["merged/observation.images.front"][i], own, i if i < 18 else i - 18)


def test_lerobot_loads_a_recovered_episode_whose_corrupt_segment_was_quarantined(tmp_path, recorders):
    root = tmp_path / "killed"
    bad, kept = kill_and_damage_a_segment(root, "rows")
    assert recorders(root).sync()  # recovers it, the damaged segment set aside
    path = only_recording(root)
    assert (path / QUARANTINE_DIR / bad.name).is_dir()
    summary, arrays = read_with_lerobot(tmp_path, [path])
    read = summary["datasets"][0]
    assert read["frames"] == len(kept) and read["kinds"] == ["chunk"] * len(kept)
    np.testing.assert_array_equal(arrays["0/observation.seq"], kept)
    np.testing.assert_allclose(arrays["0/timestamp"], np.arange(len(kept)) / 10, atol=1e-6)
    originals = [frame(seq, 48, 64) for seq in range(max(kept) + 1)]
    for i, seq in enumerate(kept):
        assert_frames_match(arrays["0/observation.images.front"][i], originals, seq)
