"""jit_ahead: build JIT kernel variants ahead in CPU-only helper processes, so serving never compiles."""
from .core.priority import Priority
from .core.session import Session, current, start, stop

__version__ = "0.1.0"
__all__ = ["Priority", "Session", "current", "start", "stop", "__version__"]
