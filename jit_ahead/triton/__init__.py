"""The Triton family: plan (capture), build (helpers), load (executor hook).

The public names below are imported on first use: a ``JIT_AHEAD=1`` process that never plans does not pay
for planning's modules."""
from __future__ import annotations

import importlib

_PUBLIC = {"Capture": "plan", "capture": "plan", "plan_launch": "plan", "TritonCompileRequest": "request",
           "StandInDriver": "standin", "ensure_driver": "standin"}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
