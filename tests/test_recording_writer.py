"""The recorder on a real disk: what a session sends and gets back becomes a LeRobotDataset v3.0 episode.

Real files, real ffmpeg, real Parquet; the frames are synthetic (recording_fixtures), the engine is not
involved (tests/test_recording_engine.py records real engine outputs). Each test reads the result back
from disk with pyarrow, ffmpeg and the recording reader.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from recording_fixtures import (
    CONFIG,
    HORIZON,
    MODEL,
    TIMING,
    assert_frames_match,
    chunk,
    frame,
    leftovers,
    only_recording,
    record_traffic,
    recorders,  # noqa: F401 - fixture
)

from policy_server.recording import InvalidRecordingName, RecordingStore
from policy_server.recording.assembly import join_segments
from policy_server.recording.replay import RecordedEpisode
from policy_server.videos.encoding import VideoEncodingError, encode_mp4, read_mp4

pytestmark = pytest.mark.timeout(120)


def test_an_episode_is_a_lerobot_v3_dataset_of_what_was_sent_and_answered(tmp_path, recorders):
    recorder = recorders(tmp_path / "rec", segment_frames=8)
    recording = recorder.session("3f2a9c0d11aa")
    recording.start_episode(CONFIG, MODEL)
    traffic = record_traffic(
        recording,
        21,
        error_at=(5,),
        unanswered=(20,),
        prompts=("pick", "place"),
        cameras={"front": (48, 64), "wrist": (31, 41)},
    )  # odd sides are padded in the MP4
    recording.note("operator", action="pause", reason="check")
    recording.end_episode("closed")
    assert recorder.sync()
    path = only_recording(tmp_path / "rec")
    assert path.name.endswith("_3f2a9c0d11aa_000")

    info = json.loads((path / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10 and info["robot_type"] == CONFIG["domain_name"]
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (1, 21, 2)
    features = info["features"]
    assert features["observation.images.front"]["shape"] == [48, 64, 3]
    assert features["observation.images.wrist"]["shape"] == [32, 42, 3]
    assert features["observation.images.wrist"]["info"]["video.codec"] == "h264"
    assert features["action"]["shape"] == [HORIZON, 3] and features["observation.state"]["shape"] == [5]
    assert list(features)[-5:] == ["timestamp", "frame_index", "episode_index", "index", "task_index"]

    data = pq.read_table(path / "data/chunk-000/file-000.parquet").to_pydict()
    sent = traffic.sent
    assert data["observation.seq"] == [s.seq for s in sent]
    assert data["frame_index"] == data["index"] == list(range(21))
    assert data["timestamp"] == pytest.approx([i / 10 for i in range(21)])
    assert data["response.kind"] == [s.kind for s in sent]
    assert data["response.reason"][5] == "engine_error" and data["response.reason"][3] == "superseded"
    assert np.all(np.diff(data["observation.received_at"]) >= 0)
    for s, actions, timing in zip(sent, data["action"], data["response.timing_ms"]):
        if s.kind == "chunk":
            np.testing.assert_array_equal(np.array(actions, np.float32), s.actions)
            assert timing[1] == TIMING["queue_ms"] and timing[5] == TIMING["observation_age_ms"]
        else:
            assert not np.array(actions).any() and timing == [-1.0] * 6  # no NaN in a LeRobot dataset
    np.testing.assert_array_equal(np.array(data["observation.state"], np.float32), np.stack([s.state for s in sent]))
    tasks = pq.read_table(path / "meta/tasks.parquet").to_pydict()
    assert tasks == {"task_index": [0, 1], "__index_level_0__": ["pick", "place"]}
    assert data["task_index"] == [0] * 11 + [1] * 10

    episode = RecordedEpisode(path)
    for i, cameras in enumerate(episode.frames()):
        for name in ("front", "wrist"):
            assert cameras[name].shape == sent[i].cameras[name].shape
            assert_frames_match(cameras[name], [s.cameras[name] for s in sent], i)
    assert i == 20

    stats = json.loads((path / "meta/stats.json").read_text())
    answered = np.stack([s.actions for s in sent if s.kind == "chunk"])
    np.testing.assert_allclose(stats["action"]["mean"], answered.reshape(-1, 3).mean(axis=0), rtol=1e-6)
    assert stats["action"]["count"] == [len(answered)]
    assert np.array(stats["observation.images.front"]["mean"]).shape == (3, 1, 1)
    episodes = pq.read_table(path / "meta/episodes/chunk-000/file-000.parquet").to_pylist()[0]
    assert episodes["length"] == 21 and episodes["tasks"] == ["pick", "place"]
    assert episodes["videos/observation.images.front/to_timestamp"] == pytest.approx(2.1)

    session = json.loads((path / "meta/cosmos3/session.json").read_text())
    assert session["session_id"] == "3f2a9c0d11aa" and session["config"] == CONFIG and session["model"] == MODEL
    assert session["end_reason"] == "closed" and session["frames"] == 21 and session["frames_not_queued"] == 0
    assert session["layout"]["camera_names"] == {
        "observation.images.front": "front",
        "observation.images.wrist": "wrist",
    }
    kinds = [e["kind"] for e in episode.events()]
    assert kinds[0] == "episode_start" and kinds[-1] == "episode_end"
    assert kinds.count("dropped") == sum(s.kind == "dropped" for s in sent) and kinds.count("error") == 1
    assert {"kind": "note", "note": "operator", "action": "pause", "reason": "check"}.items() <= next(
        e for e in episode.events() if e["kind"] == "note"
    ).items()
    request = json.loads(data["observation.request"][0])
    assert request["image_source"] == {"camera": "front"} and request["seed"] == 0 and request["prompt"] == "pick"
    assert leftovers(tmp_path / "rec") == []
    stats = recorder.stats()
    assert stats["frames_recorded"] == 21 and stats["episodes_published"] == 1 and stats["write_errors"] == 0


def test_a_chunk_of_another_shape_is_recorded_as_an_error_not_as_a_chunk(tmp_path, recorders):
    """A chunk whose shape is not the episode's cannot be stored in its action column; the row says so as an
    error, so that training and the action statistics leave it out."""
    recorder = recorders(tmp_path / "rec", segment_frames=8)
    recording = recorder.session("5b1c")
    recording.start_episode(CONFIG, MODEL)
    traffic = record_traffic(recording, 4, drop_every=0)
    images = {"front": frame(4, 48, 64), "wrist": frame(4, 32, 40)}
    recording.observation(4, images, None, state=np.zeros(5, np.float32))
    recording.chunk(4, np.ones((HORIZON + 2, 3), np.float32), TIMING, seed=4)
    recording.end_episode("closed")
    assert recorder.sync()
    path = only_recording(tmp_path / "rec")
    data = pq.read_table(path / "data/chunk-000/file-000.parquet").to_pydict()
    assert data["response.kind"] == ["chunk"] * 4 + ["error"]
    assert data["response.reason"][4] == "shape_mismatch"
    assert not np.array(data["action"][4]).any()
    stats = json.loads((path / "meta/stats.json").read_text())
    assert stats["action"]["count"] == [4]
    np.testing.assert_allclose(
        stats["action"]["mean"], np.stack([s.actions for s in traffic.sent]).reshape(-1, 3).mean(axis=0), rtol=1e-6
    )
    session = json.loads((path / "meta/cosmos3/session.json").read_text())
    assert session["frames"] == 5
    assert session["counts"] == {"observations": 5, "chunks": 4, "dropped": 0, "errors": 1}


def test_a_full_queue_drops_frames_and_counts_them_instead_of_waiting(tmp_path, recorders):
    # Two frames of room and 480x640 cameras: the writer (encoding) is far slower than this burst.
    recorder = recorders(tmp_path / "rec", queue_frames=2, queue_bytes=4 << 20, segment_frames=4)
    recording = recorder.session("burst")
    recording.start_episode(CONFIG, MODEL)
    sent, peak_bytes = [], 0
    for seq in range(60):
        sent += record_traffic(
            recording, 1, start_seq=seq, drop_every=0, cameras={"front": (480, 640), "wrist": (480, 640)}
        ).sent
        peak_bytes = max(peak_bytes, recorder.stats()["queue_bytes"])
    queued = [s for s in sent if s.queued]
    assert 0 < len(queued) < 60
    assert recorder.stats()["frames_dropped_queue_full"] == 60 - len(queued)
    assert recording.frames_not_queued == 60 - len(queued)
    assert peak_bytes <= 4 << 20
    recording.end_episode("closed")
    assert recorder.sync(60)
    path = only_recording(tmp_path / "rec")
    data = pq.read_table(path / "data/chunk-000/file-000.parquet").to_pydict()
    assert data["observation.seq"] == [s.seq for s in queued]  # exactly the frames that were queued
    session = json.loads((path / "meta/cosmos3/session.json").read_text())
    assert session["frames_not_queued"] == 60 - len(queued)
    # The chunks of frames that were never queued are not lost either: they are in the event log.
    unmatched = {e["seq"] for e in RecordedEpisode(path).events() if e["kind"] == "unmatched_chunk"}
    assert unmatched == {s.seq for s in sent if not s.queued}


def test_names_and_camera_keys_cannot_escape_the_directory(tmp_path, recorders):
    store = RecordingStore(tmp_path / "rec")
    for bad in (
        "../etc",
        "..",
        "/etc/passwd",
        "20260101T000000Z_x_000/..",
        "20260101T000000Z_a/b_000",
        "",
        "20260101T000000Z_x_000\x00",
        ".partial",
    ):
        with pytest.raises(InvalidRecordingName):
            store.path(bad)
    recorder = recorders(tmp_path / "rec", segment_frames=4)
    recording = recorder.session("../../etc/passwd")
    recording.start_episode(CONFIG, MODEL)
    record_traffic(recording, 3, cameras={"../../x": (16, 16), "a/b": (16, 16), "a_b": (16, 16)})
    recording.end_episode("closed")
    assert recorder.sync()
    path = only_recording(tmp_path / "rec")
    assert path.parent == tmp_path / "rec" and "_etc-passwd_" in path.name
    assert store.path(path.name) == path
    keys = sorted(p.name for p in (path / "videos").iterdir())
    assert keys == ["observation.images.a_b", "observation.images.a_b_2", "observation.images.x"]
    root = (tmp_path / "rec").resolve()
    assert all(p.resolve().is_relative_to(root) for p in tmp_path.rglob("*"))
    # A symlink dressed as a recording is not followed.
    (tmp_path / "rec" / "20260101T000000Z_evil_000").symlink_to(tmp_path)
    with pytest.raises(FileNotFoundError):
        store.path("20260101T000000Z_evil_000")
    assert [info.name for info in store.list()] == [path.name]


def test_a_new_camera_size_or_chunk_shape_starts_a_new_episode(tmp_path, recorders):
    recorder = recorders(tmp_path / "rec", segment_frames=4)
    recording = recorder.session("split")
    recording.start_episode(CONFIG, MODEL)
    record_traffic(recording, 3, cameras={"front": (48, 64)})
    record_traffic(recording, 3, start_seq=3, cameras={"front": (64, 64)})
    recording.configured({**CONFIG, "action_horizon": 8})
    recording.observation(6, {"front": frame(6, 64, 64)}, None)
    recording.chunk(6, np.zeros((8, 3), np.float32), TIMING)
    recording.end_episode("closed")
    assert recorder.sync()
    paths = sorted((tmp_path / "rec").glob("2*"))
    assert [p.name[-3:] for p in paths] == ["000", "001", "002"]
    reasons = [json.loads((p / "meta/cosmos3/session.json").read_text())["end_reason"] for p in paths]
    assert reasons == ["layout_changed", "reconfigured", "closed"]
    lengths = [json.loads((p / "meta/info.json").read_text())["total_frames"] for p in paths]
    assert lengths == [3, 3, 1]
    for path in paths[1:]:  # an episode split off starts with its first frame
        assert pq.read_table(path / "data/chunk-000/file-000.parquet").column("observation.received_at")[0].as_py() == 0
    last = json.loads((paths[2] / "meta/info.json").read_text())["features"]
    assert last["action"]["shape"] == [8, 3] and last["observation.images.front"]["shape"] == [64, 64, 3]


def test_frames_reach_the_disk_while_the_episode_is_still_running(tmp_path, recorders):
    recorder = recorders(tmp_path / "rec", segment_frames=1000, flush_interval_s=0.2)
    recording = recorder.session("slow-robot")
    recording.start_episode(CONFIG, MODEL)
    record_traffic(recording, 3)
    deadline = time.monotonic() + 30
    while not list((tmp_path / "rec/.partial").rglob("segment.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    committed = list((tmp_path / "rec/.partial").rglob("segment.json"))
    assert len(committed) == 1 and json.loads(committed[0].read_text())["frames"] == 3
    recording.end_episode("closed")
    assert recorder.sync()


def test_an_outcome_that_comes_after_its_row_was_flushed_goes_to_the_event_log(tmp_path, recorders):
    recorder = recorders(tmp_path / "rec", segment_frames=4, flush_interval_s=0.1)
    recording = recorder.session("late")
    recording.start_episode(CONFIG, MODEL)
    for seq in range(3):
        recording.observation(seq, {"front": frame(seq)}, None)
    deadline = time.monotonic() + 30  # after two flush intervals the unanswered rows are flushed as such
    while not list((tmp_path / "rec/.partial").rglob("segment.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    recording.chunk(0, chunk(0), TIMING)
    recording.end_episode("closed")
    assert recorder.sync()
    episode = RecordedEpisode(only_recording(tmp_path / "rec"))
    assert [row.kind for row in episode.rows()] == ["unanswered"] * 3
    assert [e["seq"] for e in episode.events() if e["kind"] == "unmatched_chunk"] == [0]


def test_the_quota_deletes_the_oldest_recordings_and_caps_an_episode_that_alone_exceeds_it(tmp_path, recorders):
    root = tmp_path / "rec"
    recorder = recorders(root, segment_frames=4)
    for n in range(2):
        recording = recorder.session(f"old{n}")
        recording.start_episode(CONFIG, MODEL)
        record_traffic(recording, 8, cameras={"front": (96, 128)})
        recording.end_episode("closed")
        assert recorder.sync()
    recorder.close()
    sizes = {info.name: info.num_bytes for info in RecordingStore(root).list()}
    oldest = min(sizes)
    quota = sum(sizes.values()) + 1000  # both fit; one more episode does not

    recorder = recorders(root, segment_frames=4, max_bytes=quota)
    recording = recorder.session("new")
    recording.start_episode(CONFIG, MODEL)
    record_traffic(recording, 8, cameras={"front": (96, 128)})
    recording.end_episode("closed")
    assert recorder.sync()
    names = [info.name for info in RecordingStore(root).list()]
    assert oldest not in names and len(names) == 2 and any("_new_" in n for n in names)
    assert recorder.stats()["recordings_deleted_quota"] == 1

    # An episode bigger than the whole quota ends at the quota; the session's later frames are not kept.
    recorder.close()
    recorder = recorders(root, segment_frames=4, max_bytes=max(sizes.values()) // 2)
    recording = recorder.session("huge")
    recording.start_episode(CONFIG, MODEL)
    record_traffic(recording, 40, cameras={"front": (96, 128)})
    recording.end_episode("closed")
    assert recorder.sync()
    huge = next(p for p in root.glob("2*") if "_huge_" in p.name)
    session = json.loads((huge / "meta/cosmos3/session.json").read_text())
    assert session["end_reason"] == "quota" and session["frames"] < 40
    assert recorder.stats()["frames_not_recorded"] == 40 - session["frames"]
    assert [p.name for p in root.glob("2*")] == [huge.name]


def test_recordings_older_than_the_retention_age_are_deleted(tmp_path, recorders):
    root = tmp_path / "rec"
    recorder = recorders(root, segment_frames=4)
    for name in ("aged", "fresh"):
        recording = recorder.session(name)
        recording.start_episode(CONFIG, MODEL)
        record_traffic(recording, 2)
        recording.end_episode("closed")
    assert recorder.sync()
    recorder.close()
    aged = next(root.glob("*_aged_*"))
    two_days_ago = time.time() - 2 * 86400
    os.utime(aged, (two_days_ago, two_days_ago))
    recorder = recorders(root, max_age_s=86400)
    assert recorder.sync()
    assert [p.name.split("_")[1] for p in root.glob("2*")] == ["fresh"]
    assert recorder.stats()["recordings_deleted_age"] == 1


def test_a_recorded_session_must_say_its_chunk_shape(tmp_path, recorders):
    recording = recorders(tmp_path / "rec").session("x")
    with pytest.raises(ValueError, match="raw_action_dim"):
        recording.start_episode({"domain_name": "d", "action_horizon": 4}, MODEL)
    assert recording.observation(0, {"front": frame(0)}, None) is False  # no episode: nothing is queued


@pytest.mark.parametrize("sizes", [(3, 7, 3), (4, 4), (5,), (3, 3, 3, 3)])
def test_segments_join_into_one_mp4_whose_frame_i_is_at_i_over_fps(tmp_path, sizes):
    originals = [frame(i) for i in range(sum(sizes))]
    segments, start = [], 0
    for k, size in enumerate(sizes):
        encode_mp4(np.stack(originals[start : start + size]), 10, tmp_path / f"{k}.mp4")
        segments.append((tmp_path / f"{k}.mp4", size))
        start += size
    join_segments(segments, tmp_path / "joined.mp4")
    decoded = read_mp4(tmp_path / "joined.mp4")  # ffmpeg's own reader repeats or skips frames on bad timestamps
    assert len(decoded) == len(originals)
    for i, image in enumerate(decoded):
        assert_frames_match(image, originals, i)


def test_a_segment_too_short_to_join_is_refused(tmp_path):
    for k, size in enumerate((4, 2)):
        encode_mp4(np.stack([frame(i) for i in range(size)]), 10, tmp_path / f"{k}.mp4")
    with pytest.raises(VideoEncodingError, match="at least 3 frames"):
        join_segments([(tmp_path / "0.mp4", 4), (tmp_path / "1.mp4", 2)], tmp_path / "joined.mp4")
    assert not (tmp_path / "joined.mp4").exists()


@pytest.mark.parametrize("count,video_frames", [(1, 3), (2, 3), (6, 7)])  # 6 = a segment of 4, then 2
def test_an_episode_ending_on_a_short_segment_pads_its_video_past_its_end(tmp_path, recorders, count, video_frames):
    recorder = recorders(tmp_path / "rec", segment_frames=4)
    recording = recorder.session("short")
    recording.start_episode(CONFIG, MODEL)
    traffic = record_traffic(recording, count, drop_every=0, cameras={"front": (48, 64)})
    recording.end_episode("closed")
    assert recorder.sync()
    path = only_recording(tmp_path / "rec")
    video = read_mp4(path / "videos/observation.images.front/chunk-000/file-000.mp4")
    assert len(video) == video_frames
    for i in range(count):
        assert_frames_match(video[i], [s.cameras["front"] for s in traffic.sent], i)
    for extra in video[count:]:  # the repeats: the episode's last frame
        assert_frames_match(extra, [s.cameras["front"] for s in traffic.sent], count - 1)
    episodes = pq.read_table(path / "meta/episodes/chunk-000/file-000.parquet").to_pylist()[0]
    assert episodes["videos/observation.images.front/to_timestamp"] == pytest.approx(count / 10)
    assert [len(list(RecordedEpisode(path).frames()))] == [count]
