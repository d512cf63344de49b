"""The one place jit_ahead enters TileLang: ``KernelCache.cached``, which every TileLang compile goes
through (``@tilelang.jit`` calls, ``tilelang.compile``, the autotuner), after elaboration and before the
cache's own lookups; and ``JITImpl.compile``, only to learn which ``@tilelang.jit`` factory a PrimFunc came
from.

While held, ``cached`` gets its ``out_idx`` in the legal form TileLang's adapter would make of it (see
``request.legal_out_idx``), so keys do not depend on what the process compiled before. In a thread that
is capturing (a ContextVar) a compile becomes a request and raises ``Captured``. Elsewhere the executor's
handler decides: TileLang finds the entry on disk, waits for the helper building it, or builds it in
place; any trouble there and TileLang compiles as it would without jit_ahead.
"""
from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable

from ..core.building.executor import JitAfterReadyError
from ..core.shared_patch import SharedPatch, swap_in, swap_out
from .request import TileLangCompileRequest, legal_out_idx, request_for

log = logging.getLogger("jit_ahead.tilelang")

capturing: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_tilelang_capture", default=None)
_factory: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_tilelang_factory", default=None)

# handler(describe, in_place) -> the kernel: describe() gives the request, in_place() is TileLang's own call
Handler = Callable[..., object]

_original_cached = None
_original_compile = None


class Captured(Exception):
    """Raised from a TileLang compile inside a capture once its request is recorded: TileLang returns no
    kernel for it, and keeps none in its caches."""

    def __init__(self, request: TileLangCompileRequest) -> None:
        super().__init__(f"captured {request.label} (jit_ahead planning: nothing was compiled)")
        self.request = request


def _cached(self, func=None, out_idx=None, *args, target=None, target_host=None, execution_backend=None,
            verbose=None, pass_configs=None, compile_flags=None, backend_context=None):
    out_idx = legal_out_idx(func, out_idx)
    options = dict(target=target, target_host=target_host, execution_backend=execution_backend,
                   pass_configs=pass_configs, compile_flags=compile_flags, backend_context=backend_context)

    def describe() -> TileLangCompileRequest:
        factory = _factory.get()
        return request_for(self, func, out_idx, args, factory=factory, **options)

    def in_place():
        return _original_cached(self, func, out_idx, *args, verbose=verbose, **options)

    collector = capturing.get()
    if collector is not None:
        request = describe()
        collector.record(request)
        raise Captured(request)
    handler = _patch.handler
    if handler is None:
        return in_place()
    compiled = False

    def in_place_once():
        nonlocal compiled
        compiled = True
        return in_place()

    try:
        return handler(self, describe, in_place_once)
    except JitAfterReadyError:  # JIT_AHEAD_MODE=error: the engine asked for this compile to fail
        raise
    except Exception:  # never break the caller: TileLang compiles it as it would without jit_ahead
        if compiled:  # it did, and failed: its error is the caller's, and a second try would fail alike
            raise
        log.exception("jit_ahead could not handle a TileLang compile; TileLang compiles it in place")
        return in_place()


def _compile(self, *args, **kwargs):
    token = _factory.set(getattr(self.func, "orig_func", None))
    try:
        return _original_compile(self, *args, **kwargs)
    finally:
        _factory.reset(token)


def _patch_dsl() -> None:
    global _original_cached, _original_compile
    from tilelang.cache.kernel_cache import KernelCache
    from tilelang.jit import JITImpl

    _original_cached = swap_in(KernelCache, "cached", _cached, _original_cached)
    _original_compile = swap_in(JITImpl, "compile", _compile, _original_compile)


def _unpatch_dsl() -> None:
    from tilelang.cache.kernel_cache import KernelCache
    from tilelang.jit import JITImpl

    swap_out(KernelCache, "cached", _cached, _original_cached)
    swap_out(JITImpl, "compile", _compile, _original_compile)


_patch: SharedPatch[Handler] = SharedPatch(_patch_dsl, _unpatch_dsl)


def install(handler: Handler | None = None) -> None:
    """Hold TileLang patched: the family with its executor's handler, a capture without one. ``release``
    with the same argument lets go; the last to let go puts TileLang's own functions back."""
    _patch.hold(handler)


def release(handler: Handler | None = None) -> None:
    _patch.let_go(handler)


def forget_handler() -> None:
    """In a process forked from the server: its executor's handler stays behind (the patch stays held)."""
    _patch.handler = None


def cached_unhooked(cache, func, out_idx, *args, **options):
    """``KernelCache.cached`` as TileLang defines it: what a build itself calls."""
    method = _original_cached if _original_cached is not None else type(cache).cached
    return method(cache, func, out_idx, *args, **options)
