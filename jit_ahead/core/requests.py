"""Family-agnostic build requests and results: the only things the pool knows about a build."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
