"""One jit_ahead session per process: the families' pools and hooks, and the stats every part reports to."""
from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING

from . import registry
from .core import device_view, knobs
from .core.observing import events, own_cpu
from .core.observing.own_cpu import counted
from .core.planning.limits import EngineLimits
from .core.priority import Priority
from .core.planning.readiness import Readiness, ReadyRule, readiness
from .core.observing.user_lines import family_helpers, tell_user
from .core.observing.stats import Stats, SummaryTally
from .core.observing.stats_log import open_stats_log

if TYPE_CHECKING:  # imported when a model is first planned: a process that never plans does not pay for them
    from .core.planning.plan_cache import PlanStore
    from .core.planning.run import PlanningRun

log = logging.getLogger("jit_ahead.session")

# At interpreter exit, builds still running get this long before their helpers are killed: the process's
# own work is over, and a killed build publishes nothing (every entry is written atomically).
EXIT_GRACE_S = 0.1

class Session:
    @counted("session start")
    def __init__(self, families=("triton",), *, stats: Stats | None = None, skip_unavailable: bool = False,
                 announce: bool = False, **family_options) -> None:
        """``skip_unavailable``: a family whose DSL is not installed is left out with one line instead of
        raising ImportError (the ``JIT_AHEAD=1`` start-up). ``announce``: the summary at close is shown
        even where logging would not show it (``tell_user``), as it is when a stats log is written."""
        self.announce = announce
        self.stats = stats or Stats()
        self.stats_log = open_stats_log(self.stats)
        self._tally = SummaryTally()
        self.stats.subscribe(self._tally)
        self.families = {}
        for name in families:
            try:
                self.families[name] = registry.family_class(name)(self.stats, **family_options.get(name, {}))
            except ImportError as exc:
                if not skip_unavailable:
                    raise
                log.error("jit_ahead: the %s family is not available (%s); running without it", name, exc)
        self._closed = False
        self._planning: list[PlanningRun] = []
        for family in self.families.values():  # the guard says whether an unplanned variant may come later
            family.follow_planning(lambda: all(run.done for run in self._planning))
        self._plans: PlanStore | bool | None = None  # saved plans (JIT_AHEAD_PLAN_DIR); False: none
        self._serving_listeners: list = []
        self._ready_lock = threading.Lock()
        self._ready_said = False

    @property
    def phase(self) -> str:
        return self.stats.phase

    @counted("session start")
    def start(self) -> "Session":
        for family in self.families.values():
            family.start()
        return self

    # -- lifecycle for engines ---------------------------------------------------------------------------
    @counted("plan_model")
    def plan_model(self, model, limits: EngineLimits, providers=None) -> PlanningRun:
        """Start planning ``model`` within ``limits`` in the background and return at once.

        Call it at model construction (the model may still be on the meta device): captures and builds
        overlap weight loading. ``providers`` are Provider instances; by default the built-in providers of
        every installed library (jit_ahead.providers.builtin).
        """
        if providers is None:
            from .providers.builtin import builtin_providers  # imports no kernel library itself

            providers = builtin_providers()
        providers = list(providers)
        view = device_view.current()  # read here: a planner forked from this process must not touch the GPU

        from .providers import meta_shortcuts

        def enter_planner() -> None:
            device_view.pin(view)
            meta_shortcuts.install()  # a planner runs nothing of the server's: process-wide is safe
            for family in self.families.values():
                family.enter_planner()
            for provider in providers:
                try:
                    provider.enter_planner()
                except Exception as exc:  # noqa: BLE001 - its launches may still run; those that fail say why
                    log.warning("provider %s: its planner set-up failed (%s: %s); its launches run without it",
                                provider.name, type(exc).__name__, exc)

        from .core.planning.run import PlanningRun

        run = PlanningRun(self.families, self.stats, model, limits, providers, planners=knobs.planner_count(),
                          serving_planners=knobs.serving_planner_count(), enter_planner=enter_planner, store=self._plan_store(), view=view,
                          lock_timeout=knobs.wait_timeout_s()).start()
        self._planning.append(run)
        return run

    def _plan_store(self) -> PlanStore | None:
        if self._plans is None:
            from .core.planning.plan_cache import PlanStore, plan_folder
            from .core.store import configured

            folder = plan_folder()
            self._plans = PlanStore(folder, configured()) if folder is not None else False
        return self._plans or None

    @counted("waits")
    def wait_ready(self, timeout: float | None = None, priority: Priority | None = None,
                   whole_plan: bool | None = None) -> bool:
        """Wait until planning has listed and queued what the ready rule asks for, replay has queued its
        records, and every request up to ``priority`` is settled (built, failed or quarantined; with no
        helper to build them, JIT_AHEAD_*_WORKERS=0, they are built here, on the calling thread); True if
        that happened within ``timeout``. Then (the first time it is True) one line says how much of the
        plan is listed and built and what is left (``readiness``); without it, the line comes at
        ``mark_serving``.

        The rule: ``whole_plan`` (planning has listed every variant, BACKGROUND ones included) and
        ``priority`` (the builds waited for: WARMUP, what an engine's warmup needs; ``Priority.REPLAY``,
        the recorded variants too; ``Priority.BACKGROUND``, every one). Either left None comes from
        ``JIT_AHEAD_READY``: ``plan`` (default: the whole plan listed, WARMUP built), ``warmup`` (WARMUP
        listed and built; planning may go on listing BACKGROUND variants while serving) or ``all`` (the
        whole plan listed and built)."""
        rule = self._ready_rule(priority, whole_plan)
        deadline = None if timeout is None else time.monotonic() + timeout
        ready = self.wait_planned(timeout, rule.priority if not rule.whole_plan else None)
        if ready:
            ready = all(family.settle(rule.priority, deadline) for family in self.families.values())
        if ready:  # a wait that timed out says nothing: the line comes when serving starts
            self._say_ready(rule)
        return ready

    def _ready_rule(self, priority: Priority | None, whole_plan: bool | None) -> ReadyRule:
        default = ReadyRule.from_knob() if priority is None or whole_plan is None else None
        return ReadyRule(default.priority if priority is None else Priority(priority),
                         default.whole_plan if whole_plan is None else bool(whole_plan))

    def readiness(self, rule: ReadyRule | None = None) -> Readiness:
        """How much of the plan is listed and built now, and what is left (``core/planning/readiness.py``)."""
        return readiness(self._planning, self.families, rule or ReadyRule.from_knob())

    def _say_ready(self, rule: ReadyRule) -> None:
        """The ready line, once: at the first ``wait_ready``, else when serving starts."""
        with self._ready_lock:
            if self._ready_said:
                return
            self._ready_said = True
        state = self.readiness(rule)
        self.stats.emit(events.Ready(state.fields()))
        if not self._planning:
            log.info("%s", state.line())
        elif state.complete:
            tell_user(state.line())
        else:
            log.warning("%s", state.line())

    @counted("waits")
    def wait_planned(self, timeout: float | None = None, priority: Priority | None = Priority.WARMUP) -> bool:
        """Wait until planning has queued every launch up to ``priority`` (None: every launch) and replay
        has queued its records, without waiting for the builds; True if that happened within ``timeout``.

        For an engine whose warmup has GPU work of its own to do, such as an autotuner benchmarking the
        configs of a kernel library that stores its choices (fla): warming up right after this overlaps
        that GPU work with the builds still running. Each warmup launch then waits for its own variant
        (raised to the front of the queue) or builds it in place when the pool's measurements say that is
        faster; a wait adds a little over the build itself (a notification and a load from disk), which
        ``wait_ready`` spares them."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if not all(run.wait(remaining(), priority) for run in self._planning):
            return False
        return all(family.wait_replay(remaining()) for family in self.families.values())

    def add_serving_listener(self, callback) -> None:
        """``callback()`` runs once when serving starts (e.g. to cancel a fallback timer)."""
        self._serving_listeners.append(callback)

    @counted("tune-ahead")
    def tune_ahead(self, budget_bytes: int | None = None) -> dict:
        """Run, on this process's GPU, the autotuners' benchmarks for every tuning key planning met that has
        no choice yet, so that none benchmarks while serving (each family's ``tune_ahead``; the Triton one:
        ``jit_ahead/triton/tune_ahead.py``). ``budget_bytes``: the most GPU memory one key's inputs may take
        (default ``JIT_AHEAD_TUNE_AHEAD_MEMORY_MB``, else a sixteenth of free memory). Returns what each
        family tuned and left, by reason. Never raises for a kernel: what fails is left to its first launch."""
        return self._each_family(lambda family: family.tune_ahead(budget_bytes),
                                 "tune-ahead of %s failed; its autotuners tune at their first launch")

    def _each_family(self, step, failed: str) -> dict:
        """``step(family)`` for every family, by name, those that said something; a family whose step raises
        is logged (``failed`` % its name) and the others go on: these steps must never stop a start."""
        done = {}
        for name, family in self.families.items():
            try:
                summary = step(family)
            except Exception:
                log.exception("jit_ahead: " + failed, name)
                continue
            if summary:
                done[name] = summary
        return done

    @counted("load into memory")
    def load_into_memory(self) -> dict:
        """Bring every variant planned or replayed so far that is built into this process's in-memory DSL
        caches (each family's ``load_into_memory``), so that none loads from disk while serving: what an
        engine that counts in-memory misses after warmup as compiles needs (vLLM's JIT monitor). A variant
        not built yet is left to its first launch, which waits for its build. One log line; never raises."""
        started = time.perf_counter()
        done = self._each_family(lambda family: family.load_into_memory(),
                                 "loading %s's variants into memory failed; each loads at its first launch")
        if done:
            log.info("jit_ahead: variants loaded into memory ahead in %.2f s: %s", time.perf_counter() - started,
                     "; ".join(f"{name} " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in summary.items() if v)
                               for name, summary in done.items()))
        return done

    @counted("mark_serving")
    def mark_serving(self, tune_ahead: bool = True) -> None:
        """The engine finished warmup: from here on, a compile on the executor is a miss to report, and
        helpers exit once their queue is empty. Before that, in the calling thread, with ``tune_ahead`` and
        ``JIT_AHEAD_TUNE_AHEAD`` on (default), the autotuners' benchmarks for every tuning key planned so far
        run (``tune_ahead``). Calling it again does nothing."""
        if self.stats.phase == "serving":
            return
        if tune_ahead and knobs.tune_ahead_enabled():
            self.tune_ahead()
        for callback in self._serving_listeners:
            callback()
        self._say_ready(ReadyRule.from_knob())
        self.stats.emit(events.OwnCpu({"own_s": own_cpu.total(), "by_where": own_cpu.seconds()}))
        self.stats.phase = "serving"
        self.stats.emit(events.Phase())
        for family in self.families.values():
            family.start_serving()

    def close(self, grace: float = 2.0) -> None:
        """Stop every family's helpers; builds still running after ``grace`` seconds are abandoned."""
        if self._closed:
            return
        self._closed = True
        for run in self._planning:  # planners are killed; a planning thread stops before its next launch
            run.cancel(timeout=1.0)
        for family in self.families.values():
            family.close(grace)
        meta = sys.modules.get("jit_ahead.providers.meta")  # imported only by a session that planned
        if meta is not None:
            meta.release_meta_reads()  # torch's own meta kernel again: nothing of planning stays in torch
        summary = self.summary()
        self.stats.emit(events.Summary(summary))
        line = "jit_ahead: " + ", ".join(f"{k} {v}" for k, v in summary.items())
        if self.stats_log is not None:
            self.stats_log.close()
        if self.announce or self.stats_log is not None:  # asked for: shown even without logging set up
            tell_user(line)
        else:
            log.info("%s", line)

    def describe(self) -> str:
        """The families and their helpers, for the start-up line; once a model is planned, how far its
        plan is (``readiness``)."""
        line = ", ".join(family_helpers(name, family.helpers)
                         for name, family in self.families.items()) or "no family available"
        if self._planning:
            state = self.readiness()
            line += (f"; plan {'complete' if state.complete else 'unfinished'}: {state.listed} variants listed"
                     f"{'' if state.planning_done else ' so far'}, {state.built} built, {state.pending} queued or "
                     "building")
        return line

    def summary(self) -> dict:
        """Counts for the one-line summary at exit."""
        out = {"planned": sum(sum(run.variants.values()) for run in self._planning), **self._tally.counts,
               "own CPU seconds in this process": round(own_cpu.total(), 2)}
        if self.stats_log is not None:
            failed = self.stats_log.failed
            out["stats log"] = str(self.stats_log.path) + (f" (off after a failed write: {failed})" if failed else "")
        return out

    def __enter__(self) -> "Session":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


_current: Session | None = None
_current_lock = threading.Lock()


def start(families=("triton",), **options) -> Session:
    """Start this process's session (idempotent): helpers start, hooks install."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Session(families, **options).start()
            atexit.register(_current.close, EXIT_GRACE_S)
        return _current


def current() -> Session | None:
    return _current


def stop() -> None:
    global _current
    with _current_lock:
        session, _current = _current, None
    if session is not None:
        session.close()
