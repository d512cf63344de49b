"""Planning a model in the background: find its layers, enumerate their launches, queue what they need.

Started at model construction, it overlaps weight loading. In the planning thread each provider finds
its layers (one probe forward on meta) and lists its launches, WARMUP first; the launches then run in
planner processes forked from the server (``planners.py``), so that the enumeration, thousands of meta
forwards, never holds the server's GIL and uses every spare CPU; what they capture is queued to the
families' pools as it arrives. With ``planners=0`` (or where the server cannot fork) the launches run
in the planning thread, and stop once serving starts. A provider that fails is reported in one log
line and skipped; planning never raises into the engine.
"""
from __future__ import annotations

import difflib
import hashlib
import itertools
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from filelock import FileLock, Timeout

from ..observing import events
from .. import knobs
from .limits import EngineLimits
from ..observing.own_cpu import OwnThread
from .plan_cache import PlanStore, SavedPlan, plan_key
from .chunks import Failure, LaunchGroup, Position, Sink
from .claims import Claims
from .planners import ForkedPlanners, planner_entry
from .run_here import run_in_thread
from ..priority import Priority
from ..building.table import State

log = logging.getLogger("jit_ahead.planning")

# Planning's progress is saved at most this often (and when a launch group ends), so that a start stopped
# before planning ended is followed by one that goes on from there.
PARTIAL_EVERY_S = 2.0


def group_signature(group: LaunchGroup) -> str:
    """What names a launch group across starts of the same key: its priority, family, provider and
    launches' labels, in order."""
    text = "\n".join([group.priority.name, group.family, *(f"{p.name}\t{launch.label}" for p, launch in group.items)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class PlanProgress:
    """One planning run at one moment (``PlanningRun.progress``): variants listed so far, and of those
    queued here, how many are still queued or building (by family), and how many failed."""

    seconds: float
    groups: int
    groups_done: int
    listed: int
    pending: int
    pending_warmup: int
    failed: int
    pending_by_family: dict[str, int] = field(default_factory=dict)


class PlanningRun(Sink):
    def __init__(self, families: dict, stats, model, limits: EngineLimits, providers: list, *,
                 planners: int = 0, serving_planners: int | None = None,
                 enter_planner: Callable[[], None] | None = None,
                 store: PlanStore | None = None, view=None, lock_timeout: float = 120.0) -> None:
        """``planners``: planner processes to fork (0: launches run in the planning thread), of which
        ``serving_planners`` keep running once serving starts (None: all);
        ``enter_planner`` runs first in each planner (the server's device view, its families' set-up);
        ``store``: saved plans, read instead of planning and written after (``view``: the device view the
        key names); ``lock_timeout``: how long to wait for another process planning the same key."""
        self._families = families
        self._stats = stats
        self._model = model
        self._limits = limits
        self._providers = providers
        self._planners = planners
        self._serving_planners = serving_planners
        self._enter_planner = enter_planner or (lambda: None)
        self._done = threading.Event()
        self._cancelled = threading.Event()
        # set once every launch of that priority and above is captured and queued: an engine's warmup
        # waits for WARMUP, not for the BACKGROUND enumeration
        self._queued = {priority: threading.Event() for priority in Priority}
        self.tickets: list = []
        self.variants: dict[Priority, int] = defaultdict(int)  # distinct variants, by the first priority
        self._seen: dict = {}  # request -> (the highest priority this run queued it at, its family)
        self._ticket_ids: set[int] = set()
        self.errors: list[str] = []
        self._failed: set[tuple[str, str]] = set()
        self.launches = 0  # launches listed by the providers
        self.launches_lost = 0  # launches not run: serving came first, one killed planners, or the listing cap
        self.launches_resumed = 0  # launches a partial plan of an earlier start says ran: not run again
        self._parts: dict | None = None  # the saved plan's key, while planning may save its progress
        self._signatures: list[str] = []  # per launch group
        self._item_index: list[list[int]] = []  # per group, its launches' indices in the whole group
        self._ran: dict[str, list[list[int]]] = {}  # group signature -> [first, last) ranges run
        self._last_partial = 0.0
        self._partial_failed = False
        self.seconds = 0.0
        self.listing_seconds = 0.0  # from the start to the first launch run: key, probe forward, listing
        self.planner_seconds: list[float] = []  # each finished planner's own time
        self._groups: list[LaunchGroup] = []
        self._group_count = 0  # launch groups listed (kept after the groups themselves are let go)
        self._groups_done = 0
        self._group_variants: dict[int, int] = defaultdict(int)
        self._group_queued: dict[int, int] = defaultdict(int)
        self._group_kernels: dict[int, dict[str, int]] = defaultdict(dict)  # kernel -> new variants
        self.planned_by: dict[str, set[str]] = {}  # kernel name -> the providers whose launches found it first
        self._started: float | None = None
        self._enumeration_started = 0.0
        self._planners_running: ForkedPlanners | None = None
        self._store = store
        self._view = view
        self._lock_timeout = lock_timeout
        self._result = SavedPlan()  # what this run found, to be saved
        self.saved_plan: str | None = None  # the saved plan read instead of planning, or the one written
        self.read_saved = False  # True when planning was a saved plan, read
        self._thread = OwnThread(target=self._run, name="jit_ahead-planning", daemon=True)

    def start(self) -> "PlanningRun":
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None, priority: Priority | None = None) -> bool:
        """True once every provider's launches were captured and queued; with ``priority``, once those of
        that priority and above were (lower priorities may still be enumerating)."""
        return (self._done if priority is None else self._queued[priority]).wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def requests(self) -> list:
        """Every variant this run planned (or read from its saved plan), on disk or not."""
        return list(self._seen)

    def progress(self) -> PlanProgress:
        """How far this run is; safe from any thread (it reads counts the planning thread keeps)."""
        pending_by_family: dict[str, int] = defaultdict(int)
        pending = pending_warmup = failed = 0
        for ticket in list(self.tickets):
            state = ticket.state
            if state in (State.QUEUED, State.RUNNING):
                pending += 1
                pending_warmup += ticket.priority <= Priority.WARMUP
                pending_by_family[ticket.request.family] += 1
            elif state is not State.DONE:
                failed += 1
        started = self._started
        seconds = self.seconds if self.done else (time.perf_counter() - started if started is not None else 0.0)
        return PlanProgress(seconds=seconds, groups=self._group_count, groups_done=self._groups_done,
                            listed=sum(self.variants.values()), pending=pending, pending_warmup=pending_warmup,
                            failed=failed, pending_by_family=dict(pending_by_family))

    def cancel(self, timeout: float = 1.0) -> None:
        """Stop planning (the process is closing): planners are killed, the planning thread stops before
        its next launch; waits up to ``timeout`` seconds for it."""
        self._cancelled.set()
        planners = self._planners_running
        if planners is not None:
            planners.kill()  # now, from this thread: the planning thread sees their pipes close
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _serving(self) -> bool:
        return self._stats.phase == "serving"

    def _fail(self, provider, what: str, exc: BaseException) -> None:
        message = f"provider {provider.name}: {what} failed ({type(exc).__name__}: {exc}); skipped"
        self.errors.append(message)
        log.warning(message)

    def _check_extra_limits(self) -> None:
        """One log line for EngineLimits.extra keys no provider of this run reads (a misspelt knob would
        otherwise be ignored without a word), with the closest known key."""
        known = {key: provider.name for provider in self._providers
                 for key in getattr(provider, "extra_limits", {})}
        for key in sorted(set(self._limits.extra) - set(known)):
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r} ({known[close[0]]})?" if close else ""
            log.warning("EngineLimits.extra[%r] is read by none of the providers planning this model (%s), "
                        "so it is ignored%s Keys they read: %s", key,
                        ", ".join(p.name for p in self._providers) or "none",
                        hint or ".", ", ".join(sorted(known)) or "none")

    def _run(self) -> None:
        t0 = self._started = time.perf_counter()
        lock = None
        try:
            self._check_extra_limits()
            parts = self._key()
            if parts is not None:
                lock = self._lock(parts)
                saved = self._store.load(parts, self._families)
                if saved is not None:
                    self._use(saved, parts)
                    return
                self._parts = parts
                if not self._resume(parts):
                    why = self._store.closest(parts)
                    log.info("planning %s: no saved plan%s", type(self._model).__name__,
                             f" (the closest saved one differs in {why})" if why else "")
            self._groups = self._skip_ran(self._list_launches())
            self._group_count = len(self._groups)
            self.launches = sum(len(g.items) for g in self._groups) + self.launches_resumed
            # priorities above the first group left have nothing to run (none listed, or all ran before)
            self._mark_queued(above=self._groups[0].priority if self._groups else None)
            if self._groups and not self._cancelled.is_set():
                self._enumerate()
            if parts is not None and self._complete():
                self._save(parts, time.perf_counter() - t0)
            elif parts is not None:
                self._save_partial(force=True)
        except Exception as exc:  # a bug guard: planning must never take the engine down
            log.exception("planning stopped early")
            self.errors.append(f"planning stopped: {exc!r}")
        finally:
            if lock is not None:
                lock.release()
            # The listed launches (closures over the model's layers, one per call) are needed only while
            # they run; held on, they stay in the server's memory and lengthen its exit.
            self._groups = []
            self.seconds = time.perf_counter() - t0
            self._mark_queued(above=None)
            self._done.set()

    # -- saved plans ----------------------------------------------------------------------------------------
    def _key(self) -> dict | None:
        if self._store is None or not self._store.usable:
            return None
        try:
            return plan_key(self._model, self._limits, self._providers, self._families, self._view)
        except Exception as exc:  # the key is an optimisation: plan as without a store
            log.warning("planning: no saved plan can be used for %s (its key: %s: %s)", type(self._model).__name__,
                        type(exc).__name__, exc)
            return None

    def _lock(self, parts: dict):
        """Hold the key's lock while planning: another process planning the same model (a rank of the
        same node) finishes first, and this one then reads its plan."""
        lock = FileLock(str(self._store.lock_path(parts)))
        try:
            lock.acquire(timeout=self._lock_timeout)
            return lock
        except Timeout:
            log.warning("planning: another process has held %s for %.0fs; planning here too",
                        self._store.lock_path(parts), self._lock_timeout)
            return None
        except OSError as exc:  # a read-only folder (plans baked into an image), or its place taken
            log.warning("planning: cannot take the lock %s (%s: %s); a saved plan there is still read, and "
                        "this process plans without the lock", self._store.lock_path(parts), type(exc).__name__,
                        exc.strerror or exc)
            return None

    def _complete(self) -> bool:
        return not self._cancelled.is_set() and self.launches_lost == 0 and not any(
            e.startswith("planning stopped") for e in self.errors)

    def _save(self, parts: dict, seconds: float) -> None:
        self._result.launches, self._result.seconds, self._result.errors = self.launches, seconds, list(self.errors)
        for request, (priority, family) in self._seen.items():
            self._result.requests.setdefault(family, []).append((priority, request))
        path = self._store.save(parts, self._result, self._families)
        if path is not None:
            self._store.drop_partial(parts)
            self.saved_plan = str(path)
            self._stats.emit(events.PlanSaved(path=str(path), launches=self.launches,
                                              variants=sum(self.variants.values()), seconds=seconds))

    def _queue_saved(self, saved: SavedPlan, mark_queued: bool) -> int:
        """Queue a saved (or partial) plan's variants as planning would have: by priority, what is not on
        disk yet; returns how many were queued. ``mark_queued``: the plan is whole, so each priority is
        queued once its variants are."""
        queued = 0
        for name, entries in saved.requests.items():
            family = self._families[name]
            for kind, found in saved.extras.get(name, {}).items():
                for priority in sorted({p for p, _ in found}):
                    self._absorb(name, kind, [item for p, item in found if p == priority], priority)
            for priority in sorted({p for p, _ in entries}):
                requests = [r for p, r in entries if p == priority]
                self._seen.update((r, (priority, name)) for r in requests)
                self.variants[priority] += len(requests)
                tickets = family.submit(requests, priority)
                queued += len(tickets)
                self.tickets.extend(tickets)
                self._ticket_ids.update(id(t) for t in tickets)
                if mark_queued:
                    self._mark_queued(above=priority)
        return queued

    def _use(self, saved: SavedPlan, parts: dict) -> None:
        """Queue a saved plan instead of planning."""
        self.saved_plan = str(self._store.path(parts))
        self.read_saved = True
        self.launches = saved.launches
        queued = self._queue_saved(saved, mark_queued=True)
        self._stats.emit(events.PlanLoaded(path=self.saved_plan, launches=saved.launches,
                                           variants=sum(self.variants.values()), queued=queued,
                                           planned_seconds=saved.seconds))
        log.info("planning %s: saved plan %s (%d variants, %d of them not built yet; planning it took %.1fs)",
                 type(self._model).__name__, self.saved_plan, sum(self.variants.values()), queued, saved.seconds)
        if saved.errors:
            log.warning("planning %s: the saved plan was made with %d provider errors; the first: %s",
                        type(self._model).__name__, len(saved.errors), saved.errors[0])

    # -- progress: a start stopped mid-planning is followed by one that goes on from there ---------------------
    def _resume(self, parts: dict) -> bool:
        """Queue the variants of a partial plan an earlier start saved, and remember which launches it ran;
        True if there was one."""
        partial = self._store.load(parts, self._families, partial=True)
        if partial is None:
            return False
        self._ran = {sig: [list(r) for r in ranges] for sig, ranges in (partial.progress or {}).items()}
        queued = self._queue_saved(partial, mark_queued=False)
        log.info("planning %s: going on from the partial plan %s of an earlier start (%d variants, %d of them "
                 "not built yet)", type(self._model).__name__, self._store.path(parts, partial=True),
                 sum(self.variants.values()), queued)
        return True

    def _skip_ran(self, groups: list[LaunchGroup]) -> list[LaunchGroup]:
        """``groups`` without the launches a partial plan says ran (a group with none left goes); each
        kept launch's index in its whole group is remembered for ``ran``."""
        kept: list[LaunchGroup] = []
        self._signatures, self._item_index = [], []
        for group in groups:
            signature = group_signature(group)
            done = set()
            for first, last in self._ran.get(signature, ()):
                done.update(range(first, last))
            left = [i for i in range(len(group.items)) if i not in done]
            self.launches_resumed += len(group.items) - len(left)
            if not left:
                continue
            kept.append(LaunchGroup(group.priority, group.family, [group.items[i] for i in left]))
            self._signatures.append(signature)
            self._item_index.append(left)
        return kept

    def ran(self, group: int, first: int, last: int) -> None:
        index = self._item_index[group]
        ranges = self._ran.setdefault(self._signatures[group], [])
        for i in range(first, last):  # whole-group indices; consecutive ones merge
            whole = index[i]
            if ranges and ranges[-1][1] == whole:
                ranges[-1][1] = whole + 1
            else:
                ranges.append([whole, whole + 1])
        self._save_partial()

    def _save_partial(self, force: bool = False) -> None:
        """Save what planning found so far, with the launches that ran, at most every PARTIAL_EVERY_S."""
        if self._parts is None or self._partial_failed or not self._ran:
            return
        now = time.perf_counter()
        if not force and now - self._last_partial < PARTIAL_EVERY_S:
            return
        self._last_partial = now
        partial = SavedPlan(extras=self._result.extras, launches=self.launches,
                            seconds=now - (self._started or now), errors=list(self.errors),
                            progress={sig: [list(r) for r in ranges] for sig, ranges in self._ran.items()})
        for request, (priority, family) in self._seen.items():
            partial.requests.setdefault(family, []).append((priority, request))
        if self._store.save(self._parts, partial, self._families) is None:
            self._partial_failed = True  # said once by the store; the next start plans from the start

    def _list_launches(self) -> list[LaunchGroup]:
        """Each provider finds its layers and lists its launches, the model-level planner last with what
        the others claim; grouped by (priority, family, provider), WARMUP first."""
        groups: dict[tuple[Priority, str, int], list] = defaultdict(list)
        claims = Claims()
        cap = budget = knobs.max_planned_launches()
        planner_entry.set(self._enter_planner)  # for the processes providers fork (planning thread only)
        ordered = sorted(enumerate(self._providers), key=lambda ip: ip[1].sees_claims)
        for index, provider in ordered:
            if self._cancelled.is_set():
                break
            try:
                layers = (provider.find_layers(self._model, claims, self._limits, self._cancelled.is_set)
                          if provider.sees_claims
                          else provider.find_layers(self._model))
                family = self._families.get(provider.family)
                if layers and family is not None and provider.modules:
                    # Helpers import the library while its launches are enumerated; a library the
                    # model does not use is never imported there.
                    family.preload(provider.modules)
                # streamed up to what is left of the budget: limits far beyond it list nothing more
                launches = list(itertools.islice(provider.launches(layers, self._limits), budget + 1)) if layers else []
                if len(launches) > budget:
                    launches = launches[:budget]
                    self._cut_at_budget(provider, cap)
                budget -= len(launches)
                claims |= provider.claims(self._model, layers)
            except Exception as exc:
                self._fail(provider, "enumeration", exc)
                continue
            if family is None:
                if launches:
                    log.warning("provider %s: %d launch%s of the %s family not planned: this session runs %s "
                                "(JIT_AHEAD_FAMILIES); those kernels compile where they are launched", provider.name,
                                len(launches), "" if len(launches) == 1 else "es", provider.family,
                                ",".join(self._families) or "no family")
                continue
            for launch in launches:
                groups[(launch.priority, provider.family, index)].append((provider, launch))
        return [LaunchGroup(priority, family, items)
                for (priority, family, _), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2]))]

    def _cut_at_budget(self, provider, cap: int) -> None:
        """The listing reached ``cap`` (JIT_AHEAD_MAX_PLANNED_LAUNCHES): one line, and the plan is not whole."""
        self.launches_lost += 1
        message = (f"provider {provider.name} lists more launches than the {cap} one planning run holds within "
                   f"{self._limits} (JIT_AHEAD_MAX_PLANNED_LAUNCHES); the launches past it are not planned and "
                   "compile as without jit_ahead")
        self.errors.append(message)
        log.warning("planning: %s", message)

    def _enumerate(self) -> None:
        self._enumeration_started = time.perf_counter()
        self.listing_seconds = self._enumeration_started - self._started
        stop = lambda: self._cancelled.is_set() or self._serving()  # noqa: E731
        if self._planners > 0 and hasattr(os, "fork"):
            try:
                self._run_planners(self._planners, Position(0, 0))
                return
            except OSError as exc:
                log.warning("planners could not be forked (%s); the launches run in the planning thread", exc)
        stopped = run_in_thread(self._groups, self._families, self, Position(0, 0), stop)
        if stopped is None or self._cancelled.is_set():
            return
        # Serving started: the server's threads are the engine's now; the rest runs in a planner.
        if self._planners > 0 and hasattr(os, "fork"):
            try:
                self._run_planners(1, stopped)
                return
            except OSError as exc:
                log.warning("a planner could not be forked (%s)", exc)
        rest = sum(len(g.items) for g in self._groups[stopped.group + 1:]) + len(
            self._groups[stopped.group].items) - stopped.item
        self.lost(stopped.group, rest, "serving started first and JIT_AHEAD_PLANNERS=0 keeps planning in the "
                                       "server's threads, which belong to the engine once it serves")
        for group in range(stopped.group, len(self._groups)):
            self.group_done(group)

    def _run_planners(self, count: int, start: Position) -> None:
        planners = ForkedPlanners(self._groups, self._families, self, count, self._enter_planner, start=start,
                                  serving_count=self._serving_planners)
        self._planners_running = planners
        if self._cancelled.is_set():  # cancelled before it could be killed from outside
            return
        try:
            planners.run(self._cancelled, self._serving)
        finally:
            self._planners_running = None
            self.planner_seconds.extend(planners.planner_seconds)

    def _mark_queued(self, above: Priority | None) -> None:
        """Every priority higher than ``above`` (all: None) has been captured and queued."""
        for priority, event in self._queued.items():
            if above is None or priority < above:
                event.set()

    # -- the sink: what planners report, handled on the planning thread --------------------------------------
    def _absorb(self, name: str, kind: str, items: list, priority: Priority) -> None:
        """What a capture of family ``name`` found besides variants: the family reads it, the plan keeps it."""
        self._families[name].absorb(kind, items, priority)
        self._result.extras.setdefault(name, {}).setdefault(kind, []).extend((priority, item) for item in items)

    def found(self, group: int, requests: list, extras: dict[str, list]) -> None:
        launch_group = self._groups[group]
        family = self._families[launch_group.family]
        priority = launch_group.priority
        for kind, items in extras.items():
            self._absorb(launch_group.family, kind, items, priority)
        # New variants, and variants another planner found first for a later priority (planners run the
        # groups side by side): those are raised, and counted where they are needed first.
        fresh = [r for r in requests if self._seen.get(r, (Priority.SPARE + 1,))[0] > priority]
        for request in fresh:
            before = self._seen.get(request)
            if before is not None:
                self.variants[before[0]] -= 1
            self._seen[request] = (priority, launch_group.family)
        self.variants[priority] += len(fresh)
        self._group_variants[group] += len(fresh)
        provider = _provider_of(launch_group)
        for request in fresh:
            kernel = getattr(request, "name", "?")
            self._group_kernels[group][kernel] = self._group_kernels[group].get(kernel, 0) + 1
            self.planned_by.setdefault(kernel, set()).add(provider)
        if fresh:
            tickets = family.submit(fresh, priority)
            self._group_queued[group] += len(tickets)
            for ticket in tickets:
                if id(ticket) not in self._ticket_ids:
                    self._ticket_ids.add(id(ticket))
                    self.tickets.append(ticket)

    def group_done(self, group: int) -> None:
        launch_group = self._groups[group]
        self._groups_done += 1
        self._stats.emit(events.Planned(family=launch_group.family, priority=launch_group.priority.name,
                                        provider=_provider_of(launch_group), kernels=self._group_kernels[group],
                                        launches=len(launch_group.items), variants=self._group_variants[group],
                                        queued=self._group_queued[group],
                                        seconds=time.perf_counter() - self._enumeration_started))
        following = self._groups[group + 1].priority if group + 1 < len(self._groups) else None
        if following != launch_group.priority:
            self._mark_queued(above=following)
        self._save_partial(force=True)

    def failed(self, failure: Failure) -> None:
        if (failure.provider, failure.error) in self._failed:  # one line per provider and error
            return
        self._failed.add((failure.provider, failure.error))
        message = (f"provider {failure.provider}: launch {failure.launch} failed ({failure.error}: "
                   f"{failure.message}); skipped")
        self.errors.append(message)
        log.warning(message)

    def lost(self, group: int, count: int, why: str) -> None:
        self.launches_lost += count
        where = self._groups[group]
        message = f"{count} launches from {where.family} {where.priority.name} on are not planned: {why}"
        self.errors.append(message)
        log.warning("planning: %s", message)


def _provider_of(group: LaunchGroup) -> str:
    """The provider whose launches a group holds (groups are per provider)."""
    return group.items[0][0].name if group.items else ""
