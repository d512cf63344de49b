"""Event counters and listeners. Every component reports through ``Stats.emit``; sinks subscribe."""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from .events import Event

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

    def emit(self, event: Event) -> None:
        """Stamp ``event`` (time, phase, thread) and hand its JSON object to every listener
        (``core/events.py`` declares every event)."""
        name = event.name
        record = {"event": name, "time": time.time(), "phase": self.phase,
                  "thread": threading.current_thread().name, **event.fields()}
        seconds = getattr(event, "seconds", None)
        with self._lock:
            self._counts[name] += 1
            if isinstance(seconds, (int, float)):
                self._seconds[name] += seconds
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(record)
            except Exception:  # a broken sink must never break a build or a launch
                log.exception("stats listener %r failed; event %s dropped for it", listener, name)

    def count(self, event: str) -> int:
        with self._lock:
            return self._counts[event]

    def seconds(self, event: str) -> float:
        with self._lock:
            return self._seconds[event]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
