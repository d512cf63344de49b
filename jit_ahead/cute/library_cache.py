"""Libraries that keep their own persistent cache of ``cute.compile`` results (quack's ``jit_cache``).

quack wraps each kernel's compile function (``_compile_rmsnorm_fwd(dtype, ..., N, ...)``) in
``quack.cache.jit_cache``: a call loads ``<cache>/<source fingerprint>/<sha of the call>.o`` when it
exists, and otherwise compiles and exports it under an exclusive per-key ``flock`` that other processes
wait on. So the server needs no hook at all: a helper makes the same call with the same arguments, for
the server's arch, and quack's own code in the server then loads the object, or waits on the helper's
lock and loads it, instead of compiling.

Planning captures those calls: while a capture (``jit_ahead.cute.plan.capture``) is active in the
calling context, every gated ``jit_cache`` wrapper of the library adds the call's request to it and
returns a no-op kernel (the library's host code runs on meta tensors up to the compile call and launches
nothing).
"""
from __future__ import annotations

import contextvars
import functools
import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.processes import fork_safe_lock
from ..core.requests import VariantBase
from .arch import targeting
from .request import FAMILY, resolve

# The capture of the current context (jit_ahead.cute.plan.Capture); None outside planning.
capturing: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_library_cache_capture", default=None)

_lock = fork_safe_lock()
# JIT_AHEAD_RECORD_DIR: called once per distinct call made outside planning, (module, qualname, args, kwargs)
_recorder = None
_recorded: set = set()  # the calls this recorder was given
# what gate_package replaced, to put back at the family's close: (owner, attribute, what it held, the gate)
_gates: list[tuple[object, str, object, object]] = []


@dataclass(frozen=True)
class LibraryCacheRequest(VariantBase):
    """One call of a library's cached compile function, and where the library will look for its object.

    ``sha`` and ``fingerprint`` are computed by the library's own functions in the server; a helper whose
    library computes another fingerprint (other sources, CUTLASS or TVM FFI version) refuses the build."""

    family = FAMILY

    module: str
    qualname: str  # of the jit_cache wrapper (``_compile_rmsnorm_fwd``, ``Softmax.compile``)
    args: tuple
    kwargs: tuple  # sorted (name, value) pairs
    arch: str  # the server's GPU: the library's key does not include it, so the build must use it
    cache_dir: str
    fingerprint: str
    sha: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.cache_dir}\0{self.fingerprint}\0{self.sha}\0{self.arch}".encode()).hexdigest()

    @property
    def path(self) -> Path:
        return Path(self.cache_dir) / self.fingerprint / f"{self.sha}.o"

    @property
    def label(self) -> str:
        return f"{self.module}.{self.qualname}[{self.sha[:12]}]"


    def is_built(self) -> bool:
        return self.path.exists()


def _quack_cache():
    import quack.cache.jit as jit_cache_module

    return jit_cache_module


def request_for(module: str, wrapper, args: tuple, kwargs: dict, arch: str) -> LibraryCacheRequest:
    """The request of ``wrapper(*args, **kwargs)``: quack's key of the call, by quack's own functions.

    The only composition done here is quack's layout, ``<cache path>/<fingerprint>/<sha>.o`` with the key
    ``(qualname, *args, *sorted(kwargs))``; tests/test_quack.py checks that quack's wrapper loads what a
    helper left at that path without compiling."""
    cache = _quack_cache()
    items = tuple(sorted(kwargs.items()))
    call_key = args + items if items else args
    sha = cache._key_to_hash((wrapper.__qualname__,) + call_key)
    return LibraryCacheRequest(module, wrapper.__qualname__, tuple(args), items, arch, str(cache.get_cache_path()),
                               cache._compute_source_fingerprint(), sha)


# -- planning ---------------------------------------------------------------------------------------------
def _is_jit_cache_wrapper(obj) -> bool:
    return callable(obj) and all(hasattr(obj, a) for a in ("cache", "cache_info", "cache_clear", "__wrapped__"))


def _gate(module_name: str, wrapper):
    """The wrapper, answering captures from the planning context and calling the library otherwise."""
    @functools.wraps(wrapper)
    def gated(*args, **kwargs):
        collector = capturing.get()
        if collector is None:
            if _recorder is not None:
                _note_call(module_name, wrapper.__qualname__, args, kwargs)
            return wrapper(*args, **kwargs)
        collector.add(request_for(module_name, wrapper, args, kwargs, collector.arch))
        return _planned_kernel

    gated.jit_ahead_original = wrapper
    return gated


def set_recorder(recorder) -> None:
    """Record the calls of gated compile functions made outside planning (None: stop recording). A new
    recorder (another session's record folder) is given every distinct call again."""
    global _recorder
    with _lock:
        _recorder = recorder
        _recorded.clear()


def _note_call(module_name: str, qualname: str, args: tuple, kwargs: dict) -> None:
    recorder = _recorder
    if recorder is None:  # not marked seen either: a recorder set later is given the call
        return
    items = tuple(sorted(kwargs.items()))
    try:
        seen = (module_name, qualname, args, items)
        with _lock:
            if seen in _recorded or recorder is not _recorder:
                return
            _recorded.add(seen)
    except TypeError:  # an unhashable argument (a config object): such calls are not recorded
        return
    recorder(module_name, qualname, args, items)


def _planned_kernel(*args, **kwargs) -> None:
    """What a captured compile call returns: the library's host code 'launches' it on meta tensors."""


def gate_package(package: str) -> int:
    """Gate every jit_cache wrapper of ``package``'s imported modules (functions and static methods of
    classes); returns how many are gated. Idempotent."""
    count = 0
    with _lock:
        for name, module in list(sys.modules.items()):
            if module is None or not (name == package or name.startswith(package + ".")):
                continue
            for attr, value in list(vars(module).items()):
                if _is_jit_cache_wrapper(value) and getattr(value, "__module__", None) == name:
                    count += _replace(module, attr, value, name, staticmethod_=False)
                elif isinstance(value, type) and value.__module__ == name:
                    for cls_attr, raw in list(vars(value).items()):
                        if isinstance(raw, staticmethod) and _is_jit_cache_wrapper(raw.__func__):
                            count += _replace(value, cls_attr, raw.__func__, name, staticmethod_=True)
    return count


def _replace(owner, attr: str, wrapper, module_name: str, staticmethod_: bool) -> int:
    if hasattr(wrapper, "jit_ahead_original"):  # gated already
        return 0
    gated = _gate(module_name, wrapper)
    _gates.append((owner, attr, vars(owner)[attr], gated))
    setattr(owner, attr, staticmethod(gated) if staticmethod_ else gated)
    return 1


def ungate_all() -> int:
    """Put back every compile function ``gate_package`` replaced (the CuTe family's close): nothing of
    jit_ahead stays in the library's modules. A reference someone took to a gate meanwhile keeps it, and
    it calls the library's own function outside planning. Returns how many were put back."""
    restored = 0
    with _lock:
        gates, _gates[:] = list(_gates), []
        for owner, attr, original, gated in gates:
            current = vars(owner).get(attr)
            if current is gated or getattr(current, "__func__", None) is gated:
                setattr(owner, attr, original)
                restored += 1
    return restored


# -- the helper's build -------------------------------------------------------------------------------------
def resolve_original(module: str, qualname: str):
    """The library's own compile function (not jit_ahead's gate around it)."""
    obj = resolve(module, qualname)
    return getattr(obj, "jit_ahead_original", obj)


def build(request: LibraryCacheRequest) -> dict:
    """Make the library's own call for the server's arch: it compiles and exports under its own lock, or
    finds the object another process left. Checks that the object is where the server will look."""
    import quack.cache as quack_cache

    fingerprint = _quack_cache()._compute_source_fingerprint()
    if fingerprint != request.fingerprint:
        raise RuntimeError(f"this helper's quack fingerprint ({fingerprint[:12]}) is not the server's "
                           f"({request.fingerprint[:12]}): its object would not be the one the server loads")
    if request.path.exists():
        return {"built": False, "path": str(request.path)}
    previous = quack_cache.CACHE_DIR, quack_cache.CACHE_ENABLED
    quack_cache.CACHE_DIR, quack_cache.CACHE_ENABLED = request.cache_dir, True
    t0 = time.perf_counter()
    try:
        with targeting(request.arch):
            resolve_original(request.module, request.qualname)(*request.args, **dict(request.kwargs))
    finally:
        quack_cache.CACHE_DIR, quack_cache.CACHE_ENABLED = previous
    if not request.path.exists():
        raise RuntimeError(f"{request.label}: the library did not leave its object at {request.path}")
    # Another process may have exported it while this call waited on quack's lock: quack then loaded it.
    return {"built": True, "path": str(request.path), "compile_s": round(time.perf_counter() - t0, 3)}
