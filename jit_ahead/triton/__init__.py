"""The Triton family: plan (capture), build (helpers), load (executor hook).

The public names below are imported on first use: a ``JIT_AHEAD=1`` process that never plans does not pay
for planning's modules."""
from __future__ import annotations

from ..lazy_names import lazy_names

_PUBLIC = {"Capture": "plan", "capture": "plan", "plan_launch": "plan", "TritonCompileRequest": "request",
           "StandInDriver": "standin", "ensure_driver": "standin"}

__all__ = list(_PUBLIC)
__getattr__ = lazy_names(__name__, _PUBLIC)
