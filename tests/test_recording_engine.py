"""Real engine outputs recorded end to end, then re-run with ``cosmos3-replay`` against the same tiny
checkpoint and against a second one (another random seed): the table, the JSON, the regression gate.

The chunks come from the real diffusers pipeline on the tiny checkpoints of tests/conftest.py; the
recorder gets them the way a session will hand them over (the ActionRequest it queued, the chunk it
sent, its timing).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from recording_fixtures import DOMAIN, frame, only_recording, recorders  # noqa: F401 - fixture

from cosmos3_runtime.requests import ActionRequest
from policy_server.foundation.camera_intake import side_by_side
from policy_server.recording.replay import main as replay_main

pytestmark = pytest.mark.timeout(300)


def chunk_timing(chunk) -> dict:
    return {
        "queue_ms": 0.0,
        "model_ms": chunk.timing.model_ms,
        "engine_ms": chunk.timing.total_ms,
        "total_ms": chunk.timing.total_ms,
        "observation_age_ms": chunk.timing.total_ms,
    }


def test_engine_chunks_are_recorded_and_replayed_against_the_same_and_another_checkpoint(
    tmp_path, tiny_checkpoint, tiny_engine, recorders, capsys
):
    engine = tiny_engine("distilled")
    description = engine.describe()
    config = {
        "domain_name": DOMAIN,
        "action_horizon": description.domains[DOMAIN].default_horizon,
        "raw_action_dim": description.domains[DOMAIN].raw_action_dim,
        "prompt": "stack the cups",
    }
    recorder = recorders(tmp_path / "rec", segment_frames=4)
    recording = recorder.session("engine")
    recording.start_episode(config, description.identity())
    recorded = {}
    for seq in range(4):
        cameras = {"front": frame(seq, 64, 80), "wrist": frame(seq + 50, 64, 64, channel_shift=30)}
        # seq 1 conditions on both cameras side by side (concat_view), the others on the front camera.
        image = side_by_side(list(cameras.values())) if seq == 1 else cameras["front"]
        request = ActionRequest(domain_name=DOMAIN, image=image, prompt="stack the cups")
        recording.observation(seq, cameras, request)
        if seq == 3:
            recording.dropped(seq, "superseded", "a newer observation replaced it")
            continue
        chunk = engine.predict_actions(request)
        recorded[seq] = chunk.actions
        recording.chunk(seq, chunk.actions, chunk_timing(chunk), seed=chunk.seed)
    # An observation whose model image is none of its cameras cannot be replayed; it is reported so.
    cameras = {"front": frame(4, 64, 80), "wrist": frame(54, 64, 64, channel_shift=30)}
    recording.observation(4, cameras, ActionRequest(domain_name=DOMAIN, image=frame(99, 64, 80)))
    recording.chunk(4, np.zeros_like(recorded[0]), {}, seed=1)
    recording.end_episode("closed")
    assert recorder.sync()
    path = only_recording(tmp_path / "rec")

    same_json, other_json = tmp_path / "same.json", tmp_path / "other.json"
    assert (
        replay_main([str(path), "--model", str(tiny_checkpoint("distilled")), "--all", "--json", str(same_json)]) == 0
    )
    same_table = capsys.readouterr().out
    other_checkpoint = tiny_checkpoint("distilled", seed=1)
    assert replay_main([str(path), "--model", str(other_checkpoint), "--json", str(other_json)]) == 0
    other_table = capsys.readouterr().out

    same, other = json.loads(same_json.read_text()), json.loads(other_json.read_text())
    by_seq = {c["seq"]: c for c in same["chunks"]}
    assert [c["status"] for c in same["chunks"]] == ["compared", "compared", "compared", "replayed", "skipped"]
    assert by_seq[4]["note"] == "the model's image was not one of the recorded cameras"
    assert by_seq[3]["recorded"] == "dropped" and by_seq[3]["replayed_shape"] == list(recorded[0].shape)
    # The same checkpoint, seed and settings give the recorded chunks back, up to what H.264 did to the frames.
    assert same["summary"]["compared"] == 3 and same["summary"]["errors"] == 0
    assert same["recorded_model"]["model"] == same["model"]["model"] == str(tiny_checkpoint("distilled"))
    # Another checkpoint answers differently, by far.
    assert [c["seq"] for c in other["chunks"]] == [0, 1, 2, 4]  # without --all: only what got a chunk
    assert other["model"]["model"] == str(other_checkpoint) and other["summary"]["compared"] == 3
    assert other["summary"]["max_abs_diff"] > 20 * same["summary"]["max_abs_diff"]
    for table in (same_table, other_table):
        assert "max|Δ|" in table and "chunks compared" in table
        for seq in (0, 1, 2, 4):
            assert any(line.split()[:1] == [str(seq)] for line in table.splitlines())

    # A setting changed instead of the checkpoint (another seed) answers differently: the replay fails
    # the regression gate (exit 1).
    gate = same["summary"]["max_abs_diff"] * 2
    assert (
        replay_main(
            [
                str(path),
                "--model",
                str(tiny_checkpoint("distilled")),
                "--limit",
                "1",
                "--seed",
                "7",
                "--fail-above",
                str(gate),
                "--json",
                str(tmp_path / "seed.json"),
            ]
        )
        == 1
    )
    other_seed = json.loads((tmp_path / "seed.json").read_text())
    assert other_seed["overrides"] == {"seed": 7} and other_seed["summary"]["max_abs_diff"] > gate
    # A setting the checkpoint refuses is reported per chunk, with the engine's error code (JSON on stdout).
    capsys.readouterr()
    assert (
        replay_main(
            [str(path), "--model", str(tiny_checkpoint("distilled")), "--limit", "1", "--num-steps", "1", "--json", "-"]
        )
        == 0
    )
    refused = json.loads(capsys.readouterr().out)
    assert refused["chunks"][0]["status"] == "error" and refused["chunks"][0]["note"].startswith("invalid_request")
    assert refused["summary"]["errors"] == 1


def test_replay_refuses_a_folder_that_is_not_a_recording(tmp_path, capsys):
    assert replay_main([str(tmp_path), "--model", "unused"]) == 2
    assert "is not a recording" in capsys.readouterr().err
