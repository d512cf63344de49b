"""Family-agnostic build requests and results (the only things the pool knows about a build), and the
variants that make them.

A variant that knows itself: one frozen description of one buildable kernel variant.

What the family base (``core/family.py``) and the executor ask of a variant, in the spirit of FlashInfer's
``JitSpec`` and vLLM's ``CompileKey``: its name for the stats log (``module``, ``qualname``, ``label``),
whether it is built in the place the server's DSL loads it from, and the build a helper (or the executor,
in place) runs for it, which carries its key. Each family's request type is one (``TritonCompileRequest``,
``CuteCompileRequest``, ``TileLangCompileRequest``, DeepGEMM's ``RecordedKernel``, the toy's
``ToyRequest``); it is frozen and picklable, since helpers receive it and saved plans and records hold it.

``VariantBase`` holds what most variants share (a label from module, qualname and key; the build request
of a helper that imports the kernel's module); a variant type derives from it and names its family.

A family whose "is it built" needs more than the variant (Triton: a damaged entry is removed by the
executor's rule and built again) answers it in its ``_needs_build`` instead of ``is_built``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class BuildRequest:
    """One artifact to build.

    ``key`` is the family's own artifact key (for Triton: the predicted disk hash); requests are
    deduplicated by it. ``payload`` is whatever the family's builder needs and must pickle.
    ``modules`` are imported by helpers ahead of the build (preloading) so the first build of a
    kernel module does not pay its import.
    """

    family: str
    key: str
    payload: Any
    label: str
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildResult:
    """What a builder reports. ``builder`` names who built it: ``helper-N`` or ``executor``."""

    key: str
    ok: bool
    seconds: float
    builder: str
    error: str | None = None
    details: dict = field(default_factory=dict)

    @property
    def found(self) -> bool:
        """The builder compiled nothing: the entry was on disk already (a family that says so: ``compiled``
        False in its details)."""
        return self.ok and (self.details or {}).get("compiled") is False


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


class VariantBase:
    """What most variants share. A derived frozen dataclass names its ``family`` and has ``module``,
    ``qualname`` and ``key``; ``build_modules`` (the kernel's module by default) are what a helper imports
    before it builds the variant."""

    family: ClassVar[str]

    @property
    def build_modules(self) -> tuple[str, ...]:
        return (self.module,)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.qualname}[{self.key[:12]}]"

    def build_request(self) -> BuildRequest:
        return BuildRequest(family=self.family, key=self.key, payload=self, label=self.label,
                            modules=tuple(self.build_modules))
