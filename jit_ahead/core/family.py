"""The family contract: what the session, planning and saved plans ask of a kernel family (Triton, the CuTe
DSL, one another package adds), declared once, and the base class holding what every family shares.

A family is found by name in ``jit_ahead/registry.py``: the built-in ones, then those other packages
declare under the entry-point group ``jit_ahead.families``. Its ``FamilyInfo`` names the class below that
implements it, imported only when a session asks for the family (it imports its DSL).

The parts of a family:
- its **builder**, a module helpers import (``FamilySpec.builder``): ``prepare(device_view)`` (optional) once
  per helper, before it reports Ready (shows the kernel libraries the server's GPU, pays the fixed costs;
  returns what the helper reports about itself), then ``build(payload)`` per request (builds into the DSL's
  cache atomically, returns details for the stats log, raises on failure); a launch that builds in place
  runs the same ``build`` on its own thread (the executor's ``build_here``);
- its **executor** side (``ExecutorBase`` in ``core/building/executor.py``): the DSL's hook calls it on a miss;
- the **family** itself (``Family`` below): the pool, the hooks, planning's captures, saved-plan entries,
  records and their replay;
- its **variants** (``core/requests.py``): each buildable variant describes itself (key, label, whether it
  is built, the build request a helper runs), so queueing, replaying and saving plans are written once, here.
"""
from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from . import knobs as core_knobs
from .building.executor import ExecutorBase
from .building.pool import FamilySpec, HelperPool
from .device_view import DeviceView, ViewOnDemand
from .observing import events
from .observing.own_cpu import OwnThread
from .priority import Priority
from .records import KNOB as RECORD_KNOB
from .records import RecordFolder, RecordFormat, dataclass_format, record_folder, recording_enabled
from .requests import VariantBase
from .shared_patch import AttributeHook

if TYPE_CHECKING:
    from .building.table import Ticket
    from .observing.stats import Stats
    from .requests import Variant

# What a family's code imports, from this one module (``docs/families.md``: how to add a family).
__all__ = ["AttributeHook", "DeviceView", "ExecutorBase", "Family", "FamilySpec", "RecordFormat", "VariantBase",
           "dataclass_format"]

log = logging.getLogger("jit_ahead.family")
# How often a wait for builds checks that helpers may still come: once every slot gave up, the rest is
# built on the waiting thread instead of waiting out the timeout.
HELPERS_RECHECK_S = 1.0


class Family(ABC):
    """The family contract, declared once: what the session, planning and saved plans ask of a family (the
    public methods below, abstract where each family has its own), and what every family shares: the
    request table, the pool and executor, the start and close order, queueing variants, records and saved
    plans. The session and planning use a family only through these methods.

    A family declares its ``name``, its pool's ``spec`` and its ``executor_class``, and implements its hooks,
    its capture and its ``record_format``; its variants implement ``core/requests.py``.

    Records (``JIT_AHEAD_RECORD_DIR``): the family's record folders are opened, and their entries replayed,
    in a thread beside the server's start (``_open_records``); what the family records before they are
    open waits in a buffer and is written once they are (``_add_record``). A family with several kinds
    of record (Triton: variants and autotune choices) names each kind by the attribute its folder is
    kept in."""

    name: ClassVar[str]
    spec: ClassVar[FamilySpec]  # the pool's builder module and knobs
    executor_class: ClassVar[type[ExecutorBase]]
    record_kinds: ClassVar[tuple[str, ...]] = ("records",)
    # The DSL's hook, which sends each miss to the executor's ``on_miss``: anything with ``install(handler)``
    # and ``release(handler)`` (Triton's, the CuTe DSL's and TileLang's hook modules; ``AttributeHook``).
    hook: ClassVar[Any] = None
    # What a capture finds besides variants, by the attribute it keeps each in (Triton: the variants one
    # autotuned launch benchmarks, and its tuning tasks): planning passes them to ``absorb`` and saved plans
    # keep them, without reading them.
    extra_kinds: ClassVar[tuple[str, ...]] = ()

    def __init__(self, stats: Stats, *, workers: int | None = None, wait_timeout: float | None = None,
                 preload: Iterable[str] | None = None, device_view: DeviceView | ViewOnDemand | None = None,
                 env_overrides: dict[str, str] | None = None) -> None:
        """``device_view``: what helpers show the kernel libraries of the server's GPU (None: nothing);
        ``env_overrides``: the helpers' environment beyond the server's (where to build: the cache folder
        this process loads from)."""
        self.stats = stats
        self.pool = HelperPool.from_knobs(self.spec, stats, workers=workers, device_view=device_view,
                                          env_overrides=dict(env_overrides or {}))
        self.table = self.pool.table  # what is queued, building and built: the pool's, the executor's too
        self.pool.preload(tuple(preload or ()))
        self.executor = self._new_executor(core_knobs.wait_timeout_s(wait_timeout), core_knobs.guard_mode())
        # one bound method, so that the hook can release it again (a family without a hook may have none)
        self._on_miss = getattr(self.executor, "on_miss", None)
        for kind in self.record_kinds:
            setattr(self, kind, None)
        self._records_lock = threading.Lock()
        self._unrecorded: list[tuple[str, Any]] | None = None
        self._replay_thread: threading.Thread | None = None
        self._hooked = False  # its hooks went in: a family closed without a start removes nobody's
        self._format: RecordFormat | None = None

    def _new_executor(self, wait_timeout: float, guard: str) -> ExecutorBase:
        return self.executor_class(self.pool, self.stats, wait_timeout, guard=guard)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the pool (helpers start when work is queued), install the DSL hooks, open the records."""
        self.pool.start()
        if self._records_wanted():
            self._unrecorded = []
            self._start_recording()
            self._replay_thread = OwnThread(target=self._open_records_and_replay, daemon=True,
                                            name=f"jit_ahead-{self.name}-replay")
            self._replay_thread.start()
        self._install_hooks()
        self._hooked = True

    def close(self, grace: float = 2.0) -> None:
        """Remove every hook and patch this family installed; builds still running after ``grace`` are
        abandoned."""
        if self._hooked:
            self._hooked = False
            self._remove_hooks()
        if self._replay_thread is not None:
            self._replay_thread.join(timeout=grace)
        for kind in self.record_kinds:
            folder = getattr(self, kind)
            if folder is not None:
                folder.close()
        self.pool.close(grace)

    def settle(self, priority: Priority, deadline: float | None) -> bool:
        """Wait until every request up to ``priority`` is built, failed or quarantined, until ``deadline``
        (``time.monotonic``; None: no limit); with no helpers (none configured, or every slot gave up, also
        while this waits), they are built here, on the calling thread. True if they all settled in time."""
        while True:
            if self.pool.builds_nothing():
                self.executor.build_queued(priority, deadline)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = HELPERS_RECHECK_S if remaining is None else min(remaining, HELPERS_RECHECK_S)
            if self.table.wait_settled(priority, step):
                return True
            if remaining is not None and remaining <= step:
                return False

    def start_serving(self) -> None:
        """The engine is serving: helpers exit once the queue is empty (JIT_AHEAD_SERVING_WORKERS keep going)."""
        self.pool.retire_when_idle()

    def preload(self, modules: Iterable[str]) -> None:
        """Libraries the work about to be queued needs: helpers (and the fork server) import them once."""
        self.pool.preload(modules)

    def follow_planning(self, finished: Callable[[], bool]) -> None:
        """``finished()`` says whether every planning run is done: until then the guard knows an unplanned
        variant may still be listed."""
        self.executor.planning_finished = finished

    @property
    def helpers(self) -> int:
        """How many helpers this family's pool runs at most."""
        return self.pool.workers

    def helper_estimate(self) -> tuple[int, float | None]:
        """The helpers that keep building while serving, and the seconds one build takes in a helper as
        measured so far (None before the first): what the ready line's time estimate is made of."""
        pool = self.pool
        return min(pool.workers, pool.serving_workers), pool.cost.helper.value

    def _records_wanted(self) -> bool:
        """Whether this family opens record folders at start (JIT_AHEAD_RECORD_DIR, by default)."""
        return recording_enabled()

    def _install_hooks(self) -> None:
        """The DSL's hooks and listeners that send the executor's misses here: by default, ``hook``."""
        if self.hook is not None:
            self.hook.install(self._on_miss)

    def _remove_hooks(self) -> None:
        """Undo ``_install_hooks`` and ``_start_recording``: nothing of this family survives its close."""
        if self.hook is not None:
            self.hook.release(self._on_miss)

    def _start_recording(self) -> None:
        """Where the family learns what to record: by default each variant its executor meets."""
        self.executor.recorder = self._record

    # -- records ------------------------------------------------------------------------------------------------
    def _open_records_and_replay(self) -> None:
        opened: dict[str, RecordFolder | None] = {}
        try:
            opened = self._open_records()
        except Exception:  # records are an optimisation: the server runs on without them
            log.exception("%s: %s could not be read; no replay, no recording", self.name, RECORD_KNOB)
        with self._records_lock:
            for kind in self.record_kinds:
                folder = opened.get(kind)
                setattr(self, kind, folder if folder is not None and folder.usable else None)
            pending, self._unrecorded = self._unrecorded or [], None
        for kind, item in pending:
            self._add_record(kind, item)

    def _open_records(self) -> dict[str, RecordFolder | None]:
        """Open the family's record folders and queue what they hold (at REPLAY); returns them by kind."""
        folder = record_folder(self._record_format())
        items = folder.read() if folder is not None else []
        variants = [v for v in map(self._replayable, items) if v is not None]
        tickets = self.submit(variants, Priority.REPLAY, source="record") if variants else []
        self.stats.emit(events.Replay(family=self.name, variants=len(items), queued=len(tickets),
                                      folder=str(folder.folder) if folder else None))
        if items:
            log.info("%s: replaying %d recorded variants (%d not built yet) from %s", self.name, len(items),
                     len(tickets), folder.folder)
        return {"records": folder}

    def _replayable(self, item: Any) -> Variant | None:
        """A record or saved-plan entry as the variant it stands for (None: skipped, with one line)."""
        return item

    def _record(self, variant: Variant) -> None:
        """Each variant the executor met (its ``recorder``)."""
        self._add_record("records", variant)

    def _add_record(self, kind: str, item: Any) -> None:
        """Record ``item`` in the folder of ``kind``, or keep it until the folders are open."""
        with self._records_lock:
            if self._unrecorded is not None:
                self._unrecorded.append((kind, item))
                return
            folder = getattr(self, kind)
        if folder is not None and self._recordable(kind, item, folder):
            folder.add([item])

    def _recordable(self, kind: str, item: Any, folder: RecordFolder) -> bool:
        return True

    def wait_replay(self, timeout: float | None = None) -> bool:
        """Wait until the records are read and their variants queued."""
        thread = self._replay_thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    # -- planning: what a family without autotuners or planner set-up does ---------------------------------------
    def enter_planner(self) -> None:
        """In a planner process forked from the server, before it captures anything; by default, nothing."""

    def absorb(self, kind: str, items: list, priority: Priority) -> None:
        """What this family's captures found besides variants, of one of its ``extra_kinds``, from planning or
        a saved plan, for launches of ``priority``; a family without extras is never given any."""
        raise TypeError(f"the {self.name} family's captures find no {kind!r}")

    def extra_encode(self, kind: str, item: Any) -> Any:
        """One extra as JSON, for saved plans."""
        raise TypeError(f"the {self.name} family's captures find no {kind!r}")

    def extra_decode(self, kind: str, entry: Any) -> Any:
        raise TypeError(f"the {self.name} family's captures find no {kind!r}")

    def tune_ahead(self, budget_bytes: int | None = None) -> dict:
        """Before serving, on the GPU: what would otherwise benchmark while serving; by default, nothing."""
        return {}

    def load_into_memory(self) -> dict:
        """Before serving: every variant planned or replayed so far that is built, into the DSL's in-memory
        cache of this process, so that its first launch is an in-memory hit; counts by outcome. By default
        nothing is loaded ahead: the family's hook brings each build in at its call (the CuTe DSL's
        ``cute.compile``, DeepGEMM's and TileLang's loaders), which is where an engine's watcher sees it."""
        return {}

    @abstractmethod
    def capture(self, target: Any = None) -> AbstractContextManager:
        """Planning: a context in which the DSL's launches are captured as requests instead of run."""

    # -- queueing and saved plans: written once, from what each variant says of itself --------------------------
    def submit(self, variants: Iterable, priority: Priority = Priority.BACKGROUND,
               source: str = "plan") -> list[Ticket]:
        """Queue what is not built yet (what a capture found, or variants); ``source`` is "plan" or "record".
        Helpers import the libraries the queued builds need before building them."""
        variants = self._variants_of(variants)
        self.executor.note_planned(variants, source)
        builds = [v.build_request() for v in variants if self._needs_build(v, source)]
        self.pool.preload(sorted({module for build in builds for module in build.modules}))
        return [self.pool.submit(build, priority) for build in builds]

    def _variants_of(self, found: Iterable) -> list[Variant]:
        """What a capture found (its ``requests``), or variants, as a list of variants."""
        return list(getattr(found, "requests", found))

    def _needs_build(self, variant: Variant, source: str) -> bool:
        return not variant.is_built()

    @abstractmethod
    def record_format(self) -> RecordFormat:
        """How the family's variants are written to records and saved plans, under which header."""

    def _record_format(self) -> RecordFormat:
        if self._format is None:  # asked once per saved-plan entry; the header reads versions
            self._format = self.record_format()
        return self._format

    def plan_header(self) -> dict:
        """What the family's saved entries depend on besides themselves (a saved plan is keyed by it)."""
        return dict(self._record_format().header)

    def plan_encode(self, variant: Any) -> dict:
        return self._record_format().encode(variant)

    def plan_decode(self, entry: dict) -> Any:
        return self._replayable(self._record_format().decode(entry))
