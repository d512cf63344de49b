"""Putting off a ``JIT_AHEAD=1`` session until Triton first compiles in the process.

A process that imports Triton and never launches an uncached kernel (a tool, a test collector, a script that
only reads a config) should pay nothing for jit_ahead. Until then, a small function sits in Triton's
``jit_cache_hook`` slot: Triton calls it on the first in-memory miss, before any lookup or compile; it puts
the slot back, starts the session (whose own hook takes the slot, chaining what was there) and hands the
call on to it. A hook another tool sets meanwhile goes below it (``hook_slot``) and is what the slot gets
back. Imports nothing of jit_ahead's core.
"""
from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

from triton import knobs

from . import compat, hook_slot

_lock = threading.Lock()  # concurrent first misses: one starts the session, the others wait for it
# set while the first miss is handed on: a hook put over this one that calls it must not loop back into it
_handing_on: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_first_use", default=False)


def arm(start: Callable[[], object]) -> Callable[[], None]:
    """Call ``start()`` at Triton's first in-memory miss in this process; returns ``disarm()``, which puts
    the slot back (when the session starts some other way) and does nothing once the miss came."""
    below = hook_slot.read()  # what was there, or what another tool set since: put back by disarm()
    # Triton 3.6 cannot serialize some launches' specializations for any hook, this one included
    compat.patch_specialization_serializer()
    fired = False

    def put_below(hook) -> None:
        nonlocal below
        if hook is not first_miss:
            below = hook

    def disarm() -> None:
        if hook_slot.read() is first_miss:
            hook_slot.vacate(first_miss, below)
            if below is None:
                compat.restore_specialization_serializer()

    def first_miss(**kwargs):
        nonlocal fired
        if _handing_on.get():
            return None  # reached again through a hook over this one: the outer call hands the miss on
        with _lock:
            if not fired:  # in the slot, or below a hook another tool put over it
                fired = True
                disarm()
                start()  # never raises: a session that cannot start leaves the process without jit_ahead
        hook = knobs.runtime.jit_cache_hook  # the session's, chaining what was there; else what was there
        if hook is None or hook is first_miss:
            return None
        token = _handing_on.set(True)
        try:
            return hook(**kwargs)
        finally:
            _handing_on.reset(token)

    hook_slot.occupy(first_miss, below=put_below)  # a tool setting the slot later cannot turn jit_ahead off
    return disarm
