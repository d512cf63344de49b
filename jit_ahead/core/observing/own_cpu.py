"""The CPU time jit_ahead spends inside the server's own process, by where it went.

A server's start with jit_ahead differs from one without it by what jit_ahead does in that process: its
threads (planning, replay, the pool's slots, the fork server's reader) and the calls the server's threads
make into the session (start, plan_model, waits, tune-ahead). Its helpers and planners are other
processes and not counted here. Wall-clock comparisons of two starts carry the host's noise; this says
how much of the process's CPU was jit_ahead's own, which a noisy host does not blur.

Threads count themselves: each jit_ahead thread is an ``OwnThread`` (or ``OwnTimer``), which adds its CPU
time here when it ends; a live one is read through its CPU-time clock. The session's entry points are
``counted``. Figures are per process (a forked planner starts from the parent's figures and they are not its own).
"""
from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)

_lock = threading.Lock()
_spent: dict[str, float] = defaultdict(float)  # what -> CPU seconds, of ended threads and finished calls
_also_without: set[str] = set()  # what ``spent`` counted that a process without jit_ahead does too
_calls = threading.local()  # per thread: the stack of its ``spent`` blocks (a counted thread's run at the bottom)


class _Counted:
    """Adds the thread's CPU time to ``_spent`` under its kind when it ends, less what ``spent`` blocks
    inside it counted under their own names."""

    kind: str = ""  # the thread's name without the numbers of its instance: one line per kind of thread
    _counted = False
    _frame: list  # [CPU time when it began, CPU time of the ``spent`` blocks inside it]

    def run(self) -> None:
        self._frame = [time.thread_time(), 0.0]
        _calls.__dict__.setdefault("stack", []).append(self._frame)
        try:
            super().run()  # type: ignore[misc]
        finally:
            _calls.stack.pop()
            began, inside = self._frame
            with _lock:
                _spent[self.kind or self.name] += time.thread_time() - began - inside  # type: ignore[attr-defined]
                self._counted = True


class OwnThread(_Counted, threading.Thread):
    """A ``threading.Thread`` of jit_ahead's: its CPU time counts as jit_ahead's, under ``kind``."""

    def __init__(self, *args, kind: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kind = kind


class OwnTimer(_Counted, threading.Timer):
    """A ``threading.Timer`` of jit_ahead's, counted as ``OwnThread`` is."""


@contextmanager
def spent(what: str, also_without: bool = False) -> Iterator[None]:
    """Count the calling thread's CPU time inside the block under ``what``; a block inside another one, or
    inside a thread of jit_ahead's, counts under its own name and not twice. ``also_without``: work a
    process without jit_ahead does as well (a DSL's own, moved earlier): listed, but not in ``total``."""
    if also_without:
        _also_without.add(what)
    stack = _calls.__dict__.setdefault("stack", [])
    frame = [time.thread_time(), 0.0]  # when it began, and the CPU time of the blocks inside it
    stack.append(frame)
    try:
        yield
    finally:
        stack.pop()
        total = time.thread_time() - frame[0]
        with _lock:
            if stack:
                stack[-1][1] += total
            _spent[what] += total - frame[1]


def counted(what: str) -> Callable[[F], F]:
    """A function whose calls count as ``spent(what)``."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def call(*args, **kwargs):
            with spent(what):
                return function(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


def _live_seconds(thread: threading.Thread) -> float:
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]
    except (OSError, AttributeError, TypeError, OverflowError):  # gone meanwhile, or no such clock here
        return 0.0


def seconds() -> dict[str, float]:
    """jit_ahead's CPU seconds in this process so far, by thread kind or call, largest first."""
    with _lock:
        out = defaultdict(float, _spent)
        for thread in threading.enumerate():
            frame = getattr(thread, "_frame", None)
            if isinstance(thread, _Counted) and not thread._counted and frame is not None:
                out[thread.kind or thread.name] += max(0.0, _live_seconds(thread) - frame[0] - frame[1])
    return {what: round(s, 3) for what, s in sorted(out.items(), key=lambda item: -item[1]) if s > 0}


def total() -> float:
    """jit_ahead's own CPU seconds in this process: ``seconds`` without the work a process without it
    does as well."""
    return round(sum(s for what, s in seconds().items() if what not in _also_without), 3)
