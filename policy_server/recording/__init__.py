"""Recording sessions as LeRobotDataset v3.0 datasets, and re-running them (``docs/recording.md``).

What a session uses::

    recorder = Recorder(RecorderSettings(root=Path("recordings")))
    recorder.start()                                   # recovers what a crash left, then writes
    recording = recorder.session(session_id)           # or NO_RECORDING
    recording.start_episode(resolved_config, engine.describe().identity())
    recording.observation(seq, {"front": frame}, request, received_at=received_at)
    recording.chunk(seq, actions, timing, seed)        # or .dropped(seq, reason) / .error(seq, code, message)
    recording.end_episode("closed")
    recorder.close()

Modules, one job each: :mod:`.events` (what crosses to the writer thread), :mod:`.write_queue` (the
bounded hand-off), :mod:`.session_recording` (what a session calls), :mod:`.recorder` (the recorder
sessions talk to), :mod:`.writer_thread` (the thread that writes), :mod:`.settings`, :mod:`.episode_writer`
(one episode's rows and segments), :mod:`.assembly` (segments into a dataset), :mod:`.lerobot_format`
and :mod:`.dataset_stats` (LeRobot's layout and statistics), :mod:`.video_segments` (joining MP4
segments), :mod:`.durable_files` (atomic writes), :mod:`.store` (names, listing, quota, retention),
:mod:`.recovery` (after a crash), :mod:`.reader` and :mod:`.replay` (reading recordings back and
``cosmos3-replay``).
"""

from .recorder import Recorder
from .session_recording import NO_RECORDING, NullSessionRecording, SessionRecording
from .settings import RecorderSettings, RecorderState
from .store import InvalidRecordingName, RecordingInfo, RecordingStore

__all__ = [
    "InvalidRecordingName",
    "NO_RECORDING",
    "NullSessionRecording",
    "Recorder",
    "RecorderSettings",
    "RecorderState",
    "RecordingInfo",
    "RecordingStore",
    "SessionRecording",
]
