"""What FlashInfer's builds need in a CPU-only helper, as the environment FlashInfer reads it from.

- ``FLASHINFER_CUDA_ARCH_LIST``: without a GPU FlashInfer knows no target (``check_cuda_arch`` raises); the
  server's GPU, as the device view shows it (sm_90 -> ``9.0a``, the arch FlashInfer builds for Hopper).
- ``CUDA_HOME``: FlashInfer takes the folder above ``which nvcc`` where it is unset; a wrapper script on the
  PATH (``/usr/local/bin/nvcc``) makes that ``/usr/local``, where the link finds no ``libcudart``. The
  toolkit of the usual places (``/usr/local/cuda``) is named instead when the one found has no ``lib64``.
- A ``libcuda`` to link against: FlashInfer links every module with ``-lcuda``, which a machine without the
  NVIDIA driver does not have (the toolkit's ``lib64/stubs`` holds one in a full install). jit_ahead then
  makes an empty stand-in library of that name (``cc -shared``) in its own cache folder and adds it with
  ``FLASHINFER_EXTRA_LDFLAGS``; the linker's ``--as-needed`` leaves it out of the module, which resolves
  ``libcuda.so.1`` from the driver where it runs, as FlashInfer's own builds do.
- The CUDA libraries' headers: some modules include them (the sampling module vLLM uses, ``curand.h``), and a
  toolkit installed without those libraries (the CPU machines' nvcc) lacks them. The include folders of their
  pip packages (``nvidia-curand`` and the like, under ``nvidia/``) that hold a header the toolkit lacks are
  added after the toolkit's own with ``FLASHINFER_EXTRA_CUDAFLAGS``, so a toolkit's header is still found first.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("jit_ahead.flashinfer")

TOOLKITS = ("/usr/local/cuda",)


def arch_list(capability: tuple[int, int]) -> str:
    major, minor = capability
    return f"{major}.{minor}{'a' if major >= 9 else ''}"


def cuda_home(environ=os.environ) -> str | None:
    """The toolkit FlashInfer's build should use, or None where it finds one itself."""
    if environ.get("CUDA_HOME") or environ.get("CUDA_PATH"):
        return None
    nvcc = shutil.which("nvcc", path=environ.get("PATH"))
    if nvcc is not None and os.path.isdir(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "lib64")):
        return None
    return next((t for t in TOOLKITS if os.path.isfile(os.path.join(t, "bin", "nvcc"))), None)


def nvcc(environ=os.environ) -> str | None:
    """The nvcc FlashInfer's builds will run: ``$CUDA_HOME/bin/nvcc`` where it is set, else the one on the
    PATH or in the usual places; None where there is none."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home:
        path = os.path.join(home, "bin", "nvcc")
        return path if os.path.isfile(path) else None
    found = cuda_home(environ)
    return os.path.join(found, "bin", "nvcc") if found else shutil.which("nvcc", path=environ.get("PATH"))


def has_libcuda(home: str | None) -> bool:
    folders = [os.path.join(home, "lib64", "stubs")] if home else []
    folders += ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib"]
    return any(os.path.exists(os.path.join(f, name)) for f in folders for name in ("libcuda.so", "libcuda.so.1"))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stand_in_libcuda(folder: Path) -> Path | None:
    """An empty ``libcuda.so`` in ``folder`` (made once, and made again where the one there is not the one
    made: a damaged library would fail every module's link), or None with one line where no C compiler
    can make it."""
    library, digest = folder / "libcuda.so", folder / "libcuda.so.sha256"
    try:
        if digest.read_text().strip() == _digest(library):
            return folder
    except OSError:  # not made yet, or half of it missing
        pass
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        log.warning("flashinfer: no libcuda to link FlashInfer's modules against and no C compiler to make a "
                    "stand-in; helper builds fail and FlashInfer builds its modules in the server")
        return None
    if library.exists():
        log.warning("flashinfer: the stand-in libcuda %s is not the one jit_ahead made; it is made again", library)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        source = Path(scratch) / "empty.c"
        source.write_text("void jit_ahead_libcuda_stand_in(void) {}\n")
        made = Path(scratch) / "libcuda.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(made), str(source)],
                       check=True, capture_output=True, timeout=60)
        (Path(scratch) / "digest").write_text(_digest(made))
        os.replace(made, library)  # the library first: a digest never vouches for a library not yet in place
        os.replace(Path(scratch) / "digest", digest)
    return folder


LIBRARY_HEADERS = ("curand.h", "curand_kernel.h", "cublas_v2.h", "cublasLt.h")


def library_header_folders(home: str | None) -> list[str]:
    """The include folders of installed CUDA library packages that hold a header of ``LIBRARY_HEADERS``
    the toolkit at ``home`` lacks."""
    missing = [h for h in LIBRARY_HEADERS if not (home and os.path.isfile(os.path.join(home, "include", h)))]
    if not missing:
        return []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    folders = sorted({str(folder) for root in roots for folder in Path(root).glob("*/include")
                      if any((folder / h).is_file() for h in missing)})
    return folders


def helper_environment(capability: tuple[int, int], cache_folder: Path, environ=os.environ) -> dict[str, str]:
    """The variables helpers build FlashInfer's modules with (what the server's environment leaves out)."""
    env = {}
    if "FLASHINFER_CUDA_ARCH_LIST" not in environ:
        env["FLASHINFER_CUDA_ARCH_LIST"] = arch_list(capability)
    home = cuda_home(environ)
    if home is not None:
        env["CUDA_HOME"] = home
    compiler = nvcc(environ)  # the toolkit above it is the one FlashInfer's builds include from
    headers = library_header_folders(os.path.dirname(os.path.dirname(compiler)) if compiler else None)
    if headers:
        env["FLASHINFER_EXTRA_CUDAFLAGS"] = " ".join(filter(None, [environ.get("FLASHINFER_EXTRA_CUDAFLAGS"),
                                                                   *(f"-isystem {h}" for h in headers)]))
    if not has_libcuda(home or environ.get("CUDA_HOME") or environ.get("CUDA_PATH")):
        stubs = stand_in_libcuda(cache_folder / "libcuda-stand-in")
        if stubs is not None:
            env["FLASHINFER_EXTRA_LDFLAGS"] = " ".join(filter(None, [environ.get("FLASHINFER_EXTRA_LDFLAGS"),
                                                                     f"-L{stubs}"]))
    return env
