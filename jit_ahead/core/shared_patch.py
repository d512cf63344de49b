"""A process-wide patch of a DSL (its compile hook) that is in place while anyone holds it.

A family holds it from its start to its close, with its handler (the executor's miss handling); planning
holds it for each capture, without one. The last holder to let go puts the DSL back as it was, so nothing
of a closed session stays in the DSL. One handler at a time: the latest holder's."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .processes import fork_safe_lock

H = TypeVar("H")


class SharedPatch(Generic[H]):
    """``apply()`` runs at every hold (it does nothing where the patch is in place, and puts it back where
    someone replaced it meanwhile), ``restore()`` when the last holder leaves; both under this patch's
    lock. ``restore`` must leave alone a slot someone else has taken over since."""

    def __init__(self, apply: Callable[[], None], restore: Callable[[], None]) -> None:
        self._apply = apply
        self._restore = restore
        self._lock = fork_safe_lock()
        self._holders = 0
        self.handler: H | None = None

    def hold(self, handler: H | None = None) -> None:
        with self._lock:
            self._apply()
            self._holders += 1
            if handler is not None:
                self.handler = handler

    def let_go(self, handler: H | None = None) -> None:
        """One holder leaves (with the handler it held by, if any). Extra calls are ignored."""
        with self._lock:
            if handler is not None and self.handler is handler:
                self.handler = None
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders == 0:
                self.handler = None
                self._restore()


def swap_in(owner: object, name: str, replacement: object, original: object) -> object:
    """Put ``replacement`` at ``owner.name``; returns the original to call from it: the attribute found the
    first time (``original`` is what an earlier swap kept). Left alone where ``replacement`` is there, or
    under a wrapper that names it (``__wrapped__``). Another wrapper set since an earlier swap is set aside,
    not called: it may call ``replacement``, which would call it again."""
    current = getattr(owner, name)
    if _reaches(current, replacement):
        return original
    setattr(owner, name, replacement)
    return current if original is None else original


def _reaches(function: object, target: object) -> bool:
    seen = 0
    while function is not None and seen < 32:
        if function is target:
            return True
        function, seen = getattr(function, "__wrapped__", None), seen + 1
    return False


def swap_out(owner: object, name: str, replacement: object, original: object) -> None:
    """Put ``original`` back where ``replacement`` still is (one set over it since stays)."""
    if getattr(owner, name) is replacement:
        setattr(owner, name, original)


class AttributeHook:
    """The hook of a DSL that offers a handler slot of its own (``owner.name``, None when unset): a
    family's ``hook``. ``release`` empties the slot only while it still holds the handler released."""

    def __init__(self, owner: object, name: str) -> None:
        self.owner, self.name = owner, name

    def install(self, handler: Callable) -> None:
        setattr(self.owner, self.name, handler)

    def release(self, handler: Callable) -> None:
        if getattr(self.owner, self.name, None) == handler:
            setattr(self.owner, self.name, None)


class VariantsFound:
    """What one capture found: each variant its hook ``record``s, once (by key), in first-seen order."""

    def __init__(self) -> None:
        self.requests: list = []
        self._keys: set[str] = set()

    def record(self, request) -> None:
        if request.key not in self._keys:
            self._keys.add(request.key)
            self.requests.append(request)


@contextlib.contextmanager
def capturing_into(hook, plan: object) -> Iterator[object]:
    """A capture's hold of a DSL's hook (its module's ``install``/``release``, without a handler), with the
    hook's ``capturing`` context variable set to ``plan`` in this context: the hook's calls here note what
    they would compile in ``plan`` instead."""
    hook.install()
    try:
        token = hook.capturing.set(plan)
        try:
            yield plan
        finally:
            hook.capturing.reset(token)
    finally:
        hook.release()
