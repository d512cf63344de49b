"""Planning by capture: inside ``with capture()``, ``cute.compile`` calls (and calls of a library's gated
compile function) are turned into build requests (``call.py``) instead of compiles."""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from ..core import device_view
from ..core.shared_patch import capturing_into
from . import hook, library_cache
from .arch import arch_of
from .call import request_from_call
from .library_cache import LibraryCacheRequest
from .request import CuteCompileRequest


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
    plan = Capture(arch or arch_of(device_view.current()))
    t0 = time.perf_counter()
    with capturing_into(hook, plan):
        token = library_cache.capturing.set(plan)
        try:
            yield plan
        finally:
            library_cache.capturing.reset(token)
            plan.seconds += time.perf_counter() - t0
