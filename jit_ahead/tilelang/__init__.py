"""The TileLang family (extra ``[tilelang]``): TileLang kernels captured without lowering and built ahead in
CPU-only helpers into TileLang's own kernel cache. The public names are imported on first use: this package
imports no TileLang until one of them is."""
from __future__ import annotations

from ..lazy_names import lazy_names

_PUBLIC = {"capture": "plan", "plan_call": "plan", "Captured": "hook", "TileLangCompileRequest": "request"}

__all__ = list(_PUBLIC)
__getattr__ = lazy_names(__name__, _PUBLIC)
