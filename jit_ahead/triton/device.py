"""The Triton family's part of the device view: the target and properties its driver reports, read from
the live GPU where there is one, else the embedded H200's (the stand-in driver shows them)."""
from __future__ import annotations

from triton.backends.compiler import GPUTarget

from ..core.device_view import DeviceView, register_part_reader

PART = "triton"
# An H200 as Triton's driver reports it (read on the H200 host; see
# results/2026-11-29-h200-helpers-roundtrip/device_view.json).
H200_PROPERTIES = {"max_shared_mem": 232448, "max_num_regs": 65536, "multiprocessor_count": 132, "warpSize": 32,
                   "sm_clock_rate": 1980000, "mem_clock_rate": 3201000, "mem_bus_width": 6016}


def read_part(device: int) -> dict:
    """What Triton's active driver says of ``device``."""
    import triton

    driver = triton.runtime.driver.active
    target = driver.get_current_target()
    return {"target": [target.backend, int(target.arch), int(target.warp_size)],
            "properties": dict(driver.utils.get_device_properties(device))}


register_part_reader(PART, read_part)


def target_of(view: DeviceView) -> tuple[str, int, int]:
    """The view's GPUTarget as a tuple (backend, arch, warp size)."""
    part = view.parts.get(PART)
    if part:
        backend, arch, warp_size = part["target"]
        return backend, arch, warp_size
    major, minor = view.capability
    return view.backend, major * 10 + minor, 32


def properties_of(view: DeviceView) -> dict:
    """The driver's device properties of the view (the H200's where the view has none of Triton's)."""
    part = view.parts.get(PART)
    return dict(part["properties"]) if part else dict(H200_PROPERTIES)


def view_for_target(target: GPUTarget) -> DeviceView:
    """A view of a GPU with ``target``, where there is none."""
    major, minor = divmod(int(target.arch), 10)
    part = {"target": [target.backend, int(target.arch), int(target.warp_size)], "properties": dict(H200_PROPERTIES)}
    return DeviceView.stand_in(target.backend, (major, minor), {PART: part})
