"""Building: the Triton family's builder, run in helpers (``prepare``/``build``) and in place on the executor.

A build rebuilds the request through Triton's own ``compile()`` for the request's explicit target; the
cache manager publishes it atomically (group file written last). The result's hash must equal the hash
predicted in the launching process, otherwise the launch would miss it: a mismatch fails the request
with both hashes in the error. A per-variant file lock makes the ranks of one node build it once; waiting for it is bounded
(``core.build_lock``).
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import time

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget

from ..core.building.build_lock import variant_lock
from ..core.device_view import DeviceView
from . import cache_check
from .request import TritonCompileRequest
from .compile_inputs import compile_inputs, resolve_kernel, spec_json
from .standin import install_stand_in


log = logging.getLogger("jit_ahead.triton.build")


class HashMismatch(RuntimeError):
    pass


def _lock_path(predicted_hash: str) -> str:
    folder = os.path.join(knobs.cache.dir, "jit_ahead_locks")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{predicted_hash}.lock")


def compile_request(request: TritonCompileRequest) -> tuple[triton.compiler.CompiledKernel, bool]:
    """Compile (or find on disk) exactly the requested variant, and whether it was found: on disk before
    this compile, under its lock (another process built it first). Raise HashMismatch if it lands
    elsewhere."""
    kernel = resolve_kernel(request.module, request.qualname)
    src, options = compile_inputs(kernel, spec_json(request.specialization_data))
    with variant_lock(_lock_path(request.predicted_hash), request.label):
        entry, _ = cache_check.check(request.predicted_hash, request.name, request.target[1], thorough=False)
        found = entry is cache_check.Entry.OK
        compiled = triton.compile(src, target=GPUTarget(*request.target), options=options)
        if compiled.hash == request.predicted_hash:
            try:  # what the executor checks the entry against before it loads it (cache_check)
                cache_check.write_manifest(compiled.hash, request.name)
            except (OSError, ValueError) as exc:
                log.warning("%s: no manifest for its cache entry (%s); it is checked without one", request.label, exc)
    if compiled.hash != request.predicted_hash:
        raise HashMismatch(
            f"{request.label}: Triton built hash {compiled.hash} but the launching process predicted "
            f"{request.predicted_hash}; the executor would miss this build. The helper and the server differ "
            "in kernel source, Triton install, Python ABI, options or cache-invalidating environment.")
    return compiled, found


def _apply_env(env: tuple[tuple[str, str], ...]) -> None:
    """Make this helper's cache-invalidating environment exactly the launching process's."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    wanted = dict(env)
    for name in list(get_cache_invalidating_env_vars()):
        if name not in wanted:
            os.environ.pop(name, None)
    os.environ.update(wanted)
    actual = dict(get_cache_invalidating_env_vars())
    if actual != wanted:
        raise RuntimeError(f"cannot reproduce the cache-invalidating environment {wanted}; helper has {actual}")


def host_launcher_is_per_signature() -> bool:
    """Triton 3.6 gcc-builds a host launcher per signature on first launch; 3.9 has a generic one."""
    from triton.backends.nvidia import driver as nvidia_driver

    return "compile_module_from_src" in nvidia_driver.CudaLauncher.__init__.__code__.co_names


def prebuild_host_launcher(compiled) -> str:
    """Build 3.6's per-signature launcher .so into Triton's cache, so the first launch skips gcc.

    It links against libcuda.so.1, so this works on the GPU host (even with no GPU visible) and is
    skipped on a machine without the driver library.
    """
    if compiled.metadata.target.backend != "cuda" or not host_launcher_is_per_signature():
        return "not needed"
    from triton.backends.nvidia import driver as nvidia_driver

    missing = _libcuda_missing()
    if missing:
        return f"skipped: {missing}"
    nvidia_driver.CudaLauncher(compiled.src, compiled.metadata)
    return "built"


@functools.lru_cache(maxsize=1)
def _libcuda_missing() -> str | None:
    """Why the launcher cannot be linked here, or None. Cached: Triton's probe runs ldconfig each time."""
    from triton.backends.nvidia import driver as nvidia_driver

    try:
        nvidia_driver.library_dirs()
        return None
    except (AssertionError, OSError, FileNotFoundError) as exc:
        return str(exc).splitlines()[0]


# -- the builder interface the helper worker calls ------------------------------------------------------------
def prepare(view: DeviceView | None = None) -> dict:
    """Show kernel libraries the server's GPU (a stand-in driver with its target and properties), then pay
    the fixed costs before saying ready: Triton's import, triton_key() and the ptxas version."""
    from triton.compiler import make_backend
    from triton.runtime.cache import triton_key

    if view is not None:
        install_stand_in(view)
    # A helper only compiles: in a fork of the server, its executor hook and compilation listener would
    # report this process's compiles as the server's.
    knobs.runtime.jit_cache_hook = None
    knobs.compilation.listener = None
    t0 = time.perf_counter()
    triton_key()
    make_backend(triton.runtime.driver.active.get_current_target() if view else GPUTarget("cuda", 90, 32)).hash()
    return {"triton": triton.__version__, "python": sys.version.split()[0], "cache_dir": knobs.cache.dir,
            "warmup_seconds": round(time.perf_counter() - t0, 3)}


def build(request: TritonCompileRequest) -> dict:
    _apply_env(request.env)
    compiled, found = compile_request(request)
    details = {"hash": compiled.hash, "compiled": not found}  # found: another process had built it
    try:
        details["launcher"] = prebuild_host_launcher(compiled)
    except Exception as exc:  # the cubin is published; a launcher the server builds itself is no error
        details["launcher"] = f"failed: {type(exc).__name__}: {exc}"
    return details
