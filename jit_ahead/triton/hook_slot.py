"""Triton's one ``jit_cache_hook`` slot, kept for jit_ahead while it holds it.

Triton calls a single ``knobs.runtime.jit_cache_hook``. A tool that sets it after jit_ahead put its own
there, without calling what it replaced, would switch jit_ahead off in silence: a ``JIT_AHEAD=1`` session
that never starts (its first-compile hook replaced), or an executor that no longer sees misses and
compiles in the server what helpers are building. So while jit_ahead holds the slot, setting it puts
the new hook below jit_ahead's, which calls it first (as it calls any hook it found there), with one log
line; setting None takes that one out again. jit_ahead letting go, any process other than the one that
took the slot (a fork: helpers, planners) and any other ``runtime_knobs`` object see a plain attribute.

The value stays in the knobs object's ``__dict__``, as without the guard, where Triton's own
``knobs.runtime.scope()`` saves and restores it; only the class attribute becomes a property.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from triton import knobs

log = logging.getLogger("jit_ahead.triton")

NAME = "jit_cache_hook"


@dataclass(frozen=True)
class _Holder:
    hook: object
    below: Callable[[object], None]  # takes the hook another tool set (None: take it out)
    pid: int


_holder: _Holder | None = None


def read() -> object:
    """What is in the slot."""
    return knobs.runtime.__dict__.get(NAME, getattr(type(knobs.runtime), "_jit_ahead_default", None))


def occupy(hook: object, below: Callable[[object], None]) -> None:
    """Put ``hook`` in the slot and keep it there: a hook set later goes to ``below(hook)`` instead."""
    global _holder
    _guard_class()
    knobs.runtime.__dict__[NAME] = hook
    _holder = _Holder(hook, below, os.getpid())


def vacate(hook: object, value: object) -> None:
    """If ``hook`` is in the slot, put ``value`` there instead; the slot is a plain attribute again."""
    global _holder
    if _holder is not None and _holder.hook is hook:
        _holder = None
    if read() is hook:
        knobs.runtime.__dict__[NAME] = value


def _guard_class() -> None:
    cls = type(knobs.runtime)
    if isinstance(cls.__dict__.get(NAME), property):
        return
    cls._jit_ahead_default = cls.__dict__.get(NAME)  # Triton's class default (None)

    def get(self):
        return self.__dict__.get(NAME, cls._jit_ahead_default)

    def set_(self, value) -> None:
        holder = _holder
        if (holder is None or self is not knobs.runtime or holder.pid != os.getpid()
                or self.__dict__.get(NAME) is not holder.hook or value is holder.hook):
            self.__dict__[NAME] = value
            return
        if value is not None:
            log.warning("another tool set Triton's jit_cache_hook (%s); jit_ahead keeps its own in the slot and "
                        "calls that one first, as if it had been there before", _name(value))
        holder.below(value)

    def delete(self) -> None:
        set_(self, None)

    setattr(cls, NAME, property(get, set_, delete, "Triton's jit_cache_hook, kept for jit_ahead while it holds it"))


def _name(hook: object) -> str:
    module = getattr(hook, "__module__", None) or type(hook).__module__
    return f"{module}.{getattr(hook, '__qualname__', type(hook).__qualname__)}"
