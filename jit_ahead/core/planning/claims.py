"""What providers plan in full, passed from one provider to the next by the planning run (part of the
provider API, ``providers/base.py``, declared here where planning uses it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claims:
    """What providers plan in full, so that the model-level planner need not: modules (by ``id`` of the
    model's own module) whose every launch a provider plans, and kernels (by name) a provider plans at
    every call wherever they are launched from."""

    modules: frozenset[int] = frozenset()
    kernels: frozenset[str] = frozenset()

    def __or__(self, other: "Claims") -> "Claims":
        return Claims(self.modules | other.modules, self.kernels | other.kernels)
