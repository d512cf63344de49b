"""What a pool's helpers import as soon as they can."""
from __future__ import annotations

import threading


class PreloadList:
    """The modules every helper of a pool imports before its next build, in the order they were asked for:
    the pool adds to it from the start, its starter reads it once helpers exist."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: list[str] = []

    def add(self, modules) -> None:
        with self._lock:
            self._names.extend(m for m in dict.fromkeys(modules) if m not in self._names)

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._names)
