"""A variant that knows itself: one frozen description of one buildable kernel variant.

What the family base (``core/family.py``) and the executor ask of a variant, in the spirit of FlashInfer's
``JitSpec`` and vLLM's ``CompileKey``: its name for the stats log (``module``, ``qualname``, ``label``),
whether it is built in the place the server's DSL loads it from, and the build a helper (or the executor,
in place) runs for it, which carries its key. Each family's request type is one (``TritonCompileRequest``,
``CuteCompileRequest``, ``TileLangCompileRequest``, DeepGEMM's ``RecordedKernel``, the toy's
``ToyRequest``); it is frozen and picklable, since helpers receive it and saved plans and records hold it.

A family whose "is it built" needs more than the variant (Triton: a damaged entry is removed by the
executor's rule and built again) answers it in its ``_needs_build`` instead of ``is_built``.
"""
from __future__ import annotations

from typing import Protocol

from .requests import BuildRequest


class Variant(Protocol):
    module: str  # the kernel's module, as the stats log and the report name it (``module.qualname``)
    qualname: str

    @property
    def label(self) -> str:
        """How logs name it: ``module.qualname[key prefix]``."""

    def build_request(self) -> BuildRequest:
        """The build a helper runs for it: its key, its payload (this variant) and the libraries to import."""

    def is_built(self) -> bool:
        """Whether its build is where the server's DSL loads it from (so nothing is queued for it)."""
