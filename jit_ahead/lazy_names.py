"""Package attributes imported on first use: a package's ``__getattr__`` that finds each public name in
one of its modules. Keeps ``import jit_ahead.<family>`` free of the family's DSL and planning modules."""
from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """``where``: public name -> the package's module that defines it."""

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
