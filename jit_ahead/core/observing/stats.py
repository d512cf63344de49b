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
        (``core/observing/events.py`` declares every event)."""
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


class SummaryTally:
    """A listener counting what the session's summary at exit says: builds by where they ran, misses by
    outcome, damaged entries, replayed variants, executor compiles by phase."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, record: dict) -> None:
        event, counts = record["event"], self.counts
        if event == "build_finish" and record.get("found"):  # another process sharing the cache built it
            counts["found built by another process"] += 1
        elif event == "build_finish":
            counts["built in helpers" if record.get("helper") != "executor" else "built in place"] += 1
        elif event == "executor_miss":
            counts[f"executor {record.get('outcome')}"] += 1
        elif event == "cache_damaged":
            counts["damaged cache entries removed"] += 1
        elif event == "replay" and record.get("variants"):
            counts["replayed"] += record["variants"]
        elif event == "compile" and not record.get("cache_hit"):
            counts[f"executor compiles ({record.get('phase')})"] += 1
