"""A stand-in Triton driver for machines without a GPU.

Triton's JIT path asks the active driver for a target, a device and a stream before anything else, and
the launch path asks it to load the binary and launch. This driver answers with an explicit target
(sm_90 by default) and turns loads, launches and autotuning benchmarks into no-ops, so real launcher
code runs unchanged on meta tensors: planning captures its compile requests, and tests can drive Triton's normal launch path
(in-memory cache, ``jit_cache_hook``, disk lookup) on a CPU-only machine.
"""
from __future__ import annotations

import logging
import os

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

from ..core import device_view
from ..core.device_view import DeviceView
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


def _launch_once(kernel_call, quantiles=None, **kwargs):
    """The stand-in's benchmarker: runs the call once through the normal launch path and reports equal
    times for every candidate. An autotuned launch then compiles (or loads) every config exactly as it
    does on a GPU; the choice among them is meaningless without one, and so is any timing."""
    kernel_call()
    return [1.0] * len(quantiles) if quantiles else 1.0


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


def install_stand_in(view: DeviceView) -> None:
    """Show this process ``view``'s GPU: torch's device queries and a stand-in Triton driver."""
    device_view.install(view)
    triton.runtime.driver.set_active(StandInDriver(GPUTarget(*target_of(view)), properties_of(view)))


def ensure_driver(target: GPUTarget | None = None) -> GPUTarget:
    """Use the real driver when a GPU is there; otherwise install the stand-in for ``target``.

    Call it before importing kernel libraries that read the device at import (flash-linear-attention).
    """
    driver = triton.runtime.driver
    if real_driver_available():
        return driver.active.get_current_target()
    wanted = target or default_target()
    current = driver._active
    if not isinstance(current, StandInDriver) or current.target != wanted:
        view = device_view.installed()
        if view is None or GPUTarget(*target_of(view)) != wanted:
            view = view_for_target(wanted)
        install_stand_in(view)
        log.info("no GPU driver: jit_ahead's stand-in driver shows %s (%s)", view.name, wanted)
    return wanted
