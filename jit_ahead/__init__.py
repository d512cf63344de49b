"""jit_ahead: compile-ahead helper pool for JIT kernels. See README.md.

Names are resolved lazily, so that the start-up hook (``jit_ahead.pth`` -> ``jit_ahead.autostart``)
imports nothing but itself in processes that never use Triton."""

__all__ = ["Priority", "Session", "current", "start", "stop", "__version__"]


def __getattr__(name: str):
    if name == "__version__":  # kept with the core, whose saved plans are keyed by it
        from .core import __version__

        return __version__
    if name == "Priority":
        from .core.priority import Priority

        return Priority
    if name in ("current", "start"):  # a JIT_AHEAD=1 session put off until the first compile starts then
        from . import autostart

        return getattr(autostart, name)
    if name in ("Session", "stop"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module 'jit_ahead' has no attribute {name!r}")
