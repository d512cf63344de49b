"""The TileLang builder of helpers: one captured ``KernelCache.cached`` call, repeated with the same
PrimFunc and options, so TileLang lowers it, runs nvcc and publishes the entry into its own cache
(``TILELANG_CACHE_DIR``: staged, then renamed into place; the first writer wins). The request's key is
computed again here first, by this helper's TileLang: a different one (another TileLang version, platform
or environment) refuses the build, which would give the server nothing it looks for."""
from __future__ import annotations

import os
import time

from .request import TileLangCompileRequest

CACHE_KNOB = "TILELANG_CACHE_DIR"


class KeyMismatch(RuntimeError):
    pass


def prepare(view=None) -> dict:
    """Import TileLang once per helper (TVM's libraries are most of a first build's cost). The request
    names its target: the helper needs no device view."""
    t0 = time.perf_counter()
    import tilelang

    return {"tilelang": tilelang.__version__, "cache": entry_root(), "warmup_seconds": round(time.perf_counter() - t0, 3)}


def entry_root() -> str:
    from tilelang.cache.kernel_cache import KernelCache

    return KernelCache._get_cache_root()


def entry_path(request: TileLangCompileRequest) -> str:
    return os.path.join(entry_root(), request.key)


def is_built(request: TileLangCompileRequest) -> bool:
    return os.path.isfile(os.path.join(entry_path(request), "manifest.json"))


def build(request: TileLangCompileRequest) -> dict:
    import tvm
    from tilelang.cache import _resolve_cache_dispatch

    from .hook import cached_unhooked
    from .request import request_for

    func = tvm.ir.load_json(request.func_json)
    arguments = request.cached_arguments()
    cache, _, _ = _resolve_cache_dispatch(arguments["target"], arguments["target_host"],
                                          request.execution_backend, False)  # TileLang's own choice
    out_idx = list(request.out_idx) if isinstance(request.out_idx, tuple) else request.out_idx
    again = request_for(cache, func, out_idx, request.args, backend_context=None, **arguments)
    if again.key != request.key:
        raise KeyMismatch(f"{request.label}: this TileLang keys it {again.key[:12]}, the server's "
                          f"{request.key[:12]} (another TileLang version, platform or environment); not built")
    if is_built(request):
        return {"built": False, "path": entry_path(request)}
    cached_unhooked(cache, func, out_idx, *request.args, verbose=False, **arguments)
    if not is_built(request):
        raise KeyMismatch(f"{request.label}: TileLang compiled it but wrote no entry at {entry_path(request)}")
    return {"built": True, "path": entry_path(request)}
