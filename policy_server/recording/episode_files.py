"""Where an episode's own files live inside its folder, besides LeRobot's.

LeRobot reads ``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``, ``meta/episodes/``,
``data/`` and ``videos/``, and nothing else; the recorder keeps what LeRobot has no place for under
``meta/cosmos3/``:

- ``session.json``: the session's id and protocol, its resolved configuration, the model's identity, the
  dataset's layout, why and when the episode ended, and how many frames were lost on the way;
- ``events.jsonl``: drops, errors, configuration changes and operator actions, one JSON object a line,
  in order, with ``t`` in seconds since the episode started.

While an episode is being recorded its flushed frames wait in ``segments/NNNNNN/`` (``rows.parquet``,
one MP4 per camera, and ``segment.json``, written last: a segment without it was cut short and is
ignored). The folder is removed once the episode is published.
"""

from __future__ import annotations

SESSION_JSON = "meta/cosmos3/session.json"
EVENTS_JSONL = "meta/cosmos3/events.jsonl"
SEGMENTS_DIR = "segments"
SEGMENT_ROWS = "rows.parquet"
SEGMENT_COMMIT = "segment.json"
FORMAT_NAME = "cosmos3-recording"
FORMAT_VERSION = 1
