"""A stand-in Triton driver for machines without a GPU.

Triton's JIT path asks the active driver for a target, a device and a stream before anything else, and
the launch path asks it to load the binary and launch. This driver answers with an explicit target
(sm_90 by default) and turns loads, launches and autotuning benchmarks into no-ops, so real launcher
code runs unchanged on meta tensors: planning captures its compile requests, and tests can drive Triton's normal launch path
(in-memory cache, ``jit_cache_hook``, disk lookup) on a CPU-only machine.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

from ..core import device_view
from ..core.device_view import DeviceView
from ..core.processes import fork_safe_lock
from .device import properties_of, target_of, view_for_target

log = logging.getLogger("jit_ahead.triton")


class _StandInUtils:
    def __init__(self, properties: dict) -> None:
        self._properties = dict(properties)

    def load_binary(self, name, kernel, shared, device):
        # (module, function, n_regs, n_spills, n_max_threads): non-None handles mark it loaded.
        return 0, 0, 0, 0, 1024

    def unload_module(self, module) -> None:
        pass

    def get_device_properties(self, device) -> dict:
        return dict(self._properties)


class _NoLaunch:
    """Accepts a launch and does nothing: there is no GPU to run it on."""

    def __init__(self, src, metadata) -> None:
        self.metadata = metadata

    def __call__(self, *args, **kwargs) -> None:
        return None


class StandInDriver(DriverBase):
    def __init__(self, target: GPUTarget, properties: dict) -> None:
        super().__init__()
        self.target = target
        self.utils = _StandInUtils(properties)
        self.launcher_cls = _NoLaunch

    @classmethod
    def is_active(cls) -> bool:
        return False  # never picked by Triton's own driver discovery

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("the stand-in driver builds no host launchers")

    def get_current_target(self) -> GPUTarget:
        # like the CUDA driver, look the current device up: an index no GPU has is an error there too
        device = self.get_current_device()
        if device != 0:
            raise AssertionError(f"Invalid device id {device} (the stand-in shows one GPU)")
        return self.target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_active_torch_device(self):
        import torch
        return torch.device("meta")

    def get_benchmarker(self):
        return _launch_once


# (warmup, rep) in ms each benchmark was asked for, the latest last: the window an autotuner would time over
asked_windows: collections.deque[tuple[int, int]] = collections.deque(maxlen=256)


def _launch_once(kernel_call, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
    """The stand-in's benchmarker, called as Triton's ``do_bench``: runs the call once through the normal
    launch path and reports equal times for every candidate. An autotuned launch then compiles (or loads)
    every config exactly as it does on a GPU; the choice among them is meaningless without one, and so is
    any timing."""
    asked_windows.append((warmup, rep))
    kernel_call()
    return [1.0] * len(quantiles) if quantiles else 1.0


def times_nothing(benchmarker) -> bool:
    """Whether ``benchmarker`` is the stand-in's, or wraps it (``__wrapped__``, ``functools.partial``): a
    choice made with it is the first config's, not a GPU's."""
    for _ in range(8):  # a chain of wrappers, never a cycle
        if benchmarker is _launch_once:
            return True
        benchmarker = getattr(benchmarker, "__wrapped__", None) or getattr(benchmarker, "func", None)
        if benchmarker is None:
            return False
    return False


def parse_target(text: str) -> GPUTarget:
    """``cuda:90`` or ``cuda:90:32`` (backend, compute capability, warp size). Only CUDA targets: the
    stand-in driver and the builders know no other backend."""
    parts = text.strip().split(":")
    try:
        backend, arch = parts[0].lower(), int(parts[1])
        warp = int(parts[2]) if len(parts) > 2 else 32
        if len(parts) > 3:
            raise ValueError
    except (IndexError, ValueError):
        raise ValueError(f"bad target {text!r}: expected BACKEND:ARCH[:WARP_SIZE], for example cuda:90") from None
    if backend != "cuda" or not 50 <= arch <= 999 or warp != 32:
        raise ValueError(f"bad target {text!r}: expected cuda:ARCH with a compute capability such as 80, 90 or "
                         "100 (warp size 32)")
    return GPUTarget(backend, arch, warp)


def default_target() -> GPUTarget:
    raw = os.environ.get("JIT_AHEAD_TARGET", "cuda:90")
    try:
        return parse_target(raw)
    except ValueError as exc:
        log.error("JIT_AHEAD_TARGET: %s; using cuda:90", exc)
        return GPUTarget("cuda", 90, 32)


def real_driver_available() -> bool:
    driver = triton.runtime.driver
    if isinstance(driver._active, StandInDriver):
        return False
    try:
        driver.active  # noqa: B018 - creates the real driver if a GPU is there
        return True
    except RuntimeError:
        return False


def install_stand_in(view: DeviceView) -> "_Replaced":
    """Show this process ``view``'s GPU: torch's device queries and a stand-in Triton driver. Returns what
    it replaced; :func:`_put_back` undoes it."""
    from . import autotune

    autotune.refuse_blind_choices()  # before any autotuner can benchmark on it
    driver = triton.runtime.driver
    replaced = _Replaced(driver._active, device_view.install(view))
    driver.set_active(StandInDriver(GPUTarget(*target_of(view)), properties_of(view)))
    return replaced


@dataclass(frozen=True)
class _Replaced:
    driver: DriverBase | None  # Triton's active driver before (None: not created yet)
    device: device_view.Installed


def _put_back(replaced: _Replaced) -> None:
    triton.runtime.driver._active = replaced.driver  # set_active cannot say "none yet"
    device_view.put_back(replaced.device)


def _stand_in_for(wanted: GPUTarget) -> _Replaced | None:
    """Install the stand-in for ``wanted`` unless it is the active one; returns what was replaced, if
    anything."""
    current = triton.runtime.driver._active
    if isinstance(current, StandInDriver) and current.target == wanted:
        return None
    view = device_view.installed()
    if view is None or GPUTarget(*target_of(view)) != wanted:
        view = view_for_target(wanted)
    log.info("no GPU driver: jit_ahead's stand-in driver shows %s (%s)", view.name, wanted)
    return install_stand_in(view)


def ensure_driver(target: GPUTarget | None = None) -> GPUTarget:
    """Use the real driver when a GPU is there; otherwise install the stand-in for ``target`` for the rest
    of the process (a CLI run, a test session, a script). Sessions use :func:`driver_for` instead, which
    puts things back.

    Call it before importing kernel libraries that read the device at import (flash-linear-attention).
    """
    if real_driver_available():
        return triton.runtime.driver.active.get_current_target()
    wanted = target or default_target()
    with _hold_lock:
        _stand_in_for(wanted)
        _before_hold.clear()  # held or not, this stand-in is the process's now: the last hold leaves it
    return wanted


_hold_lock = fork_safe_lock()
_holders = 0
_before_hold: list[_Replaced] = []  # what the holds replaced, oldest first


@contextlib.contextmanager
def driver_for(target: GPUTarget | None = None) -> Iterator[GPUTarget]:
    """The target launches compile for inside the context: the real driver's where a GPU is there;
    otherwise the stand-in's for ``target``, installed while any such context is open. The last to leave
    puts back Triton's driver and torch's device queries as they were before the first, so a closed
    session leaves no stand-in behind (nor one a process installed for itself with :func:`ensure_driver`
    taken away)."""
    global _holders
    if real_driver_available():
        yield triton.runtime.driver.active.get_current_target()
        return
    wanted = target or default_target()
    with _hold_lock:
        replaced = _stand_in_for(wanted)  # raises for a target it cannot show: nothing held then
        _holders += 1
        if replaced is not None:
            _before_hold.append(replaced)
    try:
        yield wanted
    finally:
        with _hold_lock:
            _holders -= 1
            if _holders == 0:
                while _before_hold:
                    _put_back(_before_hold.pop())


def reset_after_fork() -> None:
    """In a planner forked from the server while one of its threads held the stand-in: that thread does
    not exist here, and the planner keeps its own stand-in for its life."""
    global _holders
    _holders = 0
    _before_hold.clear()
