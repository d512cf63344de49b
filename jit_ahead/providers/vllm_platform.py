"""vLLM's device queries in a planner process: vLLM's own answer where it can give one, else the server's
device view.

vLLM's CUDA platform asks NVML for the device's name (the fused-MoE config file it reads is named after
it) and its capability (kernels' support checks). A planner is a process forked from the worker, which
has already opened NVML and a CUDA context; there NVML's calls can fail (NVML_ERROR_OPERATING_SYSTEM on an
H200 host), and every launch that asks would fail with them. In a planner, a query that raises is
answered from the device view the server read before forking, as torch.cuda's are (``device_view.pin``).
The server's own threads keep vLLM's platform as it is.
"""
from __future__ import annotations

import logging

from .base import Provider

log = logging.getLogger("jit_ahead.providers.vllm")

QUERIES = ("get_device_name", "get_device_capability", "has_device_capability")


def _answer(name: str, view):
    from vllm.platforms.interface import DeviceCapability

    capability = DeviceCapability(*view.capability)
    if name == "get_device_name":
        return lambda device_id=0: view.name
    if name == "get_device_capability":
        return lambda device_id=0: capability

    def has_device_capability(wanted, device_id=0):
        return capability >= wanted if isinstance(wanted, tuple) else capability.to_int() >= wanted

    return has_device_capability


def answer_failed_queries_from_view() -> None:
    """In this (planner) process, for the lifetime of the process: each of vLLM's platform queries in
    ``QUERIES`` that raises is answered from the pinned device view instead, with one line per query."""
    from vllm.platforms import current_platform

    from ..core import device_view

    view = device_view.current()  # the server's, pinned when the planner started
    platform = type(current_platform)
    for name in QUERIES:
        original = getattr(platform, name)  # bound to the class: a classmethod
        if getattr(original, "_jit_ahead_view", False):
            continue
        fallback = _answer(name, view)

        def query(cls, *args, _original=original, _fallback=fallback, _name=name, **kwargs):
            try:
                return _original(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - NVML in a forked process; the view holds the answer
                if _name not in _failed:
                    _failed.add(_name)
                    log.info("planner: vLLM's %s failed here (%s: %s); answered from the server's device "
                             "view (%s, sm_%d%d)", _name, type(exc).__name__, exc, view.name, *view.capability)
                return _fallback(*args, **kwargs)

        query._jit_ahead_view = True
        setattr(platform, name, classmethod(query))


_failed: set[str] = set()


class VllmProvider(Provider):
    """A provider of vLLM's kernels: in a planner process, vLLM's device queries work (see above)."""

    def __init__(self, vllm_config=None) -> None:
        self.vllm_config = vllm_config  # the worker's; None: the current one (vLLM's model construction sets it)

    def enter_planner(self) -> None:
        answer_failed_queries_from_view()
