"""The DeepGEMM family's builder (``FamilySpec.builder``): helpers rebuild recorded kernels into DeepGEMM's
disk cache with nvcc; neither a GPU nor DeepGEMM's ``_C`` extension is needed, only nvcc and DeepGEMM's
headers.

Headers: ``JIT_AHEAD_DEEP_GEMM_INCLUDE`` (colon-separated include folders: the one holding ``deep_gemm/``,
then what its headers include, e.g. CUTLASS's), else the ``include`` folder of the installed ``deep_gemm``
package, found without importing it (its import loads the extension).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path

from . import disk_cache
from .rebuild import RecordedKernel, nvcc_version, rebuild

INCLUDE_KNOB = "JIT_AHEAD_DEEP_GEMM_INCLUDE"
NVCC_KNOB = "JIT_AHEAD_DEEP_GEMM_NVCC"


def include_dirs(environ=os.environ) -> list[Path]:
    """The include folders rebuilds hash and compile with; ImportError naming what is missing."""
    value = environ.get(INCLUDE_KNOB, "").strip()
    if value:
        dirs = [Path(part) for part in value.split(":") if part]
    else:
        spec = importlib.util.find_spec("deep_gemm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"neither {INCLUDE_KNOB} nor an installed deep_gemm package names DeepGEMM's headers")
        dirs = [Path(next(iter(spec.submodule_search_locations))) / "include"]
    if not any((d / "deep_gemm").is_dir() for d in dirs):
        raise ImportError(f"no deep_gemm/ header folder in {':'.join(map(str, dirs))} ({INCLUDE_KNOB})")
    return dirs


def nvcc(environ=os.environ) -> str:
    """The nvcc rebuilds run (DeepGEMM's own choice is CUDA_HOME's); ImportError when there is none."""
    chosen = environ.get(NVCC_KNOB) or shutil.which("nvcc", path=environ.get("PATH"))
    if not chosen:
        home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
        candidate = Path(home) / "bin" / "nvcc" if home else None
        chosen = str(candidate) if candidate is not None and candidate.exists() else None
    if not chosen:
        raise ImportError(f"no nvcc on PATH, in CUDA_HOME or {NVCC_KNOB}: DeepGEMM kernels cannot be rebuilt here")
    return chosen


def prepare(view=None) -> dict:
    """Check the headers and nvcc once per helper."""
    t0 = time.perf_counter()
    dirs, compiler = include_dirs(), nvcc()
    release = next((line for line in nvcc_version(compiler).splitlines() if "release" in line), "?")
    return {"nvcc": release.strip(), "include": ":".join(map(str, dirs)),
            "cache": str(disk_cache.cache_roots()[0]), "warmup_seconds": round(time.perf_counter() - t0, 3)}


def build(record: RecordedKernel) -> dict:
    entry, built = rebuild(record, disk_cache.cache_roots(), include_dirs(), nvcc=nvcc())
    return {"built": built, "path": str(entry)}
