"""The TileLang builder of helpers: one captured ``KernelCache.cached`` call, repeated with the same
PrimFunc and options, so TileLang lowers it, runs nvcc and publishes the entry into its own cache
(``TILELANG_CACHE_DIR``: staged, then renamed into place; the first writer wins). The request's key is
computed again here first, by this helper's TileLang: a different one (another TileLang version, platform
or environment) refuses the build, which would give the server nothing it looks for."""
from __future__ import annotations

import logging
import os
import time
import uuid

from ..core.building.shared_files import remove_entry
from .request import TileLangCompileRequest

CACHE_KNOB = "TILELANG_CACHE_DIR"

log = logging.getLogger("jit_ahead.tilelang")


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


def is_built(request: TileLangCompileRequest, cache=None) -> bool:
    """Whether the request's entry is there and whole by TileLang's own checks (those of ``cache``, the
    request's KernelCache, resolved here if not given). A damaged one (a file missing, or one that differs
    from its manifest's size or hash) is one line and is removed, so that it is built again: TileLang would
    otherwise find it at the server's compile, and compile there."""
    path = entry_path(request)
    if not os.path.isdir(path):
        return False
    why = damage(cache if cache is not None else _cache_of(request), path)
    if why is None:
        return True
    remove_entry(path, f"{path}.damaged-{uuid.uuid4().hex}")
    log.warning("TileLang cache entry %s (%s) is damaged (%s); removed, it is built again", path, request.label, why)
    return False


def damage(cache, path: str) -> str | None:
    """Why the entry at ``path`` is not one TileLang's ``cache`` loads: its checks of a complete entry (the
    files its backend writes) and of the manifest (each file's size, the binaries' hashes), or None."""
    missing = cache._get_missing_complete_cache_files(path)
    if missing:
        return "without " + ", ".join(sorted(os.path.basename(f) for f in missing))
    verify = getattr(cache, "_verify_cache_dir_integrity", None)  # TileLang's manifest check, where it has one
    if verify is not None and not verify(path):
        return "its files differ from its manifest"
    return None


def _cache_of(request: TileLangCompileRequest):
    """The KernelCache TileLang uses for the request's target and backend (the file names are its)."""
    from tilelang.cache import _resolve_cache_dispatch

    arguments = request.cached_arguments()
    cache, _, _ = _resolve_cache_dispatch(arguments["target"], arguments["target_host"], request.execution_backend, False)
    return cache


def build(request: TileLangCompileRequest) -> dict:
    import tvm

    from .hook import cached_unhooked
    from .request import request_for

    func = tvm.ir.load_json(request.func_json)
    arguments = request.cached_arguments()
    cache = _cache_of(request)  # TileLang's own choice
    out_idx = list(request.out_idx) if isinstance(request.out_idx, tuple) else request.out_idx
    again = request_for(cache, func, out_idx, request.args, backend_context=None, **arguments)
    if again.key != request.key:
        raise KeyMismatch(f"{request.label}: this TileLang keys it {again.key[:12]}, the server's "
                          f"{request.key[:12]} (another TileLang version, platform or environment); not built")
    if is_built(request, cache):
        return {"built": False, "path": entry_path(request)}
    # A helper forked from the server holds the server's in-memory kernels: one of them, here, would be
    # returned as it is, and nothing written for an entry that was damaged or removed since.
    cache._memory_cache.pop(request.key, None)
    cached_unhooked(cache, func, out_idx, *request.args, verbose=False, **arguments)
    if not is_built(request, cache):
        raise KeyMismatch(f"{request.label}: TileLang compiled it but wrote no entry at {entry_path(request)}")
    return {"built": True, "path": entry_path(request)}
