"""Loading a helper-built CuTe DSL object in the server: ``cute.runtime.load_module`` (a few ms) and the
exported function, which takes the same arguments as the compiled ``cute.compile`` result."""
from __future__ import annotations

from pathlib import Path

from .build import object_path
from .request import CuteCompileRequest


def load(request: CuteCompileRequest, root: Path | None = None):
    """The callable for ``request`` from its object, or FileNotFoundError if it is not built."""
    import cutlass.cute as cute

    path = object_path(request, root)
    if not path.exists():
        raise FileNotFoundError(f"no CuTe DSL object for {request.label} at {path}")
    module = cute.runtime.load_module(str(path))
    return getattr(module, request.symbol)
