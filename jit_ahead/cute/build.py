"""Building a CuTe DSL variant with no GPU: ``cute.compile`` on fake arguments for an explicit arch and a
pinned host target, ``export_to_c``, published atomically under the family's cache folder.

This is also the family's builder interface for helpers (``prepare``, ``build``). A per-variant file lock
makes the ranks of a node build each variant once: the others wait for the lock and find the object.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..core.building.build_lock import variant_lock
from . import library_cache
from .arch import ARCH_VAR, arch_of, targeting
from .library_cache import LibraryCacheRequest
from .request import PORTABLE_HOST_TARGET, CuteCompileRequest, resolve, uses_tvm_ffi
from .arg_specs import fake_args

CACHE_KNOB = "JIT_AHEAD_CUTE_CACHE_DIR"
OBJECT_NAME = "kernel"  # <key folder>/kernel.o and kernel.h


def cache_root() -> Path:
    raw = os.environ.get(CACHE_KNOB, "").strip()
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "jit_ahead" / "cute"


def object_path(request: CuteCompileRequest, root: Path | None = None) -> Path:
    return (root or cache_root()) / request.key[:2] / request.key / f"{OBJECT_NAME}.o"


@functools.lru_cache(maxsize=1)
def dsl_version() -> str:
    """The DSL's own fingerprint (its Python sources and the compiler binary of the CUDA flavor it loaded),
    as it computes it for its cache keys."""
    from cutlass.cutlass_dsl.cutlass import CuTeDSL

    return CuTeDSL._get_dsl().get_version().hexdigest()


@functools.lru_cache(maxsize=None)
def source_sha256(module: str) -> str:
    """The kernel module's file, read once per process: the code that runs is what was imported."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise ModuleNotFoundError(f"no source file for module {module}")
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()


def make_request(module: str, qualname: str, args, arch: str = "sm_90a", options: str = "") -> CuteCompileRequest:
    """A request for ``module.qualname`` compiled with ``args`` (ArgSpecs) for ``arch``, keyed by this
    process's DSL install and the module's source.

    The host code is built for a pinned portable CPU, except with ``--enable-tvm-ffi``: the DSL refuses a
    host target for a TVM FFI export, and uses its own default (what its users, quack among them, ship)."""
    return CuteCompileRequest(module, qualname, tuple(args), arch, options,
                              host_target="" if uses_tvm_ffi(options) else PORTABLE_HOST_TARGET,
                              dsl_version=dsl_version(),
                              source_sha256=source_sha256(module))


def compile_and_export(request: CuteCompileRequest, folder: Path) -> None:
    """``cute.compile`` for the request's arch and host target, exported as ``folder/kernel.{o,h}``."""
    from . import hook  # the unpatched compile: this is the build itself, never a miss to handle

    host = f"--host-target '{request.host_target}'" if request.host_target else ""
    options = " ".join(part for part in (f"--gpu-arch {request.arch}", host, request.options) if part)
    with targeting(request.arch):  # the JIT engine's arch must be the target's for export
        compiled = hook.compile_unhooked(resolve(request.module, request.qualname), *fake_args(request.args),
                                         options=options)
    if request.tvm_ffi:
        compiled.export_to_c(str(folder / f"{OBJECT_NAME}.o"), function_name=request.symbol)
    else:
        compiled.export_to_c(str(folder), OBJECT_NAME, function_prefix=request.symbol)


def build_into(request: CuteCompileRequest, root: Path) -> dict:
    """Build the request's object under ``root`` unless it is there; another process building the same
    key holds its lock, and this one then finds the object. A build killed midway leaves only its
    private temporary folder, never a partial object at the final path."""
    if request.dsl_version and request.dsl_version != dsl_version():
        raise RuntimeError(f"this process's CuTe DSL ({dsl_version()[:12]}) is not the requester's "
                           f"({request.dsl_version[:12]}): its object would not be the one asked for")
    final = object_path(request, root)
    final.parent.parent.mkdir(parents=True, exist_ok=True)
    with variant_lock(str(final.parent) + ".lock", request.label):
        if final.exists():
            return {"built": False, "path": str(final)}
        t0 = time.perf_counter()
        scratch = Path(tempfile.mkdtemp(prefix=f".{request.key[:16]}-", dir=final.parent.parent))
        try:
            compile_and_export(request, scratch)
            os.rename(scratch, final.parent)  # the whole folder appears at once
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
            if not final.exists():
                raise
            # built meanwhile by the process whose lock this build stopped waiting for: theirs stands
            return {"built": False, "path": str(final)}
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return {"built": True, "path": str(final), "compile_s": round(time.perf_counter() - t0, 3)}


# -- the builder interface the helper worker calls ------------------------------------------------------------
def prepare(view=None) -> dict:
    """Import the DSL and compute its fingerprint before saying ready."""
    if view is not None and view.backend == "cuda":
        os.environ.setdefault(ARCH_VAR, arch_of(view))
    library_cache.set_recorder(None)  # in a fork of the server: its builds are no calls to record
    t0 = time.perf_counter()
    version = dsl_version()
    return {"cute_dsl": version[:12], "cache_dir": str(cache_root()),
            "warmup_seconds": round(time.perf_counter() - t0, 3)}


def build(request) -> dict:
    if isinstance(request, LibraryCacheRequest):  # a library's own cached compile (quack)
        return library_cache.build(request)
    return build_into(request, cache_root())
