"""Records synthetic traffic until it is killed; prints what it sent and what its segments committed.

tests/test_recording_crash.py runs this in a subprocess and kills it with SIGKILL mid-episode, then
checks what the next recorder start makes of the folder it left. One JSON line per observation::

    {"sent": 12, "committed": 8}

``committed`` counts the frames in committed segments (their ``segment.json`` exists), read from disk.

    python recording_crash_script.py ROOT --segment-frames 4 --flush-interval 1.0
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from recording_fixtures import CONFIG, MODEL, record_traffic

from policy_server.recording import Recorder, RecorderSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--segment-frames", type=int, default=4)
    parser.add_argument("--flush-interval", type=float, default=1.0)
    args = parser.parse_args()
    root = Path(args.root)
    recorder = Recorder(
        RecorderSettings(root=root, segment_frames=args.segment_frames, flush_interval_s=args.flush_interval)
    )
    recorder.start()
    recording = recorder.session("killed")
    recording.start_episode(CONFIG, MODEL)
    seq = 0
    while True:
        record_traffic(recording, 1, start_seq=seq, drop_every=0)
        seq += 1
        committed = sum(json.loads(p.read_text())["frames"] for p in (root / ".partial").rglob("segment.json"))
        print(json.dumps({"sent": seq, "committed": committed}), flush=True)
        time.sleep(0.01)


if __name__ == "__main__":
    main()
