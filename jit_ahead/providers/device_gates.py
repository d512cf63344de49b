"""transformers' device gates, opened for meta tensors in planning threads.

From transformers 5.25, a modeling function decorated with ``use_kernel_func_from_hub_with_fallback``
(fla's gated delta rule, causal_conv1d, mamba_ssm) calls the kernel library only when its first tensor
argument is on one of the library's devices (``cuda``, ``xpu``...), and its PyTorch reference otherwise.
A planned forward runs on meta tensors, so every such call would take the reference path and plan none
of the kernels the model launches on the GPU. The decorated function holds the devices it accepts in
its closure (``supported_devices``; with the ``kernels`` package installed, the module attribute is a
``Func`` module whose forward calls that function); ``meta_stands_for_the_gpu()`` replaces that tuple, once per
function, with one that also accepts ``meta``, but only in a thread inside the context: every other
thread (the server's, a user's own meta forward) sees exactly the devices transformers listed.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from ..core.processes import fork_safe_lock
from ..core.thread_patch import set_in_this_thread

_GATE = "supported_devices"  # the closure variable of transformers' wrapped functions
_planning = threading.local()
_lock = fork_safe_lock()
_scanned_modules = 0  # len(sys.modules) at the last scan: a new module may hold new gated functions


class PlanningDevices:
    """The devices a gated function accepts: transformers' own, and ``meta`` in a planning thread."""

    def __init__(self, devices: tuple[str, ...]) -> None:
        self.devices = devices

    def __contains__(self, device: object) -> bool:
        return device in self.devices or (device == "meta" and bool(getattr(_planning, "active", None)))

    def __iter__(self):
        return iter(self.devices)

    def __repr__(self) -> str:
        return f"PlanningDevices({self.devices!r}, meta in planning threads)"


def _functions_reached(value, depth: int = 3):
    """``value`` if it is a function, and the functions its closure (or, for an object such as the
    ``kernels`` package's ``Func`` module, its class's ``forward``) holds, ``depth`` levels deep."""
    code = getattr(value, "__code__", None)
    if code is None:
        forward = getattr(type(value), "forward", None)
        if forward is None or not hasattr(forward, "__code__") or depth == 0:
            return
        yield from _functions_reached(forward, depth - 1)
        return
    yield value
    if depth == 0:
        return
    for cell in value.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if hasattr(inner, "__code__"):
            yield from _functions_reached(inner, depth - 1)


def _open_gate(function) -> bool:
    code = function.__code__
    if _GATE not in code.co_freevars or not function.__closure__:
        return False
    cell = function.__closure__[code.co_freevars.index(_GATE)]
    try:
        devices = cell.cell_contents
    except ValueError:  # an empty cell
        return False
    if not (isinstance(devices, tuple) and all(isinstance(d, str) for d in devices)):
        return False  # None (no library: the torch path anyway), or opened already
    cell.cell_contents = PlanningDevices(devices)
    return True


def _open_gates_of(module) -> int:
    return sum(_open_gate(function) for value in list(vars(module).values())
               for function in _functions_reached(value))


def open_gates() -> int:
    """Open the gates of every gated function in transformers' imported modeling modules not seen yet;
    returns how many were opened now."""
    global _scanned_modules
    if len(sys.modules) == _scanned_modules:
        return 0
    with _lock:
        opened = 0
        for name, module in list(sys.modules.items()):
            if module is not None and name.startswith("transformers.models."):
                opened += _open_gates_of(module)
        _scanned_modules = len(sys.modules)
        return opened


@contextlib.contextmanager
def meta_stands_for_the_gpu() -> Iterator[None]:
    """In this thread, transformers' gated functions take meta inputs as they take GPU ones."""
    open_gates()
    with set_in_this_thread(_planning, "active", True):
        yield
