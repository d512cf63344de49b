"""Imports that another thread was running when this process was forked.

A fork copies every module lock of the import system but only the thread that forked. A module that
another thread was importing at that moment stays in ``sys.modules`` half executed, its lock held by
a thread that does not exist here: the first import of it in the child waits forever. A server that
starts jit_ahead at ``import triton`` goes on importing its engine while the pool forks the fork server
from it, and a helper that then imports a kernel's module to build it hangs until its build timeout.

``forget_unfinished_imports`` (run first thing in a forked child) drops such modules and their locks,
so that the child imports them afresh. Modules the forking thread itself is importing are kept: that
thread is this process's and finishes them. It uses importlib's private bookkeeping (``_module_locks``,
``_blocking_on``), the same in CPython 3.11 and 3.12; where that is missing it does nothing.
"""
from __future__ import annotations

import sys
import threading

try:
    from importlib import _bootstrap
except ImportError:  # pragma: no cover - every CPython has it
    _bootstrap = None


def _held(lock) -> bool:
    count = getattr(lock, "count", 0)
    return (len(count) if isinstance(count, list) else count) > 0  # 3.12 keeps a list, 3.11 an int


def forget_unfinished_imports() -> list[str]:
    """Drop the modules other threads were importing at the fork; returns their names."""
    locks = getattr(_bootstrap, "_module_locks", None)
    if not isinstance(locks, dict):
        return []
    me = threading.get_ident()  # a forked child's one thread has the forking thread's ident
    dropped = []
    for name, ref in list(locks.items()):
        lock = ref() if callable(ref) else None
        if lock is None or not _held(lock) or getattr(lock, "owner", None) in (None, me):
            continue
        locks.pop(name, None)
        module = sys.modules.get(name)
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            del sys.modules[name]
        dropped.append(name)
    # What the dead threads were waiting for would confuse deadlock detection should a new thread get
    # one of their idents: 3.11 keeps a dict, 3.12 a weak-value mapping over a ``data`` dict.
    blocking = getattr(_bootstrap, "_blocking_on", None)
    waits = blocking if isinstance(blocking, dict) else getattr(blocking, "data", None)
    if isinstance(waits, dict):
        for tid in [t for t in list(waits) if t != me]:
            waits.pop(tid, None)
    return dropped
