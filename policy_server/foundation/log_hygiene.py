"""Log lines a client cannot forge or multiply: control characters escaped, repeated lines rate-limited.

Clients put text into the server's log: request paths, camera names, an operator's pause reason, peer
addresses. Two things go wrong without care:

* **forged lines.** A newline (or a carriage return, a terminal escape, a Unicode line separator) in
  that text starts what looks like a new log record. :func:`printable` escapes every such character
  (``\\n`` becomes the two characters ``\\`` ``n``); :class:`LogHygieneFilter` applies it to every
  message, whatever logger wrote it. Tracebacks are formatted apart from the message and keep their lines.
* **floods.** Each refused handshake, each failed ``accept()`` when file descriptors run out, each bad
  request logs a line; a client that repeats the offence thousands of times a second would write
  gigabytes. The filter lets the first ``burst`` records of a kind through per ``interval_s``, counts
  the rest, and writes one ``suppressed K similar lines`` summary per kind and interval. A kind is the
  logger, the level and the message template with digits ignored (so lines that differ only by a port,
  a file descriptor or a count are one kind).

:func:`install` puts one filter on every handler of the root logger, once per process (``cosmos3-serve``
calls it after configuring logging; uvicorn's and websockets' records propagate there).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass

DEFAULT_BURST = 20
DEFAULT_INTERVAL_S = 60.0
# Kinds remembered at once; beyond it the oldest are forgotten (a message that embeds arbitrary text
# makes a new kind per line; it then escapes the limit, but never grows memory).
MAX_KINDS = 4096

# C0 controls but tab, DEL, C1 controls, Unicode line/paragraph separators and bidirectional overrides.
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_DIGITS = re.compile(r"\d+")

logger = logging.getLogger(__name__)


def printable(text: str) -> str:
    """``text`` with every character that could start a fake log line or fool a terminal escaped."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


@dataclass
class _Window:
    start: float
    passed: int = 0
    suppressed: int = 0
    template: str = ""
    name: str = ""
    level: int = logging.INFO


class LogHygieneFilter(logging.Filter):
    """Escapes control characters in every record and rate-limits repeated kinds (module docstring).

    ``burst`` <= 0 turns the rate limit off (escaping stays on).
    """

    def __init__(self, burst: int = DEFAULT_BURST, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__()
        self.burst = burst
        self.interval_s = interval_s
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.suppressed_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == logger.name:  # our own summaries: never limited, already clean
            return True
        if self.burst > 0 and not self._admit(record):
            return False
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: let logging report it as usual
            return True
        clean = printable(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        return True

    def _admit(self, record: logging.LogRecord) -> bool:
        template = str(record.msg)
        key = (record.name, record.levelno, _DIGITS.sub("#", template)[:300])
        now = time.monotonic()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window.start >= self.interval_s:
                if window is not None and window.suppressed:
                    self._report(window)
                if window is None and len(self._windows) >= MAX_KINDS:
                    self._windows.pop(next(iter(self._windows)))
                window = self._windows[key] = _Window(
                    now, template=template[:200], name=record.name, level=record.levelno
                )
            if window.passed < self.burst:
                window.passed += 1
                return True
            window.suppressed += 1
            self.suppressed_total += 1
            if self._timer is None:  # a summary comes even if the flood stops now
                self._timer = threading.Timer(self.interval_s, self.flush)
                self._timer.daemon = True
                self._timer.start()
            return False

    def flush(self) -> None:
        """Write the summaries of windows that ended with suppressed lines; forget ended windows."""
        now = time.monotonic()
        with self._lock:
            self._timer = None
            pending = False
            for key, window in list(self._windows.items()):
                if now - window.start >= self.interval_s:
                    if window.suppressed:
                        self._report(window)
                    del self._windows[key]
                elif window.suppressed:
                    pending = True
            if pending:
                self._timer = threading.Timer(self.interval_s, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def cancel_summaries(self) -> None:
        """Drop the pending summaries and their timer (a filter taken out of use)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._windows.clear()

    def _report(self, window: _Window) -> None:
        # Logged through a logger of its own (never limited); the lock is not needed for that, but the
        # counts must not change under us, and handlers do not call back into this filter for it.
        logger.log(
            window.level,
            "suppressed %d similar lines in %.0f s (%s, level %s): %s",
            window.suppressed,
            self.interval_s,
            window.name,
            logging.getLevelName(window.level),
            printable(window.template),
        )
        window.suppressed = 0


_installed: LogHygieneFilter | None = None


def install(burst: int = DEFAULT_BURST, interval_s: float = DEFAULT_INTERVAL_S) -> LogHygieneFilter:
    """Put one :class:`LogHygieneFilter` on every handler of the root logger (configure logging first).

    Idempotent: a second call updates the limits of the filter already installed.
    """
    global _installed
    if _installed is None:
        _installed = LogHygieneFilter(burst, interval_s)
    else:
        _installed.burst, _installed.interval_s = burst, interval_s
    for handler in logging.getLogger().handlers:
        if _installed not in handler.filters:
            handler.addFilter(_installed)
    return _installed
