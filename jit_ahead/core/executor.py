"""What a launch on the executor does when the variant it needs is not loaded: the family-agnostic part.

The family has already checked the disk. Here the launch either finds the build done, waits for a
helper that is building it, or builds it in place on the calling thread, whichever the measured build
times say is faster (core/build_cost.py), and never two builds of one key.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from . import events
from .pool import HelperPool
from .priority import Priority
from .requests import BuildRequest, BuildResult
from .stats import Stats
from .table import State

log = logging.getLogger("jit_ahead.executor")
T = TypeVar("T")

# How often a launch waiting on a queued (not yet started) request re-decides between waiting and
# building in place: the helpers' load and the queue change while it waits.
_REDECIDE_S = 0.05
# A launch blocked longer than this on its build is reported (a ``wait`` event with its cause).
LONG_WAIT_S = 0.5


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


class Outcome(enum.Enum):
    READY = "ready"  # a build finished (possibly after a wait): load it
    BUILT_HERE = "built_here"  # this thread built it in place
    FALLBACK = "fallback"  # failed, quarantined or timed out: the DSL's normal path compiles


def kernel_of(request) -> str:
    """A request's kernel as the stats log and the report name it: ``module.qualname``."""
    return f"{request.module}.{request.qualname}"


class ExecutorBase(ABC):
    """The executor side every family shares: the variants planned (each new one a ``variant`` event, the
    coverage report compares against them), whether a variant is being built ahead, and the guard's
    report of a variant that needs a build after serving started; and what a launch does on a miss
    (``obtain``). Its table is its pool's, the one the pool's helpers build from."""

    family: ClassVar[str]

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

    @staticmethod
    @abstractmethod
    def build_here(payload: Any) -> dict | None:
        """The build a helper runs, on the calling thread (the launch builds in place)."""

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

    def serve_miss(self, variant: Any, t0: float, *, built: bool, load: Callable[[], T], compile_here: Callable[[], T],
                   dsl: str, why: str = "was not planned") -> T:
        """A call that missed the DSL's memory, for ``variant`` (described at ``t0``, ``time.perf_counter``):
        built already (``built``), it is loaded; otherwise the guard reports a variant that needs a build
        after serving started and no helper is building, then ``obtain`` waits for a helper or builds it
        here, and it is loaded. A build that failed or a wait that timed out leaves the compile to the DSL
        (``compile_here``), as without jit_ahead. One ``executor_miss`` event either way."""
        request = variant.build_request()
        if built:
            outcome, waited = "disk", 0.0
        else:
            if self.guarding() and not self.building_ahead(request.key):
                self.report_unplanned(request.label, request.key,
                                      f"{request.label} {why} and needs a compile after serving started")
            result, waited = self.obtain(request, self.build_here)
            outcome = result.value
        fields = dict(family=self.family, key=request.key, label=request.label, kernel=kernel_of(variant),
                      outcome=outcome, planned=self.is_planned(request.key))
        if outcome == Outcome.FALLBACK.value:
            self.stats.emit(events.ExecutorMiss(seconds=time.perf_counter() - t0, **fields))
            log.warning("%s: no build ahead (see above); %s compiles it in place", request.label, dsl)
            return compile_here()
        loaded = load()
        self.stats.emit(events.ExecutorMiss(seconds=time.perf_counter() - t0, waited=waited, **fields))
        return loaded

    def obtain(self, request: BuildRequest, build_here: Callable[[Any], dict | None]) -> tuple[Outcome, float]:
        """Make sure ``request`` is built before the launch goes on, waiting at most ``wait_timeout``;
        returns the outcome and seconds spent. ``build_here(payload)`` is the family's build on the calling
        thread: it returns the result's details and raises on failure. A wait over LONG_WAIT_S is one
        ``wait`` event naming what held it."""
        t0 = time.monotonic()
        cause: list[str] = []
        outcome = self._obtain(request, build_here, t0, cause)
        seconds = time.monotonic() - t0
        if seconds > LONG_WAIT_S and cause:
            self.stats.emit(events.Wait(family=self.family, key=request.key, label=request.label,
                                        seconds=seconds, cause=cause[0], outcome=outcome.value))
        return outcome, seconds

    def _obtain(self, request: BuildRequest, build_here, t0: float, cause: list[str]) -> Outcome:
        pool, table = self.pool, self.table
        deadline = t0 + self.wait_timeout
        pool.preload(request.modules)  # so that helpers are ready for this library's next variants
        if not pool.helper_has_modules(request):
            # A helper would import the kernel library before compiling (seconds, where the compile alone
            # is often under one): build here unless a helper is already on it.
            ticket, claimed = pool.submit_claimed(request, Priority.URGENT, "executor")
            if claimed:
                return self._build_in_place(ticket, build_here)
        else:
            ticket = pool.submit(request, Priority.URGENT)
        while True:
            state = ticket.state
            if state is State.DONE:
                return Outcome.READY
            if state in (State.FAILED, State.QUARANTINED) or pool.closed:
                return Outcome.FALLBACK
            if state is State.QUEUED and pool.prefer_in_place(ticket) and table.claim(ticket, "executor"):
                return self._build_in_place(ticket, build_here)
            if not cause:
                cause.append(self._holding(ticket))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("waited %.1fs for %s (%s by %s); giving up the wait and compiling in place "
                            "(JIT_AHEAD_WAIT_TIMEOUT_S)", self.wait_timeout, request.label, state.value, ticket.owner)
                return Outcome.FALLBACK
            table.wait_for_change(ticket, min(remaining, _REDECIDE_S) if state is State.QUEUED else remaining)

    def _holding(self, ticket) -> str:
        """What a launch about to wait on ``ticket`` waits for, in words (the ``wait`` event's cause)."""
        if ticket.state is State.RUNNING:
            since = time.monotonic() - (ticket.started_at or time.monotonic())
            if ticket.owner == "executor":
                return f"another launch was building it in place (for {since:.1f}s)"
            return f"{ticket.owner} was building it (for {since:.1f}s)"
        load = self.pool.load_seen_by(ticket)
        if not load.live_helpers:
            return "queued while helpers were starting"
        return (f"queued behind {load.queued_ahead} other requests, {len(load.busy_for)} of "
                f"{load.live_helpers} helpers busy")

    def build_queued(self, priority: Priority, deadline: float | None) -> None:
        """No helper will build (none configured, or every slot gave up): build what is queued at
        ``priority`` or higher on the calling thread, one at a time, until nothing is left or ``deadline``
        (monotonic) passes. A request a launch is building meanwhile is not taken twice."""
        while not self.pool.closed and (deadline is None or time.monotonic() < deadline):
            ticket = self.table.take_next("executor", 0.0, up_to=priority)
            if ticket is None:
                return
            self._build_in_place(ticket, self.build_here)

    def _build_in_place(self, ticket, build_here) -> Outcome:
        request = ticket.request
        t0 = time.perf_counter()
        try:
            details = build_here(request.payload) or {}
            result = BuildResult(request.key, True, time.perf_counter() - t0, "executor", details=details)
        except Exception as exc:  # reported below; the DSL's normal path then compiles it
            result = BuildResult(request.key, False, time.perf_counter() - t0, "executor",
                                 f"{type(exc).__name__}: {exc}")
        self.table.finish(ticket, result)
        self.stats.emit(events.BuildFinish(family=request.family, key=request.key, label=request.label,
                                           helper="executor", ok=result.ok, error=result.error,
                                           seconds=result.seconds, found=result.found))
        if result.ok:
            self.pool.cost.local_build(result.seconds)
            return Outcome.BUILT_HERE
        log.error("building %s in place failed:\n%s", request.label, result.error)
        return Outcome.FALLBACK
