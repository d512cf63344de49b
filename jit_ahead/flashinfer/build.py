"""The FlashInfer builder of helpers: one module's spec, made again from the request and built with
FlashInfer's own ``JitSpec.build`` (its ninja file, nvcc) under FlashInfer's per-module file lock, the one
its own builds in the server take, then stamped with the request's key. A helper killed mid-build leaves no
stamp, so a library it may have left half-written is not taken as built, and is built again."""
from __future__ import annotations

import os
import time

from ..core.building.shared_files import write_json
from .request import STAMP, FlashInferModule


class JitDirMismatch(RuntimeError):
    pass


def prepare(view=None) -> dict:
    """Import FlashInfer once per helper; its JIT folder follows its version and the target archs
    (``FLASHINFER_CUDA_ARCH_LIST``, set by the family)."""
    t0 = time.perf_counter()
    import flashinfer
    from flashinfer.jit import env

    return {"flashinfer": flashinfer.__version__, "jit_dir": str(env.FLASHINFER_JIT_DIR),
            "warmup_seconds": round(time.perf_counter() - t0, 3)}


def build(request: FlashInferModule) -> dict:
    from flashinfer.jit import env

    if str(env.FLASHINFER_JIT_DIR) != request.jit_dir:  # another version, arch list or workspace here
        raise JitDirMismatch(f"{request.label}: this helper's FlashInfer builds into {env.FLASHINFER_JIT_DIR}, "
                             f"the server loads from {request.jit_dir}")
    stamp = os.path.join(request.folder, STAMP)
    if os.path.exists(stamp):  # an earlier build's: it must not vouch for the one that follows
        os.unlink(stamp)
    from filelock import FileLock

    t0 = time.perf_counter()
    spec = request.spec()
    with FileLock(spec.lock_path, thread_local=False):  # FlashInfer's own lock of the module, as its builds take it
        spec.build(verbose=False, need_lock=False)
    write_json(request.folder, STAMP, {"key": request.key, "name": request.name, "version": request.version})
    return {"path": request.library, "compiled": True, "seconds": round(time.perf_counter() - t0, 3)}
