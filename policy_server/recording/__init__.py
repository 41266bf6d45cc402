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
"""

from .recorder import NO_RECORDING, NullSessionRecording, Recorder, SessionRecording
from .store import InvalidRecordingName, RecordingInfo, RecordingStore
from .writer import RecorderSettings, RecorderState

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
