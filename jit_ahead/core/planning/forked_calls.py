"""A batch of independent planning calls spread over processes forked from the planning thread.

The shape-class search asks for a few dozen meta forwards at a time; run in the planning thread they take
the server's GIL for seconds during model loading and use one core. Here each batch is split over up to
``workers`` children forked as planners are (nice 19, detached from the server's descriptors and signals,
dying with it); each runs its share and sends the results back pickled, in one framed message. A child
that dies or sends nothing costs only its share: those calls run in the calling thread instead, so a
batch always completes (the same as with ``workers=0``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from . import planners
from ..processes import detach_from_server, fork_quietly, lower_priority
from ..building.protocol import ProtocolError, read_message, write_message

log = logging.getLogger("jit_ahead.planning")

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(frozen=True)
class _Failed:
    error: str
    where: str


_failing = False  # every child of a batch failed: later batches run in the calling thread
_forks_own_calls = False  # in a process of call_in_child: its call_all forks children of its own


class NotAnswered(RuntimeError):
    """``call_in_child`` got no result: the child failed, died, stayed silent or was stopped."""


def call_all(function: Callable[[Item], object], items: Sequence[Item], workers: int,
             enter: Callable[[], None] = lambda: None, timeout: float = 300.0) -> list:
    """``[function(item) for item in items]``, in up to ``workers`` forked children (the planning run's
    ``planners.planner_entry``, then ``enter``, run first in each); 0 workers, one item, a platform
    without fork, or a planner process (forked already; ``call_in_child``'s child aside): in this thread.
    A child silent for ``timeout`` seconds is killed and its share runs here; once every child of a batch
    has failed, the calls of this process run here."""
    global _failing
    items = list(items)
    # a forked process makes its calls itself: its forks would fork again
    forking = hasattr(os, "fork") and not _failing and (_forks_own_calls or not planners.in_planner())
    count = min(workers, len(items)) if forking else 0
    if count <= 1:
        return [function(item) for item in items]
    shares = [list(range(i, len(items), count)) for i in range(count)]
    children = []
    entry = planners.planner_entry.get()

    def enter_all() -> None:
        entry()
        enter()

    for share in shares:
        try:
            children.append((share, *_fork(function, [items[i] for i in share], enter_all)))
        except OSError as exc:
            log.info("planning calls: could not fork (%s); the rest run in this thread", exc)
            children.append((share, None, None))
    results: list = [None] * len(items)
    done = [False] * len(items)
    deadline = time.monotonic() + timeout
    for share, pid, stream in children:
        answers = None
        if stream is not None:
            ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                with contextlib.suppress(ProtocolError, OSError, EOFError):
                    answers = read_message(stream)
            else:
                log.warning("planning calls: a forked child was silent for %.0fs; killed, its %d calls run in "
                            "this thread", timeout, len(share))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stream.close()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if isinstance(answers, _Failed):
            log.info("planning calls: a forked child failed (%s); its %d calls run in this thread\n%s",
                     answers.error, len(share), answers.where)
        elif isinstance(answers, list) and len(answers) == len(share):
            for index, answer in zip(share, answers):
                results[index], done[index] = answer, True
        elif pid is not None and not isinstance(answers, _Failed):
            log.info("planning calls: a forked child sent no answer for %d calls; they run in this thread",
                     len(share))
    if not any(done):
        _failing = True
        log.warning("planning calls: no forked child answered (%d tried); this process makes its planning calls "
                    "in the planning thread from now on", len(children))
    for index, item in enumerate(items):
        if not done[index]:
            results[index] = function(item)
    return results


def can_call_in_child() -> bool:
    """Whether ``call_in_child`` forks here: not in a planner or other forked child, nor without fork."""
    return hasattr(os, "fork") and not _failing and not planners.in_planner()


def call_in_child(function: Callable[[], Result], enter: Callable[[], None] = lambda: None,
                  stop: Callable[[], bool] = lambda: False, timeout: float = 900.0) -> Result:
    """``function()`` in one child forked from this thread as a planner is (the planning run's
    ``planners.planner_entry``, then ``enter``, run first), whose own ``call_all`` forks children of its
    own: a long piece of Python planning work that would otherwise hold the server's GIL, and so delay
    its serving thread, for as long as it runs. Raises NotAnswered if the child fails, dies, is silent
    for ``timeout`` seconds, or ``stop()`` turns true while it runs (then it is killed)."""
    entry = planners.planner_entry.get()

    def run_in_child(_unused) -> Result:
        global _forks_own_calls
        _forks_own_calls = True
        return function()

    def enter_all() -> None:
        entry()
        enter()

    pid, stream = _fork(run_in_child, [None], enter_all)
    answers = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([stream], [], [], 0.2)
            if ready:
                with contextlib.suppress(ProtocolError, OSError, EOFError):
                    answers = read_message(stream)
                break
            if stop():
                raise NotAnswered("stopped")
            if time.monotonic() > deadline:
                raise NotAnswered(f"silent for {timeout:.0f}s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # gone already when it answered; a zombie until reaped below
        stream.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if isinstance(answers, _Failed):
        raise NotAnswered(f"{answers.error}\n{answers.where}")
    if not isinstance(answers, list) or len(answers) != 1:
        raise NotAnswered("it ended without an answer")
    return answers[0]


def _fork(function, share: list, enter: Callable[[], None]):
    global _forks_own_calls
    read_fd, write_fd = os.pipe()
    pid = fork_quietly()
    if pid == 0:
        _forks_own_calls = False  # a child of call_in_child's child makes its calls itself
        code = 0
        try:
            os.close(read_fd)
            planners.mark_planner()
            detach_from_server(keep=(write_fd,))
            lower_priority()
            enter()
            answers = [function(item) for item in share]
            with os.fdopen(write_fd, "wb", buffering=0, closefd=False) as out:
                write_message(out, answers)
        except BaseException as exc:  # noqa: BLE001 - a child must never return into the server's code
            code = 1
            with contextlib.suppress(Exception), os.fdopen(write_fd, "wb", buffering=0, closefd=False) as out:
                write_message(out, _Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=-3)))
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, os.fdopen(read_fd, "rb", buffering=0)
