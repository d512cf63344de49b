"""Planning by capture: inside ``with capture()``, a TileLang compile (a ``@tilelang.jit`` call,
``tilelang.compile``) is elaborated as usual (the factory runs and builds its PrimFunc, with whatever it
reads of the device) and then recorded as a request instead of being lowered and built: the call raises
``Captured``, so nothing of it is kept in TileLang's caches. Outside capturing contexts compiles are
untouched.

A model's forward stops at its first TileLang kernel under a capture; providers plan such kernels call by
call with ``plan_call(kernel, *args, **kwargs)``, or run a library's own op, which calls several kernels,
inside ``calls_go_on()``.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..core.shared_patch import VariantsFound, capturing_into
from ..core.thread_patch import patched_in_this_thread
from . import hook
from .hook import Captured
from .request import TileLangCompileRequest

__all__ = ["Capture", "Captured", "calls_go_on", "capture", "plan_call", "planned_call"]


class Capture(VariantsFound):
    """The requests of one capture, in first-seen order, each once."""

    def __init__(self) -> None:
        super().__init__()
        # ``@tilelang.jit`` calls met under ``calls_go_on``, by factory and TileLang's own call key
        self.calls_met: set[tuple] = set()


@contextlib.contextmanager
def capture(target=None) -> Iterator[Capture]:
    """Record the TileLang compiles of this context as requests; each compile raises ``Captured``.
    ``target`` is unused: a TileLang call names its target, or TileLang resolves its default."""
    with capturing_into(hook, Capture()) as plan:
        yield plan


def plan_call(kernel, *args, **kwargs) -> TileLangCompileRequest:
    """The request one call of a TileLang kernel factory (``@tilelang.jit``) or of ``tilelang.compile``
    would compile. LookupError if the call compiles nothing (this process has that kernel already)."""
    with capture():
        try:
            kernel(*args, **kwargs)
        except Captured as captured:
            return captured.request
    raise LookupError(f"{getattr(kernel, '__name__', kernel)!r} compiled nothing here: this process has it already")


def planned_call(kernel, *args, **kwargs) -> None:
    """One call of a TileLang kernel inside the capture the caller runs it in (a provider's planned launch):
    the capture records what it compiles; nothing is returned, and a kernel this process has already is no
    error."""
    try:
        kernel(*args, **kwargs)
    except Captured:
        pass


@contextlib.contextmanager
def calls_go_on() -> Iterator[None]:
    """Inside a capture, for this thread: a ``@tilelang.jit`` kernel call that would compile records its
    request and, instead of raising, returns None (an eager-mode kernel: its launch's result) or a kernel
    that launches nothing (a lazy-mode factory), so a library op that calls several kernels (with outputs
    it allocated itself) goes on to the next one. A call whose TileLang call key (what the factory's own
    in-memory cache is keyed by) the capture has met, or that this process has compiled already, returns
    the same at once: elaborating the same kernel again would cost as much as the first time."""
    from tilelang.jit import JITImpl

    with patched_in_this_thread(JITImpl, "__call__", _going_on):
        yield


def _going_on(original, impl, *args, **kwargs):
    plan = hook.capturing.get()
    if plan is None or any(name.startswith("__") for name in kwargs):  # tuning and compile-argument queries
        return original(impl, *args, **kwargs)
    if impl.mode == "auto":  # what JITImpl.__call__ settles first: its call key depends on the mode
        impl.mode = impl._infer_jit_mode(*args, **kwargs)
        impl.func.set_mode(impl.mode)
    key = impl.func.parse_args(*args, **kwargs)[0]
    met = (id(impl), key)
    not_built = None if impl.mode == "eager" else _launches_nothing
    if met in plan.calls_met or key in impl._kernel_cache:
        return not_built
    plan.calls_met.add(met)
    try:
        return original(impl, *args, **kwargs)
    except Captured:
        return not_built


def _launches_nothing(*args, **kwargs) -> None:
    """What a lazy-mode factory call returns under ``calls_go_on`` for a kernel it did not build."""
    return None
