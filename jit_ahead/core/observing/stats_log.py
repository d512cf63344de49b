"""The stats log: one JSON line per event, for the coverage report (``JIT_AHEAD_STATS=1`` or a path)."""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("jit_ahead.stats")

KNOB = "JIT_AHEAD_STATS"


def stats_log_path(raw: str | None, pid: int | None = None) -> Path | None:
    """Where this process writes its stats log: ``1`` -> ./jit_ahead_stats.PID.jsonl; a folder (existing,
    or written with a trailing slash) -> FOLDER/jit_ahead_stats.PID.jsonl; a file path as given (``{pid}``
    is replaced). Unset, empty or ``0``: no log."""
    raw = (raw or "").strip()
    if raw.lower() in ("", "0", "false", "no", "off"):
        return None
    pid = os.getpid() if pid is None else pid
    name = f"jit_ahead_stats.{pid}.jsonl"
    if raw.lower() in ("1", "true", "yes", "on"):
        return Path.cwd() / name
    if raw.endswith(os.sep) or Path(raw).is_dir():
        return Path(raw) / name
    return Path(raw.replace("{pid}", str(pid)))


class StatsLog:
    """A Stats listener appending each event as one JSON line; safe from any thread. The first write that
    fails (a full disk, a lost mount) logs one line and turns the log off: events are dropped from then
    on, the process and its summary line go on."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).absolute()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # one line, one flush
        self._lock = threading.Lock()
        self.failed: str | None = None  # why writing stopped

    def __call__(self, record: dict) -> None:
        line = json.dumps(record, default=str, separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write(line + "\n")
            except OSError as exc:
                self.failed = str(exc)
                log.error("cannot write the stats log %s (%s); it is off from here on, the summary goes to the "
                          "log", self.path, exc)
                self._close_quietly()

    def _close_quietly(self) -> None:
        try:
            self._file.close()  # flushes what is buffered: that may fail the same way
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._close_quietly()


def open_stats_log(stats, raw: str | None = None) -> StatsLog | None:
    """Subscribe a StatsLog to ``stats`` if JIT_AHEAD_STATS asks for one; a path that cannot be written
    is reported in one line and the process runs without a log."""
    path = stats_log_path(os.environ.get(KNOB) if raw is None else raw)
    if path is None:
        return None
    try:
        sink = StatsLog(path)
    except OSError as exc:
        log.error("%s=%s: cannot write %s (%s); running without a stats log", KNOB, os.environ.get(KNOB), path, exc)
        return None
    stats.subscribe(sink)
    log.info("jit_ahead stats log: %s", sink.path)
    return sink
