"""Planning calls of the providers (probe forwards, shape-class samples) spread over forked processes.

``core/forked_calls.call_all`` with what a provider's calls need: as many processes as planners
(``JIT_AHEAD_PLANNERS``), and the meta shortcuts of a planner process installed in each (a forked
process runs nothing of the server's, so process-wide patches are safe there).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Item = TypeVar("Item")


def call_all(function: Callable[[Item], object], items: Sequence[Item], workers: int | None = None) -> list:
    """``[function(item) for item in items]``, spread over ``workers`` forked processes (default: the
    planner count); a call that raises raises here, as it would in this thread."""
    from ..core import forked_calls, knobs
    from . import meta_shortcuts

    workers = knobs.planner_count(quiet=True) if workers is None else workers
    return forked_calls.call_all(function, items, workers, enter=meta_shortcuts.install)
