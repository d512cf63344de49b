"""The toy DSL: ``compile(kernel, spec)`` "compiles" a spec into a file of its cache on first use, as a JIT
would, and returns its text. A family hooks it (``handler``), as Triton's ``jit_cache_hook`` or the CuTe
DSL's ``cute.compile`` are hooked; ``capturing`` is planning's: calls are noted, nothing is built."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

CACHE_KNOB = "TOY_DSL_CACHE_DIR"
handler = None  # called with (kernel, spec) instead of compiling here; returns the text
capturing: list | None = None  # planning: (kernel, spec) of each call, nothing is built
compiled_here: list[str] = []  # the compiles this process ran itself (the JIT's own path)


def cache_dir() -> Path:
    return Path(os.environ[CACHE_KNOB])


def key(kernel: str, spec: str) -> str:
    return hashlib.sha256(f"{kernel}\0{spec}".encode()).hexdigest()


def path_of(kernel: str, spec: str) -> Path:
    return cache_dir() / f"{key(kernel, spec)}.toy"


def build(kernel: str, spec: str) -> Path:
    """The compile: a spec "slow:S" takes S seconds; "fail" raises. Published atomically."""
    if spec == "fail":
        raise RuntimeError(f"toy kernel {kernel} does not compile spec 'fail'")
    if spec.startswith("slow:"):
        time.sleep(float(spec[5:]))
    path = path_of(kernel, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_suffix(f".{os.getpid()}.tmp")
    aside.write_text(f"{kernel}({spec}) built by pid {os.getpid()}\n")
    os.replace(aside, path)
    return path


def compile(kernel: str, spec: str) -> str:
    if capturing is not None:
        capturing.append((kernel, spec))
        return ""
    if handler is not None:
        return handler(kernel, spec)
    return compile_here(kernel, spec)


def compile_here(kernel: str, spec: str) -> str:
    """What the DSL does without jit_ahead: load the file, or build it on this thread."""
    path = path_of(kernel, spec)
    if not path.exists():
        compiled_here.append(spec)
        build(kernel, spec)
    return path.read_text()
