"""The per-variant build lock: the processes of one node (ranks, their helpers) build a variant once.

Waiting for it is bounded. A process holding it can be stopped (SIGSTOP, a debugger), hung or swapped
out; its lock then outlives any reasonable build. After ``timeout`` seconds the waiter builds without
the lock, with one line naming the holder: both builds publish through the DSL's atomic cache writes,
so the cost of a stuck holder is one duplicate build, never a stuck launch.

The holder writes its pid beside the lock (``LOCK.owner``), which is how the line can name it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator

from .. import knobs

log = logging.getLogger("jit_ahead.build_lock")


@functools.lru_cache(maxsize=8)
def _timeout_for(raw: str | None) -> float:
    return knobs.wait_timeout_s()  # checked (one line for a bad value) once per value, not per build


def default_timeout() -> float:
    """JIT_AHEAD_WAIT_TIMEOUT_S: the bound on every wait of a launch, this one included."""
    return _timeout_for(os.environ.get("JIT_AHEAD_WAIT_TIMEOUT_S"))


def holder(lock_path: str) -> str:
    """Who holds the lock, as far as its owner file says: pid, state and command."""
    try:
        with open(lock_path + ".owner", encoding="ascii") as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return "holder unknown"
    import psutil

    try:
        proc = psutil.Process(pid)
        return f"held by pid {pid} ({proc.status()}, parent {proc.ppid()}: {' '.join(proc.cmdline()[:3])[:120]})"
    except psutil.Error:
        return f"held by pid {pid}, which is gone"


@contextlib.contextmanager
def variant_lock(lock_path: str, label: str, timeout: float | None = None) -> Iterator[bool]:
    """Hold the build lock at ``lock_path`` for the block; yields whether it is held. After ``timeout``
    (default ``default_timeout()``) it yields False: the block builds without it."""
    from filelock import FileLock, Timeout  # here: a process that never builds does not import it

    timeout = default_timeout() if timeout is None else timeout
    lock = FileLock(lock_path, timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        log.warning("%s: its build lock %s was not free after %.0fs (%s); building it here without the lock "
                    "(JIT_AHEAD_WAIT_TIMEOUT_S)", label, lock_path, timeout, holder(lock_path))
        held = False
    else:
        held = True
    if not held:
        yield False
        return
    try:
        try:
            with open(lock_path + ".owner", "w", encoding="ascii") as f:
                f.write(f"{os.getpid()}\n")
        except OSError:  # the lock still works; only the line naming a holder loses its pid
            pass
        yield True
    finally:
        lock.release()
