"""Wrapping a library function, or setting a value, for the calling thread only.

Providers learn what a model calls by wrapping a library function for the length of one probe forward
(Liger's ``rope_forward``, ``torch.autograd.Function.apply``); TileLang planning lets a library op go on
past the kernels it captures (``tilelang.plan.calls_go_on``). Models are planned in threads of their
own, so two probes can overlap, and the server's threads call the same functions meanwhile. Swapping the
attribute and putting back what was found breaks as soon as two swaps overlap: whichever ends first puts
back the other's state, and the later probe then sees nothing. Here the attribute is replaced once by a
dispatcher while any thread needs it; each call goes through the wrappers of the thread making it (none
for every other thread), and the attribute is restored when the last user leaves.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .processes import fork_safe_lock

# ``wrapper(original, *args, **kwargs)``: calls ``original(*args, **kwargs)`` itself (for a classmethod,
# ``args`` begins with the class)
Wrapper = Callable[..., Any]

_lock = fork_safe_lock()


class _Patch:
    """One attribute replaced by a dispatcher; ``chains[thread]`` are that thread's wrappers, innermost
    last."""

    def __init__(self, owner: object, name: str) -> None:
        self.stored = vars(owner)[name]
        self.chains: dict[int, list[Wrapper]] = {}
        if isinstance(self.stored, classmethod):
            function = self.stored.__func__

            def dispatch_class(cls, *args, **kwargs):
                return self.call(function, (cls, *args), kwargs)

            self.installed: Any = classmethod(dispatch_class)
        else:
            function = self.stored

            def dispatch(*args, **kwargs):
                return self.call(function, args, kwargs)

            self.installed = dispatch

    def call(self, function: Callable, args: tuple, kwargs: dict):
        chain = self.chains.get(threading.get_ident())
        if not chain:
            return function(*args, **kwargs)
        return _through(tuple(chain), function, args, kwargs)


def _through(chain: tuple[Wrapper, ...], function: Callable, args: tuple, kwargs: dict):
    if not chain:
        return function(*args, **kwargs)
    *outer, inner = chain
    return inner(lambda *a, **k: _through(tuple(outer), function, a, k), *args, **kwargs)


_patches: dict[tuple[int, str], _Patch] = {}


@contextlib.contextmanager
def patched_in_this_thread(owner: object, name: str, wrapper: Wrapper) -> Iterator[None]:
    """Within the block, this thread's calls of ``owner.name`` (an attribute ``owner`` defines itself: a
    module's function or a class's method or classmethod) go through ``wrapper``; other threads' calls
    do not, whatever blocks they are in themselves."""
    key = (id(owner), name)
    me = threading.get_ident()
    with _lock:
        patch = _patches.get(key)
        if patch is None:
            patch = _patches[key] = _Patch(owner, name)
            setattr(owner, name, patch.installed)
        patch.chains.setdefault(me, []).append(wrapper)
    try:
        yield
    finally:
        with _lock:
            chain = patch.chains.get(me, [])
            if wrapper in chain:
                chain.remove(wrapper)
            if not chain:
                patch.chains.pop(me, None)
            if not patch.chains and _patches.get(key) is patch:
                del _patches[key]
                # someone who replaced it after us calls our dispatcher, which now passes calls through
                if vars(owner).get(name) is patch.installed:
                    setattr(owner, name, patch.stored)


def _forget_other_threads() -> None:
    """In a forked child only the forking thread exists; a new thread there could get the id of one that
    was probing in the parent and run through its wrappers."""
    me = threading.get_ident()
    for patch in _patches.values():
        for thread in [t for t in patch.chains if t != me]:
            del patch.chains[thread]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_other_threads)


@contextlib.contextmanager
def set_in_this_thread(local: threading.local, name: str, value: Any) -> Iterator[None]:
    """Within the block, ``local.name`` is ``value`` in this thread; afterwards it is what it was (absent
    reads as None), so blocks nest."""
    before = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, before)
