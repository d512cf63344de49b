"""From a real ``cute.compile`` call to its build request, and planning by capture.

The request is taken from the call itself: the ``@cute.jit`` function (module and qualified name, which
must resolve to the very object called, so a helper builds the same code), the specs of its arguments,
the options string, and the arch of the server's GPU (its device view). Nothing is compiled to find it.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Iterator

from ..core import device_view
from . import hook, library_cache
from .arch import arch_of
from .build import make_request, resolve
from .library_cache import LibraryCacheRequest
from .request import CuteCompileRequest
from .spec import UnsupportedCall, specs_of


def request_from_call(compile_callable, func, args, kwargs, arch: str) -> CuteCompileRequest:
    """The build request of ``cute.compile(func, *args, **kwargs)``; UnsupportedCall says why there is none."""
    import cutlass.cute as cute

    if compile_callable is not cute.compile:
        raise UnsupportedCall("cute.compile[...] with bracket options is compiled in place")
    extra = set(kwargs) - {"options"}
    if extra:
        raise UnsupportedCall(f"cute.compile keyword(s) {', '.join(sorted(extra))} are compiled in place")
    options = kwargs.get("options") or ""
    if not isinstance(options, str):
        raise UnsupportedCall("options other than a string are compiled in place")
    if not inspect.isfunction(func):
        raise UnsupportedCall(f"{type(func).__qualname__} is not a module-level @cute.jit function")
    module, qualname = func.__module__, func.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        raise UnsupportedCall(f"{module}.{qualname} cannot be imported by a helper")
    try:
        same = resolve(module, qualname) is func
    except (ImportError, AttributeError):
        same = False
    if not same:
        raise UnsupportedCall(f"{module}.{qualname} does not name the function called")
    return make_request(module, qualname, specs_of(args), arch=arch, options=options)


class Capture:
    """The requests captured in one planning context (``cute.compile`` calls and calls of a library's
    cached compile functions), deduplicated by artifact key, in first-seen order."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self._lock = threading.Lock()
        self._requests: dict[str, CuteCompileRequest | LibraryCacheRequest] = {}
        self.seconds = 0.0

    def record(self, compile_callable, func, args, kwargs) -> CuteCompileRequest:
        return self.add(request_from_call(compile_callable, func, args, kwargs, self.arch))

    def add(self, request):
        with self._lock:
            self._requests.setdefault(request.key, request)
        return request

    @property
    def requests(self) -> list[CuteCompileRequest | LibraryCacheRequest]:
        with self._lock:
            return list(self._requests.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._requests)


@contextlib.contextmanager
def capture(arch: str | None = None) -> Iterator[Capture]:
    """Record the request of every ``cute.compile`` call, and of every gated library compile function,
    made in this context; nothing compiles."""
    hook.install()
    plan = Capture(arch or arch_of(device_view.current()))
    t0 = time.perf_counter()
    tokens = hook.capturing.set(plan), library_cache.capturing.set(plan)
    try:
        yield plan
    finally:
        hook.capturing.reset(tokens[0])
        library_cache.capturing.reset(tokens[1])
        plan.seconds += time.perf_counter() - t0
