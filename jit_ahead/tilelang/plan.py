"""Planning by capture: inside ``with capture()``, a TileLang compile (a ``@tilelang.jit`` call,
``tilelang.compile``) is elaborated as usual (the factory runs and builds its PrimFunc, with whatever it
reads of the device) and then recorded as a request instead of being lowered and built: the call raises
``Captured``, so nothing of it is kept in TileLang's caches. Outside capturing contexts compiles are
untouched.

A model's forward stops at its first TileLang kernel under a capture; providers plan such kernels call by
call with ``plan_call(kernel, *args, **kwargs)``.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..core.shared_patch import capturing_into
from . import hook
from .hook import Captured
from .request import TileLangCompileRequest

__all__ = ["Capture", "Captured", "capture", "plan_call", "planned_call"]


class Capture:
    """The requests of one capture, in first-seen order, each once."""

    def __init__(self) -> None:
        self.requests: list[TileLangCompileRequest] = []
        self._keys: set[str] = set()

    def record(self, request: TileLangCompileRequest) -> None:
        if request.key not in self._keys:
            self._keys.add(request.key)
            self.requests.append(request)


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
