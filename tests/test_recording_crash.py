"""An episode interrupted by SIGKILL: the next start publishes it up to its last committed segment, or
removes it. Nothing it leaves breaks a reader.

A real subprocess (tests/recording_crash_script.py) records until it is killed with SIGKILL; a new
recorder then starts on the same folder. tests/test_recording_lerobot.py loads such a recovered episode
with LeRobot itself.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from recording_fixtures import REPO_ROOT, assert_frames_match, frame, leftovers, only_recording, recorders  # noqa: F401

from cosmos3_runtime.lerobot_dataset import read_dataset
from policy_server.recording.assembly import QUARANTINE_DIR, assemble, committed_segments
from policy_server.recording.replay import RecordedEpisode

SCRIPT = Path(__file__).with_name("recording_crash_script.py")
pytestmark = pytest.mark.timeout(180)


def record_then_kill(root: Path, *, until_committed: int, segment_frames: int = 4, flush_interval: float = 1.0) -> dict:
    """Run the script until its segments hold ``until_committed`` frames (0: until it sent 5), SIGKILL it
    and return its last progress line."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            str(root),
            "--segment-frames",
            str(segment_frames),
            "--flush-interval",
            str(flush_interval),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    last = None
    try:
        for line in proc.stdout:
            last = json.loads(line)
            if (until_committed and last["committed"] >= until_committed and last["sent"] > last["committed"]) or (
                not until_committed and last["sent"] >= 5
            ):
                break
        assert last is not None, proc.stderr.read()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return last


def check_readable(path: Path, frames: int) -> None:
    data = pq.read_table(path / "data/chunk-000/file-000.parquet").to_pydict()
    assert data["observation.seq"] == list(range(frames)) and data["frame_index"] == list(range(frames))
    info = json.loads((path / "meta/info.json").read_text())
    assert info["total_frames"] == frames
    decoded = list(RecordedEpisode(path).frames())
    assert len(decoded) == frames
    originals = [frame(i, 48, 64) for i in range(frames)]
    for i, cameras in enumerate(decoded):
        assert_frames_match(cameras["front"], originals, i)


def test_an_episode_killed_mid_recording_is_published_up_to_its_last_committed_segment(tmp_path, recorders):
    root = tmp_path / "rec"
    last = record_then_kill(root, until_committed=8)
    assert list((root / ".partial").iterdir())  # the killed episode is still in its partial folder
    recorder = recorders(root)
    assert recorder.sync()
    path = only_recording(root)
    session = json.loads((path / "meta/cosmos3/session.json").read_text())
    assert session["end_reason"] == "interrupted"
    frames = session["frames"]
    # Everything committed before the kill is there; nothing that was not sent.
    assert last["committed"] <= frames <= last["sent"]
    check_readable(path, frames)
    assert leftovers(root) == []
    assert recorder.stats()["episodes_recovered"] == 1


def test_an_episode_killed_before_anything_reached_the_disk_is_removed(tmp_path, recorders):
    root = tmp_path / "rec"
    record_then_kill(root, until_committed=0, segment_frames=1000, flush_interval=1000)
    assert list((root / ".partial").iterdir())
    recorder = recorders(root)
    assert recorder.sync()
    assert [p for p in root.iterdir() if p.name != ".partial"] == [] and leftovers(root) == []
    assert recorder.stats()["episodes_discarded"] == 1


def test_an_assembly_cut_short_is_done_again(tmp_path, recorders):
    """Killed while assembling: some dataset files written, ``info.json`` not yet, a torn temporary file."""
    root = tmp_path / "rec"
    record_then_kill(root, until_committed=4)
    (partial,) = list((root / ".partial").iterdir())
    assembled = assemble(partial)  # what the killed process would have been doing at its episode's end
    (partial / "meta/info.json").unlink()
    (partial / "data/chunk-000/file-000.parquet.tmp").write_bytes(b"PAR1 torn")
    data = partial / "data/chunk-000/file-000.parquet"
    data.write_bytes(data.read_bytes()[:100])  # and a data file that was never finished
    recorder = recorders(root)
    assert recorder.sync()
    path = only_recording(root)
    check_readable(path, assembled.frames)
    assert leftovers(root) == []


def test_a_partial_episode_that_is_not_ours_is_removed(tmp_path, recorders):
    root = tmp_path / "rec"
    junk = root / ".partial" / "20260101T000000Z_junk_000"
    (junk / "meta/cosmos3").mkdir(parents=True)
    (junk / "meta/cosmos3/session.json").write_text("{not json")
    (root / ".partial" / "deleting-20250101T000000Z_old_000" / "data").mkdir(parents=True)
    recorder = recorders(root)
    assert recorder.sync()
    assert list((root / ".partial").iterdir()) == []
    assert recorder.stats()["episodes_discarded"] == 1


def kill_and_damage_a_segment(root: Path, damage: str) -> tuple[Path, list[int]]:
    """An episode killed with at least three committed segments of 4 frames, its second damaged in its
    ``damage`` file after the kill; returns that segment and the seqs of the frames the others hold."""
    record_then_kill(root, until_committed=12)
    (partial,) = list((root / ".partial").iterdir())
    segments = committed_segments(partial)
    assert len(segments) >= 3
    bad = segments[1]
    target = {
        "rows": bad / "rows.parquet",
        "video": bad / "observation.images.front.mp4",
        "commit": bad / "segment.json",
    }[damage]
    data = bytearray(target.read_bytes())
    data[len(data) // 3 : 2 * len(data) // 3] = bytes(len(data) // 3)  # a run of zeros: a bad disk block
    target.write_bytes(bytes(data))
    kept = [
        seq for s in segments if s != bad for seq in pq.read_table(s / "rows.parquet")["observation.seq"].to_pylist()
    ]
    return bad, kept


@pytest.mark.parametrize("damage", ["rows", "video", "commit"])
def test_a_corrupt_committed_segment_is_quarantined_and_the_other_segments_recovered(
    tmp_path, recorders, caplog, damage
):
    root = tmp_path / "rec"
    bad, kept = kill_and_damage_a_segment(root, damage)
    with caplog.at_level(logging.WARNING):
        recorder = recorders(root)
        assert recorder.sync()
    path = only_recording(root)
    session = json.loads((path / "meta/cosmos3/session.json").read_text())
    assert session["quarantined_segments"] == [bad.name]
    assert session["frames"] == len(kept) >= 8
    # Moved aside whole, inside the recording, where LeRobot reads nothing; said once.
    assert sorted(p.name for p in (path / QUARANTINE_DIR / bad.name).iterdir()) == [
        "observation.images.front.mp4",
        "observation.images.wrist.mp4",
        "rows.parquet",
        "segment.json",
    ]
    said = [r.getMessage() for r in caplog.records if "does not read back" in r.getMessage()]
    assert len(said) == 1 and f"segment {bad.name}" in said[0], said
    data = pq.read_table(path / "data/chunk-000/file-000.parquet").to_pydict()
    assert data["observation.seq"] == kept and data["frame_index"] == list(range(len(kept)))
    decoded = list(RecordedEpisode(path).frames())
    originals = [frame(seq, 48, 64) for seq in range(max(kept) + 1)]
    for i, cameras in enumerate(decoded):
        assert_frames_match(cameras["front"], originals, kept[i])
    assert len(decoded) == len(kept)
    assert read_dataset(path).frames == len(kept)  # and the trainer's reader reads it
    assert leftovers(root) == []
    assert recorder.stats()["episodes_recovered"] == 1
