"""The Triton family: plan (capture), build (helpers), load (executor hook)."""
from .plan import Capture, capture, plan_launch
from .request import TritonCompileRequest
from .standin import StandInDriver, ensure_driver

__all__ = ["Capture", "capture", "plan_launch", "TritonCompileRequest", "StandInDriver", "ensure_driver"]
