"""A family-agnostic pool of long-lived helper subprocesses.

Each helper slot is served by one thread that starts the helper, hands it one job at a time from the
request table, and reads the result. A helper that dies (exit, signal, ``kill -9``) closes its pipe, so
the slot thread sees end-of-stream at once, gives the job's claim back to the table (waiters wake and
may build in place) and starts a new helper after a backoff. The pool knows nothing about any DSL:
the family names a builder module that helpers import, and its requests carry opaque payloads.

A launch that misses asks the pool for its variant (``obtain``): the pool finds the build done, waits for
the helper building it, or has the launch build it in place on its own thread, whichever the measured
build times say is faster (core/building/build_cost.py), and never two builds of one key.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..observing import events
from .build_cost import BuildCost, HelperLoad
from ..device_view import DeviceView, ViewOnDemand
from ..knobs import checked_process_count, checked_seconds
from ..observing.own_cpu import OwnThread
from ..priority import Priority
from ..requests import BuildRequest, BuildResult
from ..observing.stats import Stats
from .table import RequestTable, State, Ticket

# The process machinery (starting helpers, the fork server, the messages) is imported when the first
# request is queued: a process that never builds anything never pays for it.
if TYPE_CHECKING:
    from .helper_process import HelperProcess, HelperEnding
    from .helper_starter import HelperStarter

log = logging.getLogger("jit_ahead.pool")


@dataclass(frozen=True)
class FamilySpec:
    """What the pool needs to know about a family: its name and the builder helpers import."""

    name: str
    builder: str  # the module helpers import: core/family.py's Builder (prepare, then build per request)
    workers_knob: str
    preload_knob: str  # modules helpers import as soon as they start


class Outcome(enum.Enum):
    """What a launch that missed goes on with."""

    READY = "ready"  # a build finished (possibly after a wait): load it
    BUILT_HERE = "built_here"  # this thread built it in place
    FALLBACK = "fallback"  # failed, quarantined or timed out: the DSL's normal path compiles


@dataclass(frozen=True)
class MissOutcome:
    """The pool's answer to a launch that missed: the outcome, and the seconds the launch spent on it."""

    outcome: Outcome
    seconds: float


# The family's build of one payload on the calling thread (a helper's build): the result's details.
BuildHere = Callable[[Any], "dict | None"]

# A launch blocked longer than this on its build is reported (a ``wait`` event with its cause).
LONG_WAIT_S = 0.5
# How often a launch waiting on a queued (not yet started) request re-decides between waiting and
# building in place: the helpers' load and the queue change while it waits.
_REDECIDE_S = 0.05

# A helper with nothing to take for this long exits (it holds host memory); planning queues its finds at
# shorter intervals, so a helper does not exit between two of them.
HELPER_IDLE_S = 0.5


class HelperPool:
    """Helper slots for one family, building what its request table queues.

    ``workers=0`` starts no helpers: requests stay queued and every miss builds in place. The slots'
    threads start with the first request queued after ``start()``, helpers when a slot takes work. How
    helpers are started (``start_mode``: forked from a fork server, or spawned) is the ``HelperStarter``'s;
    how long builds take, and whether a launch waits for a helper, the ``BuildCost``'s. ``table``: the
    pool's own; the family's executor claims from it too.

    Beside the ``workers`` slots, one more (the urgent slot, ``helper-urgent``) builds only what a launch
    is blocked on (URGENT), so that such a build never waits for a helper to finish a BACKGROUND one;
    while it builds, the helpers busy with work below WARMUP are paused (SIGSTOP), so that it has the
    CPUs, and resumed once it is done.
    """

    def __init__(self, family: FamilySpec, *, workers: int, stats: Stats,
                 env_overrides: dict[str, str] | None = None,
                 device_view: DeviceView | ViewOnDemand | None = None,
                 python: str = sys.executable,
                 build_timeout: float = 600.0, start_timeout: float = 120.0, quarantine_after: int = 2,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0, max_start_failures: int = 5,
                 start_mode: str = "server", serving_workers: int | None = None) -> None:
        checked_process_count("workers", workers)
        if serving_workers is not None:
            checked_process_count("serving_workers", serving_workers)
        checked_seconds("build_timeout", build_timeout, minimum=1.0)
        checked_seconds("start_timeout", start_timeout, minimum=1.0)
        self.family = family
        self.workers = workers
        # Helpers that keep building once serving starts: beside a busy executor, a full set of helpers
        # slows it down even at nice 19 (they compete for the CPUs its Python thread runs on), while
        # before serving the executor mostly waits for them. Measured: docs/benchmarks.md, CPU politeness.
        self.serving_workers = workers if serving_workers is None else min(workers, serving_workers)
        self.stats = stats
        # what is queued, building and built: the pool owns it; the family's executor claims from it too
        self.table = RequestTable(quarantine_after=quarantine_after)
        self.cost = BuildCost()
        self._build_timeout = build_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._max_start_failures = max_start_failures
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._retire = threading.Event()  # set at the start of serving: helpers exit once the queue is empty
        if start_mode not in ("server", "fork", "spawn"):
            raise ValueError(f"start_mode must be 'server', 'fork' or 'spawn', not {start_mode!r}")
        self._starter_options = dict(env_overrides=env_overrides or {}, device_view=device_view,
                                     start_mode=start_mode, start_timeout=start_timeout, python=python)
        self._starter: HelperStarter | None = None
        self._preloads: list[str] = []  # what every helper imports before its next build, in the order asked
        self._preloads_lock = threading.Lock()  # its own: the starter reads it from any thread, under any lock
        self._threads: list[threading.Thread] = []
        self._slots_started = False
        self._helpers: dict[int, HelperProcess] = {}
        self._starting = 0  # slots that are starting a helper right now
        self._slots_running = 0  # slot threads that have not given up or stopped (they restart helpers)
        self._urgent_slot = workers if workers else None  # the slot that builds only URGENT requests
        self._urgent_running = False  # its thread has not given up or stopped
        self._building: dict[int, tuple[HelperProcess, Ticket]] = {}  # slot -> the helper and its build
        self._started = False
        self._job_ids = itertools.count(1)
        self._last_busy = time.monotonic()  # when a helper last ran (the fork server's idle clock)

    @classmethod
    def from_knobs(cls, family: FamilySpec, stats: Stats, *, workers: int | None,
                   env_overrides: dict[str, str], device_view: DeviceView | ViewOnDemand) -> "HelperPool":
        """A family's pool as the environment configures it (helper counts, build timeout, start mode),
        with the modules of the family's preload knob queued for helpers."""
        from .. import knobs

        pool = cls(family, workers=knobs.worker_count(family.workers_knob) if workers is None else workers,
                   stats=stats, env_overrides=env_overrides, device_view=device_view,
                   build_timeout=knobs.build_timeout_s(), start_mode=knobs.helper_start_mode(),
                   serving_workers=knobs.serving_worker_count())
        pool.preload(knobs.preload_modules(family.preload_knob))
        return pool

    @property
    def starter(self) -> HelperStarter:
        """What starts this pool's helpers (made, and its modules imported, on first use: outside the
        pool's lock, which launches read the helpers' state under)."""
        with self._lock:
            if self._starter is not None:
                return self._starter
        from .helper_env import helper_environment
        from .helper_starter import HelperStarter

        options = self._starter_options
        made = HelperStarter(self.family.name, self.family.builder, self.stats,
                             env=helper_environment(os.environ, options["env_overrides"]),
                             device_view=options["device_view"], start_mode=options["start_mode"],
                             start_timeout=options["start_timeout"], build_timeout=self._build_timeout,
                             closed=self._closed, serving=self._retire, python=options["python"],
                             preloads=lambda: self.preloads)
        with self._lock:
            if self._starter is None:
                self._starter = made
            return self._starter

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        """From now on, queued work starts the slots (at once if some is queued already)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self._slots_running = self.workers
            self._urgent_running = self._urgent_slot is not None
        if self.table.has_queued():
            self._start_slots()

    def _start_slots(self) -> None:
        """The slot threads, once: each starts a helper when it takes work."""
        with self._lock:
            if not self._started or self._slots_started or self._closed.is_set() or not self.workers:
                return
        try:
            self.starter  # noqa: B018 - made (its modules imported) before any slot needs it
        except Exception as exc:  # a bug guard: a submit must not fail for the helpers' sake
            with self._lock:
                self._slots_started, self._slots_running = True, 0
            log.error("%s: helpers cannot be started (%s: %s); misses build in place", self.family.name,
                      type(exc).__name__, exc)
            return
        with self._lock:  # started under the lock: close() never sees a thread it cannot join yet
            if self._slots_started or self._closed.is_set():
                return
            self._slots_started = True
            for slot in range(self.workers):
                thread = OwnThread(target=self._slot_main, args=(slot,), daemon=True,
                                   name=f"jit_ahead-{self.family.name}-slot{slot}",
                                   kind=f"jit_ahead-{self.family.name}-slots")
                try:
                    thread.start()
                except RuntimeError as exc:  # at a thread or process limit: fewer slots, never a failed submit
                    self._slots_running -= self.workers - slot
                    log.error("%s: %d of %d helper slots could not start (%s); %s", self.family.name,
                              self.workers - slot, self.workers, exc,
                              f"running with {slot}" if slot else "misses build in place")
                    self._urgent_running = False  # at the limit: this one would fail too
                    break
                self._threads.append(thread)
            if self._urgent_running:
                thread = OwnThread(target=self._slot_main, args=(self._urgent_slot,), daemon=True,
                                   name=f"jit_ahead-{self.family.name}-slot-urgent")
                try:
                    thread.start()
                    self._threads.append(thread)
                except RuntimeError as exc:
                    self._urgent_running = False
                    log.error("%s: the urgent helper slot could not start (%s); blocked launches wait for "
                              "the other helpers", self.family.name, exc)

    def close(self, grace: float = 5.0) -> None:
        """Stop taking work, ask helpers to exit, kill those that do not within ``grace`` seconds."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.table.close()
        with self._lock:
            helpers = list(self._helpers.values())
            starter, threads = self._starter, list(self._threads)
            if not self._slots_started:  # no slot will ever run: none may get a helper
                self._slots_started, self._slots_running = True, 0
        from .helper_process import resume

        for helper in helpers:
            resume(helper)  # one paused for an urgent build could not read its shutdown
            helper.ask_to_exit()  # an idle helper exits at once; a busy one after its build
        deadline = time.monotonic() + grace  # one deadline for all, not ``grace`` per helper
        late = [helper for helper in helpers if not helper.exited_within(max(0.0, deadline - time.monotonic()))]
        for helper in late:  # all killed before any is waited for: their exits overlap
            helper.kill_tree()
        for helper in late:
            helper.reap()
        # before joining the slots: one may be waiting on the fork server (an import), which this ends
        if starter is not None:
            starter.close_forkserver(max(0.0, deadline - time.monotonic()))
        for thread in threads:
            thread.join(timeout=grace + 1)
        if starter is not None:  # after the slots: one may be starting a process on its thread until then
            starter.close_spawner()

    def retire_when_idle(self) -> None:
        """Serving has started: helpers beyond ``serving_workers`` exit after their current build, the
        others once nothing is queued (they hold host memory); misses after that build in place. Work
        still queued (REPLAY, BACKGROUND, SPARE) is finished first, by the remaining helpers."""
        self._retire.set()
        self.table.notify()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- requests ------------------------------------------------------------------------------------
    def submit(self, request: BuildRequest, priority: Priority) -> Ticket:
        self._check_family(request)
        ticket, change = self.table.submit_reporting(request, priority)
        self._report_submit(request, ticket, change)
        self._start_slots()
        return ticket

    def submit_claimed(self, request: BuildRequest, priority: Priority, owner: str) -> tuple[Ticket, bool]:
        """Submit and, if it is still queued, claim it for ``owner`` before any helper can take it."""
        self._check_family(request)
        ticket, change, claimed = self.table.submit_claimed(request, priority, owner)
        self._report_submit(request, ticket, change)
        if not claimed:
            self._start_slots()
        return ticket, claimed

    def _check_family(self, request: BuildRequest) -> None:
        if request.family != self.family.name:
            raise ValueError(f"request for family {request.family!r} sent to the {self.family.name!r} pool")

    def _report_submit(self, request: BuildRequest, ticket: Ticket, change: str | None) -> None:
        if change is not None:  # a duplicate at the same or a lower level is no event
            self.stats.emit(events.Queued(family=self.family.name, key=request.key, label=request.label,
                                          priority=ticket.priority.name, raised=change == "raised"))

    def preload(self, modules) -> None:
        """Have every helper, present and future, import these modules before its next build."""
        with self._preloads_lock:
            self._preloads.extend(m for m in dict.fromkeys(modules) if m not in self._preloads)

    @property
    def preloads(self) -> tuple[str, ...]:
        with self._preloads_lock:
            return tuple(self._preloads)

    # -- the helpers' state, as launches and the session see it ---------------------------------------------
    def live_helpers(self) -> int:
        with self._lock:
            return len(self._helpers)

    def helper_pids(self) -> dict[str, int]:
        with self._lock:
            return {h.name: h.pid for h in self._helpers.values()}

    def helper_has_modules(self, request: BuildRequest) -> bool:
        """Whether a running helper, or one forked now, has imported the request's modules; one that has
        not would import the kernel library first (seconds), while the launching process has it already."""
        needed = set(request.modules)
        with self._lock:
            if any(needed <= helper.modules for helper in self._helpers.values()):
                return True
            starter = self._starter
        return starter is not None and starter.forks_with(needed)

    def builds_nothing(self) -> bool:
        """True once the pool has started and no helper will build what is queued: none configured, or
        every slot gave up (the urgent slot builds only what a launch is blocked on). Misses then build in
        place, and so does ``Session.wait_ready``."""
        return self._started and not self.may_get_helpers()

    def may_get_helpers(self, urgent: bool = False) -> bool:
        """True while a helper is running or a slot is still starting one or backing off to retry; with
        ``urgent``, the urgent slot counts too."""
        with self._lock:
            return self._may_get_helpers_locked(urgent)

    def _may_get_helpers_locked(self, urgent: bool = False) -> bool:
        if urgent and self._urgent_running:
            return True
        return (any(slot != self._urgent_slot for slot in self._helpers) or self._starting > 0
                or self._slots_running > 0)

    def load_seen_by(self, ticket: Ticket) -> HelperLoad:
        """The helpers' load as a launch waiting on ``ticket`` sees it. For an URGENT ticket, the urgent
        slot counts as a free helper while it builds nothing (it forks one at once)."""
        urgent = ticket.priority <= Priority.URGENT
        with self._lock:
            live, may_get = len(self._helpers), self._may_get_helpers_locked(urgent)
            if urgent and self._urgent_running and self._urgent_slot not in self._helpers:
                live += 1
        now = time.monotonic()
        busy = [now - (t.started_at or now) for t in self.table.running() if t.owner and t.owner.startswith("helper")]
        return HelperLoad(live, may_get, busy, self.table.queued_ahead(ticket))

    def prefer_in_place(self, ticket: Ticket) -> bool:
        """Whether building ``ticket`` on the calling thread now beats waiting for a helper."""
        return self.cost.prefer_in_place(self.load_seen_by(ticket), crashed_before=bool(ticket.crashes))

    # -- a launch's miss -----------------------------------------------------------------------------------
    def obtain(self, request: BuildRequest, build_here: BuildHere, wait_timeout: float) -> MissOutcome:
        """Make sure ``request`` is built before a launch goes on, waiting at most ``wait_timeout``: built
        already, wait for the helper building it (raised to URGENT), or build it on the calling thread with
        ``build_here(payload)`` (the family's build; it raises on failure). A wait over LONG_WAIT_S is one
        ``wait`` event naming what held it."""
        t0 = time.monotonic()
        cause: list[str] = []
        outcome = self._obtain(request, build_here, t0, wait_timeout, cause)
        seconds = time.monotonic() - t0
        if seconds > LONG_WAIT_S and cause:
            self.stats.emit(events.Wait(family=self.family.name, key=request.key, label=request.label,
                                        seconds=seconds, cause=cause[0], outcome=outcome.value))
        return MissOutcome(outcome, seconds)

    def _obtain(self, request: BuildRequest, build_here: BuildHere, t0: float, wait_timeout: float,
                cause: list[str]) -> Outcome:
        table, deadline = self.table, t0 + wait_timeout
        self.preload(request.modules)  # so that helpers are ready for this library's next variants
        if not self.helper_has_modules(request):
            # A helper would import the kernel library before compiling (seconds, where the compile alone
            # is often under one): build here unless a helper is already on it.
            ticket, claimed = self.submit_claimed(request, Priority.URGENT, "executor")
            if claimed:
                return self._build_in_place(ticket, build_here)
        else:
            ticket = self.submit(request, Priority.URGENT)
        while True:
            state = ticket.state
            if state is State.DONE:
                return Outcome.READY
            if state in (State.FAILED, State.QUARANTINED) or self.closed:
                return Outcome.FALLBACK
            if state is State.QUEUED and self.prefer_in_place(ticket) and table.claim(ticket, "executor"):
                return self._build_in_place(ticket, build_here)
            if not cause:
                cause.append(self._holding(ticket))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("waited %.1fs for %s (%s by %s); giving up the wait and compiling in place "
                            "(JIT_AHEAD_WAIT_TIMEOUT_S)", wait_timeout, request.label, state.value, ticket.owner)
                return Outcome.FALLBACK
            table.wait_for_change(ticket, min(remaining, _REDECIDE_S) if state is State.QUEUED else remaining)

    def _holding(self, ticket: Ticket) -> str:
        """What a launch about to wait on ``ticket`` waits for, in words (the ``wait`` event's cause)."""
        if ticket.state is State.RUNNING:
            since = time.monotonic() - (ticket.started_at or time.monotonic())
            if ticket.owner == "executor":
                return f"another launch was building it in place (for {since:.1f}s)"
            return f"{ticket.owner} was building it (for {since:.1f}s)"
        load = self.load_seen_by(ticket)
        if not load.live_helpers:
            return "queued while helpers were starting"
        return (f"queued behind {load.queued_ahead} other requests, {len(load.busy_for)} of "
                f"{load.live_helpers} helpers busy")

    def build_queued(self, build_here: BuildHere, priority: Priority, deadline: float | None) -> None:
        """No helper will build (none configured, or every slot gave up): build what is queued at
        ``priority`` or higher on the calling thread, one at a time, until nothing is left or ``deadline``
        (monotonic) passes. A request a launch is building meanwhile is not taken twice."""
        while not self.closed and (deadline is None or time.monotonic() < deadline):
            ticket = self.table.take_next("executor", 0.0, up_to=priority)
            if ticket is None:
                return
            self._build_in_place(ticket, build_here)

    def _build_in_place(self, ticket: Ticket, build_here: BuildHere) -> Outcome:
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
            self.cost.local_build(result.seconds)
            return Outcome.BUILT_HERE
        log.error("building %s in place failed:\n%s", request.label, result.error)
        return Outcome.FALLBACK

    # -- slots --------------------------------------------------------------------------------------------
    def _slot_name(self, slot: int) -> str:
        return "helper-urgent" if slot == self._urgent_slot else f"helper-{slot}"

    def _slot_main(self, slot: int) -> None:
        try:
            self._run_slot(slot)
        except Exception as exc:  # a bug guard: the pool runs on with one slot fewer, never a dead thread
            log.error("%s %s slot stopped (%s: %s); running with one helper fewer, misses build in place",
                      self.family.name, self._slot_name(slot), type(exc).__name__, exc)
        finally:
            with self._lock:
                if slot == self._urgent_slot:
                    self._urgent_running = False
                else:
                    self._slots_running -= 1
                last = self._slots_running == 0 and not self._urgent_running
            if last:  # no helper will be forked again: give its memory back
                self.starter.close_forkserver(0.0 if self._closed.is_set() else 5.0)
            self.table.notify()  # launches waiting on queued work re-decide: this slot is gone

    def _retires(self, slot: int) -> bool:
        """Serving started and needs this slot no more (the urgent slot serves to the end)."""
        return self._retire.is_set() and self.serving_workers <= slot != self._urgent_slot

    def _wait_for_work(self, slot: int) -> bool:
        """Block until something is queued that this slot takes (no helper is started for nothing);
        False once the pool is closed, or serving needs this slot no more."""
        up_to = Priority.URGENT if slot == self._urgent_slot else None
        while not self._closed.is_set():
            if self._retires(slot):
                return False
            if self.table.has_queued(up_to):
                return True
            self.starter.close_idle_forkserver(self._idle_for_long)
            self.table.wait_queued(0.5, up_to)
        return False

    def _run_slot(self, slot: int) -> None:
        from .helper_process import HelperEnding

        backoff = self._backoff_initial
        failures = 0
        while self._wait_for_work(slot):
            with self._lock:
                self._starting += 1
            helper = None
            try:
                helper = self.starter.start(self._slot_name(slot))
            finally:
                with self._lock:  # one step, so the helper is never counted neither starting nor live
                    self._starting -= 1
                    if helper is not None:
                        self._helpers[slot] = helper
            if helper is None:
                failures += 1
                if failures >= self._max_start_failures:
                    log.error("%s helper slot %d: %d starts failed in a row; running with one helper fewer, "
                              "misses build in place", self.family.name, slot, failures)
                    break
                outcome = HelperEnding.DIED
            else:
                failures = 0
                outcome = HelperEnding.DIED
                try:
                    outcome = self._serve(helper, slot)
                finally:
                    with self._lock:
                        self._helpers.pop(slot, None)
                        self._last_busy = time.monotonic()
                    helper.stop(5.0)
                if outcome not in (HelperEnding.DIED, HelperEnding.CRASHED) and self._retire.is_set():
                    self.stats.emit(events.HelperRetired(family=self.family.name, helper=helper.name))
            self.table.notify()  # launches waiting on queued work re-decide: a helper went away
            if outcome is HelperEnding.DIED:
                if self._closed.wait(backoff):
                    break
                backoff = min(backoff * 2, self._backoff_max)
            elif outcome is HelperEnding.CRASHED:
                backoff = self._backoff_initial
                if self._closed.wait(backoff):
                    break
            elif outcome is not HelperEnding.IDLE:
                backoff = self._backoff_initial

    def _idle_for_long(self) -> bool:
        """No helper is running or starting, and none has run for FORKSERVER_IDLE_S."""
        from .helper_starter import FORKSERVER_IDLE_S

        with self._lock:
            return (not self._helpers and not self._starting
                    and time.monotonic() - self._last_busy >= FORKSERVER_IDLE_S)

    def _serve(self, helper: HelperProcess, slot: int) -> HelperEnding:
        """Feed ``helper`` jobs until nothing is left for it, it dies, it needs replacing or the pool
        closes."""
        from .helper_process import HelperEnding

        built = False
        while not self._closed.is_set():
            if helper.proc.poll() is not None:
                log.warning("%s %s (pid %d) exited while idle (%s); starting a new one", self.family.name,
                            helper.name, helper.pid, helper.describe_exit())
                return HelperEnding.DIED
            outdated = self.starter.bring_up_to_date(helper)
            if outdated is not None:
                return outdated
            if self._retires(slot):
                break  # serving: fewer helpers beside the executor
            urgent = slot == self._urgent_slot
            ticket = self.table.take_next(helper.name, timeout=HELPER_IDLE_S,
                                          up_to=Priority.URGENT if urgent else None)
            if ticket is None:
                break  # nothing left: give the host memory back; a new helper comes with new work
            missing = self.starter.missing_modules(helper, ticket.request.modules)
            if helper.forked and missing:
                # Its library was named after this helper was forked: the fork server imports it once
                # for all helpers, instead of each helper on its own; meanwhile the executor may claim it.
                self.table.release(ticket, crashed=False)
                self.preload(ticket.request.modules)
                self.starter.refresh_forkserver()
                return HelperEnding.REFRESH
            with self._lock:
                self._building[slot] = (helper, ticket)
            paused = self._pause_background() if urgent else []
            try:
                gone = self._run_job(helper, ticket)
            except Exception:  # a bug guard: the ticket must not stay RUNNING for a slot that is gone
                if ticket.state is State.RUNNING and ticket.owner == helper.name:
                    self.table.release(ticket, crashed=False)
                raise
            finally:
                self._resume(paused)
                with self._lock:
                    self._building.pop(slot, None)
            if gone is not None:
                return gone
            built = True
        return HelperEnding.WORKED if built else HelperEnding.IDLE

    def _pause_background(self) -> list:
        """Pause the helpers building below WARMUP while the urgent slot builds: a launch is blocked on
        that build, and the others' work can wait a few seconds. Returns them, for ``_resume``."""
        from .helper_process import pause

        with self._lock:
            others = [helper for slot, (helper, ticket) in self._building.items()
                      if slot != self._urgent_slot and ticket.priority > Priority.WARMUP]
        return [helper for helper in others if pause(helper)]

    @staticmethod
    def _resume(paused: list) -> None:
        from .helper_process import resume

        for helper in paused:
            resume(helper)

    def _run_job(self, helper: HelperProcess, ticket: Ticket) -> HelperEnding | None:
        """Build one ticket in ``helper``; None if the helper is still there afterwards, else how it
        went (CRASHED: it died building, charged to the request)."""
        from .helper_process import HelperEnding
        from .protocol import Job, JobDone, JobTaken, ProtocolError

        request = ticket.request
        job_id = next(self._job_ids)
        self.stats.emit(events.BuildStart(family=self.family.name, key=request.key, label=request.label,
                                          helper=helper.name, priority=ticket.priority.name))
        if not helper.send(Job(job_id, request)):
            self.table.release(ticket, crashed=False)
            return HelperEnding.DIED
        t0 = time.perf_counter()
        try:
            reply = helper.receive(self._build_timeout)
            if reply is None and not self._closed.is_set():
                # it died before it took the job (killed while idle, by the OOM killer or a user): the job
                # is not to blame, and goes back to the queue as it was
                self.table.release(ticket, crashed=False)
                log.warning("%s %s (pid %d) exited before it took %s (%s); the request goes back to the queue",
                            self.family.name, helper.name, helper.pid, request.label, helper.describe_exit())
                return HelperEnding.DIED
            if isinstance(reply, JobTaken) and reply.job_id == job_id:
                reply = helper.receive(max(0.0, self._build_timeout - (time.perf_counter() - t0)))
        except TimeoutError:
            log.error("%s %s (pid %d) spent over %.0fs building %s; killed, counted as a crash",
                      self.family.name, helper.name, helper.pid, self._build_timeout, request.label)
            helper.proc.kill()
            reply = None
        except ProtocolError as exc:
            log.error("%s %s (pid %d): broken reply while building %s (%s)", self.family.name, helper.name,
                      helper.pid, request.label, exc)
            reply = None
        if self._closed.is_set() and not isinstance(reply, JobDone):
            self.table.release(ticket, crashed=False)  # stopped by close(), not a crash
            return HelperEnding.DIED
        if not isinstance(reply, JobDone) or reply.job_id != job_id:
            # The helper died mid-build (or sent garbage): release the claim at once so a waiting
            # launch builds in place now, not after its timeout.
            how = helper.describe_exit() if reply is None else f"unexpected reply {type(reply).__name__}"
            state = self.table.release(ticket, crashed=True)
            log.warning("%s %s (pid %d) died while building %s (%s); claim released, request %s",
                        self.family.name, helper.name, helper.pid, request.label, how, state.value)
            self.stats.emit(events.HelperCrash(family=self.family.name, key=request.key, label=request.label,
                                               helper=helper.name, how=how, state=state.value,
                                               seconds=time.perf_counter() - t0))
            if reply is not None:
                helper.proc.kill()
            return HelperEnding.CRASHED
        result = dataclasses.replace(reply.result, builder=helper.name)
        if result.ok:
            self.cost.helper_build(result.seconds)
            helper.modules.update(request.modules)
        else:
            log.error("%s %s failed to build %s:\n%s", self.family.name, helper.name, request.label, result.error)
        self.table.finish(ticket, result)
        self.stats.emit(events.BuildFinish(family=self.family.name, key=request.key, label=request.label,
                                           helper=helper.name, ok=result.ok, error=result.error,
                                           seconds=result.seconds, found=result.found))
        return None
