"""LeRobot's v3.0 dataset layout, spelled once: where its files lie, the fields of its path templates, and the
column a recording of this server adds to each frame (``response.kind``) with its kinds.

The recorder (``policy_server.recording``) writes this layout and the trainer
(:mod:`cosmos3_runtime.lerobot_dataset`) reads it; both take every name from here, so that a rename on one side
is a rename on the other, and the trainer never reads our own recordings as a stranger's dataset. It imports
nothing.

::

    meta/info.json                                  codebase_version, fps, features, path templates
    meta/stats.json                                 per-feature statistics
    meta/tasks.parquet                              task strings (the pandas index) -> task_index
    meta/episodes/chunk-000/file-000.parquet        one row per episode: lengths, file indices, stats
    data/chunk-000/file-000.parquet                 one row per frame
    videos/<video key>/chunk-000/file-000.mp4       one H.264 MP4 per camera
"""

from __future__ import annotations

CODEBASE_VERSION = "v3.0"

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
# The episodes index: one file (ours), or any number of them (a dataset LeRobot wrote, chunked).
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
EPISODES_GLOB = "meta/episodes/chunk-*/file-*.parquet"
# The path templates ``meta/info.json`` declares (``data_path``, ``video_path``), and the fields LeRobot fills
# each with, and no other.
DATA_PATH_TEMPLATE = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH_TEMPLATE = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
TEMPLATE_FIELDS = {"data_path": ("chunk_index", "file_index"), "video_path": ("video_key", "chunk_index", "file_index")}
# The one data file of a recording (one episode, one chunk).
DATA_PATH = DATA_PATH_TEMPLATE.format(chunk_index=0, file_index=0)

# How the server answered each recorded observation, one string per frame: a frame whose kind is
# ANSWERED_KIND holds the chunk answered, any other kind a chunk of zeros.
RESPONSE_KIND = "response.kind"
ANSWERED_KIND = "chunk"
DROPPED_KIND = "dropped"
ERROR_KIND = "error"
UNANSWERED_KIND = "unanswered"  # no answer came before the episode was written
RESPONSE_KINDS = (ANSWERED_KIND, DROPPED_KIND, ERROR_KIND, UNANSWERED_KIND)

# A chunk-labelled demonstration's frame whose label continues a given prefix (``cosmos3-reach-demos
# --student-prefixes``): how many leading rows of the frame's action chunk are that prefix, which training
# conditions on as a request's ``prefix_actions`` instead of learning it; 0 where there is none. One int64 a
# frame, only beside a chunk per frame.
PREFIX_ROWS = "action.prefix_rows"
