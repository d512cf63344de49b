"""The family-agnostic core: requests, priorities, the request table, the helper pool, stats, session.

Names are resolved lazily: the ``JIT_AHEAD=1`` start-up imports single modules of the core (knobs) and must
not pay for the others."""

__version__ = "0.1.0"  # jit_ahead's (pyproject.toml's): saved plans are keyed by it
__all__ = ["Priority", "BuildRequest", "BuildResult", "__version__"]


def __getattr__(name: str):
    if name == "Priority":
        from .priority import Priority

        return Priority
    if name in ("BuildRequest", "BuildResult"):
        from . import requests

        return getattr(requests, name)
    raise AttributeError(f"module 'jit_ahead.core' has no attribute {name!r}")
