"""The one ``jit_cache_hook`` jit_ahead installs, shared by planning (capture) and the executor.

Triton calls it on every in-memory miss, in the launching thread, before the disk lookup. In a thread
that is capturing (a ContextVar) it records the request and returns True, which makes Triton skip both
the compile and the launch. Everywhere else it hands the miss to the executor side and returns None:
a real launch is never skipped. Any hook installed before ours, or set by another tool while ours holds
the slot (``hook_slot``), is chained and called first.
"""
from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable

from ..core.building.executor import JitAfterReadyError
from ..core.shared_patch import SharedPatch
from . import compat, hook_slot

log = logging.getLogger("jit_ahead.triton")

# The capture collector of the current thread/context; None outside planning.
capturing: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_triton_capture", default=None)

MissHandler = Callable[..., None]

_previous = None  # the hook that held Triton's slot before ours: called first
# set while ours calls the previous hook: a hook over ours that chains ours must not loop back into it
_calling_previous: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_triton_previous", default=False)


def _put_in_slot() -> None:
    """Ours over whatever holds the slot, kept there (``hook_slot``): a hook set later goes below ours (a
    hook that calls ours is no loop: see ``_calling_previous``)."""
    global _previous
    compat.patch_specialization_serializer()
    current = hook_slot.read()
    if current is not jit_cache_hook:
        _previous = current
        hook_slot.occupy(jit_cache_hook, below=_put_below)


def _put_below(hook) -> None:
    """Another tool set the slot while ours held it: ours calls that hook first (None: no hook below)."""
    global _previous
    if hook is not jit_cache_hook:
        _previous = hook


def _take_out_of_slot() -> None:
    """Give the slot back: to the hook below ours (the one it found, or one set while ours held it)."""
    global _previous
    if hook_slot.read() is jit_cache_hook:
        hook_slot.vacate(jit_cache_hook, _previous)
        _previous = None
        compat.restore_specialization_serializer()


_patch: SharedPatch[MissHandler] = SharedPatch(_put_in_slot, _take_out_of_slot)


def jit_cache_hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled, **kwargs):
    collector = capturing.get()
    if collector is not None:
        collector.record(fn=fn, compile=compile)
        return True
    previous = _previous
    if previous is not None:
        if _calling_previous.get():
            return None  # reached again through a hook that chains ours: the outer call handles the miss
        token = _calling_previous.set(True)
        try:
            vetoed = previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                              already_compiled=already_compiled, **kwargs)
        finally:
            _calling_previous.reset(token)
        if vetoed:
            return vetoed  # the other hook's own capture: no build, no launch
    handler = _patch.handler
    if handler is not None:
        try:
            handler(fn=fn, compile=compile)
        except JitAfterReadyError:  # JIT_AHEAD_MODE=error: the engine asked for this launch to fail
            raise
        except Exception:  # never break a launch: Triton's normal path compiles it
            log.exception("jit_ahead miss handling failed for %s; Triton compiles it in place", fn.name)
    return None


def install(miss_handler: MissHandler | None = None) -> None:
    """Hold the hook in Triton's slot (chaining any previous one; put back where another hook replaced it):
    a family holds it with its executor's miss handler, a capture without one. ``release`` with the same
    argument lets go; the last to let go gives the slot back."""
    _patch.hold(miss_handler)


def release(miss_handler: MissHandler | None = None) -> None:
    _patch.let_go(miss_handler)
