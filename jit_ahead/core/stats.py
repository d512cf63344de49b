"""Event counters and listeners. Every component reports through ``Stats.emit``; sinks subscribe."""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("jit_ahead.stats")

Listener = Callable[[dict], None]


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._seconds: collections.Counter[str] = collections.Counter()
        self._listeners: list[Listener] = []
        self.phase = "startup"  # "serving" once the engine marked it; every event carries it

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def emit(self, event: str, *, seconds: float | None = None, **fields) -> None:
        record = {"event": event, "time": time.time(), "phase": self.phase,
                  "thread": threading.current_thread().name, **fields}
        if seconds is not None:
            record["seconds"] = round(seconds, 6)
        with self._lock:
            self._counts[event] += 1
            if seconds is not None:
                self._seconds[event] += seconds
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(record)
            except Exception:  # a broken sink must never break a build or a launch
                log.exception("stats listener %r failed; event %s dropped for it", listener, event)

    def count(self, event: str) -> int:
        with self._lock:
            return self._counts[event]

    def seconds(self, event: str) -> float:
        with self._lock:
            return self._seconds[event]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
