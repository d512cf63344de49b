"""Running ranges of planned launches in this process: in the planning thread (what no planner could run),
or in a planner process, one capture per family for the whole run, sending what each launch found."""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from .chunks import Chunk, Failure, LaunchGroup, Position, Range, RangesLeft, Sink, chunks_from


SEND_EVERY_S = 0.25  # a planner sends what it found at least this often

class _Captures:
    """One capture per family for a whole run (repeated shapes hit each capture's in-memory cache), and
    what of each has been reported already."""

    def __init__(self, families: dict, stack: contextlib.ExitStack) -> None:
        self._families = families
        self._stack = stack
        # family -> (capture, how many of its requests and of each extra kind were sent)
        self._open: dict[str, tuple[Any, dict[str, int]]] = {}

    def open(self, family: str) -> None:
        if family not in self._open:
            self._open[family] = (self._stack.enter_context(self._families[family].capture()), {})

    def fresh(self, family: str) -> tuple[list, dict[str, list]]:
        """Requests, and by kind the family's extras, captured since the last call (captures keep first-seen
        order)."""
        entry = self._open.get(family)
        if entry is None:
            return [], {}
        plan, sent = entry
        fresh = {}
        for kind in ("requests", *self._families[family].extra_kinds):
            items = list(getattr(plan, kind)[sent.get(kind, 0):])
            sent[kind] = sent.get(kind, 0) + len(items)
            if items:
                fresh[kind] = items
        return fresh.pop("requests", []), fresh


class LaunchRunner:
    """Runs ranges of launches in this process, one capture per family for its whole life (repeated shapes
    hit each capture's in-memory cache), and reports what they found through
    ``found(group, requests, extras, failures)`` at least every SEND_EVERY_S and at the end of each range."""

    def __init__(self, groups: Sequence[LaunchGroup], chunks: Sequence[Chunk], families: dict,
                 found: Callable) -> None:
        self._groups = groups
        self._chunks = chunks
        self._found = found
        self._stack = contextlib.ExitStack()
        self._captures = _Captures(families, self._stack)
        self.launches = 0

    def close(self) -> None:
        self._stack.close()

    def run(self, part: Range, stop: Callable[[], bool] = lambda: False,
            progress: Callable[[int], None] | None = None) -> int | None:
        """Run ``part``; returns the launch where ``stop()`` turned true (checked before each), None once
        all ran."""
        group = self._chunks[part.chunk].group
        items, family = self._groups[group].items, self._groups[group].family
        failures: dict = {}
        last = time.perf_counter()
        try:
            for item in range(part.first, part.last):
                if stop():
                    return item
                if progress is not None:
                    progress(item)
                provider, launch = items[item]
                self._captures.open(family)
                try:
                    launch.run()
                except Exception as exc:
                    key = (provider.name, type(exc).__name__)
                    if key not in failures:  # one report per provider and error
                        text = str(exc).splitlines()[0][:500] if str(exc) else ""
                        failures[key] = Failure(provider.name, type(exc).__name__, text, launch.label)
                self.launches += 1
                if time.perf_counter() - last > SEND_EVERY_S:
                    self._send(group, family, failures)
                    last = time.perf_counter()
            return None
        finally:
            self._send(group, family, failures)

    def _send(self, group: int, family: str, failures: dict) -> None:
        requests, extras = self._captures.fresh(family)
        if requests or extras or failures:
            self._found(group, requests, extras, list(failures.values()))
            failures.clear()


def deliver(sink: Sink, group: int, requests, extras: dict, failures) -> None:
    """What launches of ``group`` found (here, or in a planner's Found message), handed to the sink."""
    if requests or extras:
        sink.found(group, list(requests), {kind: list(items) for kind, items in extras.items()})
    for failure in failures:
        sink.failed(failure)


def run_ranges_here(groups: Sequence[LaunchGroup], chunks: Sequence[Chunk], families: dict, sink: Sink,
                    ranges_left: RangesLeft, ranges: list[Range], stop: Callable[[], bool]) -> tuple[Range, int] | None:
    """Run ``ranges`` in order in the calling thread; where ``stop()`` turned true (the range, and its
    first launch not run), or None once all ran."""
    runner = LaunchRunner(groups, chunks, families, functools.partial(deliver, sink))
    try:
        for part in ranges:
            stopped = runner.run(part, stop)
            if stopped is not None:
                return part, stopped
            ranges_left.done(part)
        return None
    finally:
        runner.close()


def left_after(ranges_left: RangesLeft, stopped: tuple[Range, int]) -> int:
    """Launches not run: the open ranges, less what ran of the one stopped in."""
    part, item = stopped
    return sum(len(r) for r in ranges_left.open) - (item - part.first)


def run_in_thread(groups: Sequence[LaunchGroup], families: dict, sink: Sink, start: Position,
                  stop: Callable[[], bool]) -> Position | None:
    """Run every launch from ``start`` on in the calling thread; the position where ``stop()`` turned
    true, or None once all ran (then every group was reported done)."""
    chunks = chunks_from(groups, start, 1)
    ranges_left = RangesLeft(groups, chunks, sink, start.group)
    stopped = run_ranges_here(groups, chunks, families, sink, ranges_left,
                              [Range(k, c.first, c.last) for k, c in enumerate(chunks)], stop)
    return None if stopped is None else Position(chunks[stopped[0].chunk].group, stopped[1])
