"""Planning calls of the providers (probe forwards, shape-class samples) spread over forked processes.

``core/forked_calls.call_all`` and ``call_in_child`` with what a provider's calls need: as many
processes as planners (``JIT_AHEAD_PLANNERS``), and the meta shortcuts of a planner process installed in
each (a forked process runs nothing of the server's, so process-wide patches are safe there).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

log = logging.getLogger("jit_ahead.planning")

Item = TypeVar("Item")
Result = TypeVar("Result")


def call_all(function: Callable[[Item], object], items: Sequence[Item], workers: int | None = None) -> list:
    """``[function(item) for item in items]``, spread over ``workers`` forked processes (default: the
    planner count); a call that raises raises here, as it would in this thread."""
    from ..core.planning import forked_calls
    from ..core import knobs
    from . import meta_shortcuts

    workers = knobs.planner_count(quiet=True) if workers is None else workers
    return forked_calls.call_all(function, items, workers, enter=meta_shortcuts.install)


def call_in_child(function: Callable[[], Result], stop: Callable[[], bool],
                  cancelled: Callable[[], Result]) -> Result:
    """``function()`` in a process forked from this thread, with the meta shortcuts of a planner process,
    whose ``call_all`` forks processes of its own (``forked_calls.call_in_child``); ``cancelled()`` if
    ``stop()`` turned true meanwhile; in this thread where there are no planners (``JIT_AHEAD_PLANNERS=0``)
    or forking is not possible (a planner process, no fork), or the child gave no answer (one line)."""
    from ..core.planning import forked_calls
    from ..core import knobs
    from . import meta_shortcuts

    if knobs.planner_count(quiet=True) == 0 or not forked_calls.can_call_in_child():
        return function()
    try:
        return forked_calls.call_in_child(function, enter=meta_shortcuts.install, stop=stop)
    except forked_calls.NotAnswered as exc:
        if stop():
            return cancelled()
        log.warning("planning: the shape-class search's process gave no answer (%s); it runs in the planning "
                    "thread", str(exc).splitlines()[0])
        return function()
