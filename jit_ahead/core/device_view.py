"""The server's view of its GPU, reproduced where there is no GPU.

Kernel libraries read the device when they are imported (flash-linear-attention picks block sizes and
even kernel source branches from the device name, capability and shared memory). A CPU-only helper, or a
planner on a machine without a GPU, must see the server's values or it plans and builds other variants.
A :class:`DeviceView` is captured from the live GPU in the server (or is the embedded sm_90 default on a
CPU-only machine), travels to helpers in their first message, and is installed there before any kernel
module is imported: torch's device queries answer with the recorded values. Families add their own part
of the view (``register_part_reader``: the Triton family reads its driver's target and properties, and
installs a stand-in driver with them where there is no GPU); the core knows none of them.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("jit_ahead.device_view")

# An H200 as torch and Triton report it (read on the H200 host; see
# results/2026-11-29-h200-helpers-roundtrip/device_view.json).
_H200_TORCH = {"L2_cache_size": 62914560, "clock_rate": 1980000, "gcnArchName": "NVIDIA H200",
               "is_integrated": 0, "is_multi_gpu_board": 0, "major": 9, "max_threads_per_block": 1024,
               "max_threads_per_multi_processor": 2048, "memory_bus_width": 6016,
               "memory_clock_rate": 3201000, "minor": 0, "multi_processor_count": 132, "name": "NVIDIA H200",
               "regs_per_multiprocessor": 65536, "shared_memory_per_block": 49152,
               "shared_memory_per_block_optin": 232448, "shared_memory_per_multiprocessor": 233472,
               "total_memory": 150109880320, "warp_size": 32}

# family name -> what that family reads of the live device (its index), JSON-able; see register_part_reader
_part_readers: dict[str, Callable[[int], dict]] = {}


def register_part_reader(family: str, reader: Callable[[int], dict]) -> None:
    """``reader(device)`` is called when a view is captured from the live GPU; what it returns is the view's
    ``parts[family]``. A family registers it when its module is imported."""
    _part_readers[family] = reader


@dataclass(frozen=True)
class DeviceView:
    name: str
    capability: tuple[int, int]
    torch_properties: dict = field(default_factory=dict)  # torch.cuda.get_device_properties() fields
    backend: str = "cuda"  # the GPU's programming interface: "cuda" or "hip"
    parts: dict = field(default_factory=dict)  # family name -> what that family read of the device
    device_count: int = 1

    @classmethod
    def h200(cls) -> "DeviceView":
        """The embedded default for CPU-only machines: an H200 (sm_90). Families fill in their own parts'
        defaults for it."""
        return cls("NVIDIA H200", (9, 0), dict(_H200_TORCH))

    @classmethod
    def stand_in(cls, backend: str, capability: tuple[int, int], parts: dict | None = None) -> "DeviceView":
        """A GPU of another architecture where there is none: the H200 default for sm_90, else only the
        architecture is known."""
        if (backend, tuple(capability)) == ("cuda", (9, 0)):
            return dataclasses.replace(cls.h200(), parts=dict(parts or {}))
        major, minor = capability
        return cls(f"jit_ahead stand-in sm_{major}{minor}", (major, minor),
                   {"name": f"sm_{major}{minor}", "major": major, "minor": minor}, backend, dict(parts or {}))

    @classmethod
    def capture(cls, device: int | None = None) -> "DeviceView | None":
        """The live GPU's view, or None when this process has no GPU."""
        import torch

        if not torch.cuda.is_available():
            return None
        device = torch.cuda.current_device() if device is None else device
        props = torch.cuda.get_device_properties(device)
        torch_properties = {k: getattr(props, k) for k in dir(props)
                            if not k.startswith("_") and isinstance(getattr(props, k), (int, float, str, bool))}
        parts = {}
        for family, reader in list(_part_readers.items()):
            try:
                parts[family] = reader(device)
            except Exception as exc:  # the torch part still helps libraries that only ask torch
                log.warning("could not read the %s family's device properties: %s", family, exc)
        backend = "hip" if getattr(torch.version, "hip", None) else "cuda"
        return cls(torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)),
                   torch_properties, backend, parts, torch.cuda.device_count())

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: object) -> "DeviceView":
        """A view written by ``to_json`` (``jit-ahead device-view`` on a GPU machine); ValueError naming what is
        wrong otherwise."""
        if not isinstance(data, dict):
            raise ValueError(f"a device view is a JSON object, not {type(data).__name__}")
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"a device view has no field {', '.join(sorted(unknown))}")
        try:
            name, capability = data["name"], data["capability"]
        except KeyError as exc:
            raise ValueError(f"a device view needs {exc.args[0]!r}") from None
        if not isinstance(name, str) or not (isinstance(capability, list) and len(capability) == 2
                                             and all(isinstance(v, int) for v in capability)):
            raise ValueError("a device view's name is a string and its capability [major, minor]")
        properties, parts = data.get("torch_properties", {}), data.get("parts", {})
        if not isinstance(properties, dict) or not isinstance(parts, dict):
            raise ValueError("a device view's torch_properties and parts are objects")
        return cls(name, (capability[0], capability[1]), properties, str(data.get("backend", "cuda")), parts,
                   int(data.get("device_count", 1)))

    def install_torch(self, force: bool = False) -> dict:
        """Make torch's device queries answer with this view: only where torch has no GPU of its own, or
        with ``force`` in a process forked from the server, which must not touch the GPU the server holds
        (CUDA cannot be used again in a fork). Returns what it replaced, for :func:`put_back`."""
        import torch

        if torch.cuda.is_available() and not force:
            return {}
        props = types.SimpleNamespace(**self.torch_properties)
        answers = {"get_device_name": lambda device=None: self.name,
                   "get_device_capability": lambda device=None: tuple(self.capability),
                   "get_device_properties": lambda device=None: props,
                   "device_count": lambda: self.device_count}
        if force:
            answers.update(is_available=lambda: True, current_device=lambda: 0)
        replaced = {name: getattr(torch.cuda, name) for name in answers}
        for name, answer in answers.items():
            setattr(torch.cuda, name, answer)
        return replaced


@dataclass(frozen=True)
class Installed:
    """What :func:`install` replaced: the view installed before and torch's own device queries."""
    view: DeviceView | None
    torch_queries: dict


_installed: DeviceView | None = None
_pinned: DeviceView | None = None


def install(view: DeviceView) -> Installed:
    """Show this process ``view`` (torch's device queries, where torch has no GPU). :func:`put_back` with
    the result undoes it."""
    global _installed
    before = Installed(_installed, view.install_torch())
    _installed = view
    return before


def put_back(before: Installed) -> None:
    global _installed
    import torch

    for name, query in before.torch_queries.items():
        setattr(torch.cuda, name, query)
    _installed = before.view


def pin(view: DeviceView) -> None:
    """In a process forked from the server (a planner): ``view`` is the GPU, whatever torch finds."""
    global _pinned
    view.install_torch(force=True)
    _pinned = view


def installed() -> DeviceView | None:
    return _installed


def current() -> DeviceView:
    """The view helpers must see: a pinned one, else the live GPU's, else the installed one, else the sm_90
    default."""
    return _pinned or DeviceView.capture() or _installed or DeviceView.h200()


class ViewOnDemand:
    """``current()``, read the first time something needs it (a helper's start, planning, records), not
    when the session starts: a ``JIT_AHEAD=1`` process that never plans or builds imports no torch and
    never asks the GPU for jit_ahead's sake."""

    def __init__(self) -> None:
        self._view: DeviceView | None = None
        self._lock = threading.Lock()

    def get(self) -> DeviceView:
        view = self._view
        if view is None:  # read outside the lock: a planner forked meanwhile must not inherit it held
            view = current()
            with self._lock:
                if self._view is None:
                    self._view = view
                view = self._view
        return view
