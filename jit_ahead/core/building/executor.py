"""What a launch on the executor does when the variant it needs is not loaded: the family-agnostic part.

The family describes the call as its variant and says whether it is built (on disk). Not built, the guard
speaks if serving has started, and the pool answers the miss (``HelperPool.obtain``): the build done, a
wait for the helper building it, or a build in place on the calling thread. Then the variant is loaded,
or, if no build came, the DSL compiles it its own way, as without jit_ahead.
"""
from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from ..observing import events
from .pool import HelperPool, Outcome
from ..observing.stats import Stats
from .table import State

log = logging.getLogger("jit_ahead.executor")
T = TypeVar("T")


class JitAfterReadyError(RuntimeError):
    """A kernel was about to compile on the executor after serving started (JIT_AHEAD_MODE=error)."""


def refuse_fallback_if_strict(guard: str, phase: str, what: str, exc: Exception) -> None:
    """Handling a miss failed, and the launch would compile the DSL's way: with ``JIT_AHEAD_MODE=error``
    after serving started, that compile is refused instead. A failure of jit_ahead's own (or of the data
    it reads) must never switch the guard off."""
    if guard == "error" and phase == "serving":
        raise JitAfterReadyError(
            f"{what}: a launch after serving started missed, and jit_ahead could not handle the miss "
            f"({type(exc).__name__}: {exc}); it would compile on the executor (JIT_AHEAD_MODE=error)") from exc


def kernel_of(request) -> str:
    """A request's kernel as the stats log and the report name it: ``module.qualname``."""
    return f"{request.module}.{request.qualname}"


class ExecutorBase:
    """The executor side every family shares: the variants planned (each new one a ``variant`` event, the
    coverage report compares against them), whether a variant is being built ahead, and the guard's
    report of a variant that needs a build after serving started; and what a launch does on a miss
    (``serve_miss``). Its table is its pool's, the one the pool's helpers build from."""

    family: ClassVar[str]
    dsl: ClassVar[str] = "the DSL"  # what compiles a variant no build came for, in the log line that says so

    def __init__(self, pool: HelperPool, stats: Stats, wait_timeout: float, guard: str = "warn") -> None:
        self.pool = pool
        self.table = pool.table
        self.stats = stats
        self.wait_timeout = wait_timeout
        self.guard = guard
        self._lock = threading.Lock()
        self._planned: dict[str, Any] = {}  # key -> the planned (or recorded) request
        self.recorder: Callable[[Any], None] | None = None  # each variant the server meets (records)
        # what the guard says of planning: set by the session (True once every planning run finished)
        self.planning_finished: Callable[[], bool] = lambda: True

    def build_here(self, payload: Any) -> dict | None:
        """The build a helper runs, on the calling thread (the launch builds in place): the family's builder
        module's ``build``, unless the family says otherwise."""
        return importlib.import_module(self.pool.family.builder).build(payload)

    @staticmethod
    def key_of(request: Any) -> str:
        """The request's artifact key (its BuildRequest's key): its ``key``, unless the family says otherwise."""
        return request.key

    def _take_new(self, request: Any) -> bool:
        """Note ``request`` as planned; True if it was not (called with the lock held)."""
        key = self.key_of(request)
        if key in self._planned:
            return False
        self._planned[key] = request
        return True

    def _variant_fields(self, request: Any) -> dict:
        """What the ``variant`` event says of a request beyond its key, kernel and label."""
        return {}

    def note_planned(self, requests: Iterable, source: str = "plan") -> None:
        """Remember planned (or recorded: ``source="record"``) variants; each new one goes to the stats log
        once."""
        with self._lock:
            new = [request for request in requests if self._take_new(request)]
        for request in new:
            self.stats.emit(events.Variant(family=self.family, key=self.key_of(request), kernel=kernel_of(request),
                                           label=request.label, source=source, **self._variant_fields(request)))

    def is_planned(self, key: str) -> bool:
        with self._lock:
            return key in self._planned

    def planned_requests(self) -> list:
        """Every request noted as planned or recorded so far."""
        with self._lock:
            return list(self._planned.values())

    def building_ahead(self, key: str):
        """Its ticket when a helper is building it or it is queued (planned, not built yet), else None."""
        ticket = self.table.get(key)
        return ticket if ticket is not None and ticket.state in (State.QUEUED, State.RUNNING) else None

    def report_unplanned(self, label: str, key: str | None, message: str) -> None:
        """The guard: a variant needs a build after serving started. A ``guard`` event, then an error
        (JIT_AHEAD_MODE=error) or a warning."""
        self.stats.emit(events.Guard(family=self.family, key=key, label=label, mode=self.guard, message=message))
        if self.guard == "error":
            raise JitAfterReadyError(message + " (JIT_AHEAD_MODE=error)")
        log.warning("%s (JIT_AHEAD_MODE=warn)", message)

    def guarding(self) -> bool:
        """True when a build now is one the guard reports: serving started and the guard is on."""
        return self.guard != "off" and self.stats.phase == "serving"

    def record_met(self, variant: Any) -> None:
        """Hand a variant the server met to the records, if they are on."""
        if self.recorder is not None:
            self.recorder(variant)

    def serve_miss(self, variant: Any, *, built: bool, load: Callable[[], T] | None = None,
                   compile_here: Callable[[], T] | None = None, t0: float | None = None,
                   rebuilding: bool = False) -> T | None:
        """A call that missed the DSL's memory, for ``variant`` (described since ``t0``,
        ``time.perf_counter``): built already (``built``), it is loaded (``load``; None: the DSL loads it
        itself). Otherwise the guard speaks if serving has started (unless the launch ``rebuilding`` a
        damaged entry), the pool builds it or waits for it, and it is loaded. A build that failed or a wait
        that timed out leaves the compile to the DSL (``compile_here``; None: the DSL goes on to compile
        it), as without jit_ahead. One ``executor_miss`` event either way."""
        t0 = time.perf_counter() if t0 is None else t0
        self.record_met(variant)
        request = variant.build_request()
        fields = dict(family=self.family, key=request.key, label=request.label, kernel=kernel_of(variant))
        if built:
            loaded = load() if load is not None else None
            self.stats.emit(events.ExecutorMiss(outcome="disk", seconds=time.perf_counter() - t0, waited=0.0,
                                                planned=self.is_planned(request.key), **fields))
            return loaded
        if not rebuilding and self.guarding():  # a damaged entry's rebuild is no planning gap: it has its line
            ticket = self.building_ahead(request.key)
            if ticket is not None:  # planned, not built yet: the launch waits for it (raised to URGENT) or builds it
                log.warning("%s was planned but is still %s (%s, %d queued ahead) when serving needs it",
                            request.label, ticket.state.value, ticket.priority.name, self.table.queued_ahead(ticket))
            else:
                self.report_unplanned(request.label, request.key, self.unplanned_message(variant))
        fields.update(self._before_wait(variant))
        answer = self.pool.obtain(request, self.build_here, self.wait_timeout)
        fields.update(outcome=answer.outcome.value, planned=self.is_planned(request.key), waited=answer.seconds)
        if answer.outcome is Outcome.FALLBACK:
            self.stats.emit(events.ExecutorMiss(seconds=time.perf_counter() - t0, **fields))
            log.warning("%s: no build ahead (see above); %s compiles it in place", request.label, self.dsl)
            return compile_here() if compile_here is not None else None
        loaded = load() if load is not None else None
        self.stats.emit(events.ExecutorMiss(seconds=time.perf_counter() - t0, **fields))
        return loaded

    def unplanned_message(self, variant: Any) -> str:
        """What the guard says of a variant that needs a build after serving started and was not planned."""
        return f"{variant.label} was not planned and needs a compile after serving started"

    def _before_wait(self, variant: Any) -> dict:
        """What the family does before a launch that missed waits or builds, and the fields that adds to
        its ``executor_miss`` event (nothing, unless the family says otherwise)."""
        return {}

    def build_queued(self, priority, deadline: float | None) -> None:
        """Build what is queued at ``priority`` or higher on the calling thread (``HelperPool.build_queued``)."""
        self.pool.build_queued(self.build_here, priority, deadline)
