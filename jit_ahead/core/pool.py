"""A family-agnostic pool of long-lived helper subprocesses.

Each helper slot is served by one thread that starts the helper, hands it one job at a time from the
request table, and reads the result. A helper that dies (exit, signal, ``kill -9``) closes its pipe, so
the slot thread sees end-of-stream at once, gives the job's claim back to the table (waiters wake and
may build in place) and starts a new helper after a backoff. The pool knows nothing about any DSL:
the family names a builder module that helpers import, and its requests carry opaque payloads.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from . import events
from .device_view import DeviceView, ViewOnDemand
from .forkserver import ForkServer, ForkServerGone, describe_exit
from .helper_env import helper_environment, start_helper_process
from .knobs import checked_process_count, checked_seconds
from .processes import Spawner, end_tree
from .priority import Priority
from .protocol import (Configure, Job, JobDone, Preload, PreloadDone, ProtocolError, Ready, Shutdown, read_message,
                       write_message)
from .requests import BuildRequest
from .stats import Stats
from .table import RequestTable, State, Ticket

log = logging.getLogger("jit_ahead.pool")

HELPER_ENTRY = "jit_ahead_helpers.worker"


@dataclass(frozen=True)
class FamilySpec:
    """What the pool needs to know about a family: its name and the builder helpers import."""

    name: str
    builder: str  # the module helpers import: core/family.py's Builder (prepare, then build per request)
    workers_knob: str
    preload_knob: str  # modules helpers import as soon as they start


class Ewma:
    """Exponentially weighted mean of build seconds: the pool's measurement of how long builds take."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.value: float | None = None
        self.samples = 0

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else self.alpha * sample + (1 - self.alpha) * self.value
        self.samples += 1


class Stint(enum.Enum):
    """How a slot's time with one helper ended."""

    WORKED = "worked"  # it built, then had nothing left: the slot waits for work, then starts a fresh one
    IDLE = "idle"  # nothing was queued for it (or serving needs fewer helpers): no backoff either
    REFRESH = "refresh"  # a fresh fork that has the newly preloaded modules takes its place at once
    DIED = "died"  # it died starting, importing or idle: the next start comes after a growing backoff
    CRASHED = "crashed"  # it died building: charged to that request (quarantine bounds the repeats), so
    # the next helper starts after the initial backoff only: other requests are not held up for long


# A helper with nothing to take for this long exits (it holds host memory); planning queues its finds at
# shorter intervals, so a helper does not exit between two of them.
HELPER_IDLE_S = 0.5
# The fork server exits once no helper has run for this long (it holds the imported libraries); the next
# build starts a new one.
FORKSERVER_IDLE_S = 30.0


class _Helper:
    """One running helper process (spawned, or forked by the fork server) and the parent's pipe ends."""

    def __init__(self, name: str, proc, to_helper, from_helper, *, forked: bool = False,
                 sent_preload: int = 0) -> None:
        self.name = name
        self.proc = proc  # subprocess.Popen or forkserver.ForkedProcess
        self.to_helper = to_helper
        self.from_helper = from_helper
        self.forked = forked
        self.sent_preload = sent_preload  # how many of the pool's preload modules this helper has
        self.modules: set[str] = set()  # modules it has imported (preloads, earlier jobs')

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: object) -> bool:
        try:
            write_message(self.to_helper, message)
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def receive(self, timeout: float | None) -> object:
        """The next message; None at end of stream; TimeoutError if nothing came within ``timeout``."""
        if timeout is not None:
            readable, _, _ = select.select([self.from_helper], [], [], timeout)
            if not readable:
                raise TimeoutError
        return read_message(self.from_helper)

    def describe_exit(self) -> str:
        return describe_exit(self.proc)

    def wait_or_kill(self, timeout: float) -> None:
        """Wait for the process to exit; kill it with the compiler it may be running after ``timeout`` (a
        half-built entry is never published: Triton writes each cache entry atomically)."""
        if not self.exited_within(timeout):
            self.kill_tree()
            self.reap()

    def exited_within(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill_tree(self) -> None:
        end_tree(self.proc.pid)

    def reap(self) -> None:
        """After ``kill_tree``: wait for the exit to be seen."""
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            log.warning("helper %s (pid %d) did not exit after SIGKILL", self.name, self.proc.pid)

    def stop(self, grace: float) -> None:
        if self.proc.poll() is None:
            self.send(Shutdown())
            self.wait_or_kill(grace)
        for stream in (self.to_helper, self.from_helper):
            try:
                stream.close()
            except OSError:
                pass


class HelperPool:
    """Helpers for one family plus its request table.

    ``workers=0`` starts no helpers: requests stay queued and every miss builds in place.
    ``start_mode="server"`` forks helpers from one fork server that is a fork of this process, made
    before serving starts (everything the server imported is there already); ``"fork"`` from a fork
    server started as a fresh interpreter that imports everything once (also after serving started);
    ``"spawn"`` starts each helper as its own interpreter (also the fallback if the fork server fails).
    """

    def __init__(self, family: FamilySpec, *, workers: int, stats: Stats,
                 env_overrides: dict[str, str] | None = None,
                 device_view: DeviceView | ViewOnDemand | None = None,
                 python: str = sys.executable,
                 build_timeout: float = 600.0, start_timeout: float = 120.0, quarantine_after: int = 2,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0, max_start_failures: int = 5,
                 start_mode: str = "server", serving_workers: int | None = None) -> None:
        if start_mode not in ("server", "fork", "spawn"):
            raise ValueError(f"start_mode must be 'server', 'fork' or 'spawn', not {start_mode!r}")
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
        self.table = RequestTable(quarantine_after=quarantine_after)
        self.helper_seconds = Ewma()  # measured helper build time, per build
        self.local_seconds = Ewma()  # measured in-place build time on the executor, per build
        self._env = helper_environment(os.environ, env_overrides or {})
        self._device_view = device_view
        self._python = python
        self._build_timeout = build_timeout
        self._start_timeout = start_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._max_start_failures = max_start_failures
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._retire = threading.Event()  # set at the start of serving: helpers exit once the queue is empty
        self._threads: list[threading.Thread] = []
        self._helpers: dict[int, _Helper] = {}
        self._starting = 0  # slots that are starting a helper right now
        self._slots_running = 0  # slot threads that have not given up or stopped (they restart helpers)
        self._started = False
        self._preload: list[str] = []
        self._bad_preloads: set[str] = set()
        self._job_ids = itertools.count(1)
        self._forking = start_mode in ("server", "fork") and hasattr(os, "fork")
        self._fork_from_server = start_mode == "server"  # off after serving starts, or if it failed
        self._forkserver: ForkServer | None = None
        self._forkserver_lock = threading.Lock()  # held while it starts or imports
        self._forkserver_preloaded = 0  # how many of self._preload the fork server has imported
        self._forkserver_deaths = 0
        self._max_forkserver_deaths = 3  # then every helper is spawned
        self._spawner = Spawner(f"jit_ahead-{family.name}-spawner")  # starts every process of this pool
        self._last_busy = time.monotonic()  # when a helper last ran (the fork server's idle clock)

    @classmethod
    def from_knobs(cls, family: FamilySpec, stats: Stats, *, workers: int | None, env_overrides: dict[str, str],
                   device_view: DeviceView | ViewOnDemand) -> "HelperPool":
        """A family's pool as the environment configures it (helper counts, build timeout, start mode),
        with the modules of the family's preload knob queued for helpers."""
        from . import knobs

        pool = cls(family, workers=knobs.worker_count(family.workers_knob) if workers is None else workers,
                   stats=stats, env_overrides=env_overrides, device_view=device_view,
                   build_timeout=knobs.build_timeout_s(), start_mode=knobs.helper_start_mode(),
                   serving_workers=knobs.serving_worker_count())
        pool.preload(knobs.preload_modules(family.preload_knob))
        return pool

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            self._slots_running = self.workers
            for slot in range(self.workers):
                thread = threading.Thread(target=self._slot_main, args=(slot,), daemon=True,
                                          name=f"jit_ahead-{self.family.name}-slot{slot}")
                self._threads.append(thread)
        for thread in self._threads:
            thread.start()

    def close(self, grace: float = 5.0) -> None:
        """Stop taking work, ask helpers to exit, kill those that do not within ``grace`` seconds."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.table.close()
        with self._lock:
            helpers = list(self._helpers.values())
        for helper in helpers:
            helper.send(Shutdown())  # an idle helper exits at once; a busy one after its build
        deadline = time.monotonic() + grace  # one deadline for all, not ``grace`` per helper
        late = [helper for helper in helpers if not helper.exited_within(max(0.0, deadline - time.monotonic()))]
        for helper in late:  # all killed before any is waited for: their exits overlap
            helper.kill_tree()
        for helper in late:
            helper.reap()
        # before joining the slots: one may be waiting on the fork server (an import), which this ends
        self._close_forkserver(max(0.0, deadline - time.monotonic()), forever=True)
        for thread in self._threads:
            thread.join(timeout=grace + 1)
        self._spawner.close()

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
        return ticket

    def submit_claimed(self, request: BuildRequest, priority: Priority, owner: str) -> tuple[Ticket, bool]:
        """Submit and, if it is still queued, claim it for ``owner`` before any helper can take it."""
        self._check_family(request)
        ticket, change, claimed = self.table.submit_claimed(request, priority, owner)
        self._report_submit(request, ticket, change)
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
        with self._lock:
            for name in modules:
                if name not in self._preload:
                    self._preload.append(name)

    # -- measurements used by the executor's choice -------------------------------------------------------
    def live_helpers(self) -> int:
        with self._lock:
            return len(self._helpers)

    def helper_pids(self) -> dict[str, int]:
        with self._lock:
            return {h.name: h.pid for h in self._helpers.values()}

    def helper_has_modules(self, request: BuildRequest) -> bool:
        """Whether a running helper has imported the request's modules; one that has not would import
        the kernel library first (seconds), while the launching process has it imported already."""
        needed = set(request.modules)
        with self._lock:
            return any(needed <= helper.modules for helper in self._helpers.values())

    def builds_nothing(self) -> bool:
        """True once the pool has started and no helper will build what is queued: none configured, or
        every slot gave up. Misses then build in place, and so does ``Session.wait_ready``."""
        return self._started and not self.may_get_helpers()

    def may_get_helpers(self) -> bool:
        """True while a helper is running or a slot is still starting one or backing off to retry."""
        with self._lock:
            return bool(self._helpers) or self._starting > 0 or self._slots_running > 0

    def expected_helper_wait(self, ticket: Ticket) -> float | None:
        """Seconds until a helper would finish ``ticket`` if we wait, by measurement; None if unknown."""
        helpers = self.live_helpers()
        if helpers == 0:
            return None
        per_build = self.helper_seconds.value
        if per_build is None:
            return None
        busy = [t for t in self.table.running() if t.owner and t.owner.startswith("helper")]
        now = time.monotonic()
        if len(busy) < helpers:
            free_in = 0.0
        else:
            free_in = min(max(0.0, per_build - (now - (t.started_at or now))) for t in busy)
        rounds = self.table.queued_ahead(ticket) // helpers
        return free_in + rounds * per_build + per_build

    def prefer_in_place(self, ticket: Ticket) -> bool:
        """Whether building ``ticket`` on the calling thread now beats waiting for a helper."""
        if not self.may_get_helpers() or ticket.crashes:
            return True
        helper_wait = self.expected_helper_wait(ticket)
        if helper_wait is None:
            # No helper measurement yet: waiting costs a full build at worst; prefer a free helper.
            return self.live_helpers() == 0
        local = self.local_seconds.value if self.local_seconds.value is not None else helper_wait
        return local < helper_wait

    # -- slots --------------------------------------------------------------------------------------------
    def _slot_main(self, slot: int) -> None:
        try:
            self._run_slot(slot)
        except Exception as exc:  # a bug guard: the pool runs on with one slot fewer, never a dead thread
            log.error("%s helper slot %d stopped (%s: %s); running with one helper fewer, misses build in place",
                      self.family.name, slot, type(exc).__name__, exc)
        finally:
            with self._lock:
                self._slots_running -= 1
                last = self._slots_running == 0
            if last:  # no helper will be forked again: give its memory back
                self._close_forkserver(0.0 if self._closed.is_set() else 5.0, forever=True)
            self.table.notify()  # launches waiting on queued work re-decide: this slot is gone

    def _wait_for_work(self, slot: int) -> bool:
        """Block until something is queued (no helper is started for nothing); False once the pool is
        closed, or serving needs this slot no more."""
        while not self._closed.is_set():
            if self._retire.is_set() and slot >= self.serving_workers:
                return False
            if self.table.has_queued():
                return True
            self._close_idle_forkserver()
            self.table.wait_queued(0.5)
        return False

    def _run_slot(self, slot: int) -> None:
        backoff = self._backoff_initial
        failures = 0
        while self._wait_for_work(slot):
            with self._lock:
                self._starting += 1
            helper = None
            try:
                helper = self._start_helper(slot)
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
                outcome = Stint.DIED
            else:
                failures = 0
                outcome = Stint.DIED
                try:
                    outcome = self._serve(helper, slot)
                finally:
                    with self._lock:
                        self._helpers.pop(slot, None)
                        self._last_busy = time.monotonic()
                    helper.stop(5.0)
                if outcome not in (Stint.DIED, Stint.CRASHED) and self._retire.is_set():
                    self.stats.emit(events.HelperRetired(family=self.family.name, helper=helper.name))
            self.table.notify()  # launches waiting on queued work re-decide: a helper went away
            if outcome is Stint.DIED:
                if self._closed.wait(backoff):
                    break
                backoff = min(backoff * 2, self._backoff_max)
            elif outcome is Stint.CRASHED:
                backoff = self._backoff_initial
                if self._closed.wait(backoff):
                    break
            elif outcome is not Stint.IDLE:
                backoff = self._backoff_initial

    def _start_helper(self, slot: int) -> _Helper | None:
        name = f"helper-{slot}"
        if self._forking and not self._closed.is_set():
            try:
                return self._fork_helper(name)
            except ForkServerGone as exc:
                self._stop_forking(f"the fork server {exc}")
        if self._closed.is_set():  # closing (the fork server is gone for that reason): no new helper
            return None
        return self._spawn_helper(name)

    def _spawn_helper(self, name: str) -> _Helper | None:
        t0 = time.perf_counter()
        try:
            config = self._configure_message()  # before the process exists: nothing to clean up if it fails
        except OSError as exc:
            log.error("%s %s could not be started (%s); retrying with backoff", self.family.name, name, exc)
            return None
        to_parent_r, to_parent_w = os.pipe()
        to_helper_r, to_helper_w = os.pipe()
        try:
            proc = self._spawner.run(start_helper_process, self._python, HELPER_ENTRY, (to_helper_r, to_parent_w),
                                     self._env)
        except OSError as exc:
            for fd in (to_parent_r, to_parent_w, to_helper_r, to_helper_w):
                os.close(fd)
            log.error("%s %s could not be started (%s); retrying with backoff", self.family.name, name, exc)
            return None
        os.close(to_helper_r)
        os.close(to_parent_w)
        helper = _Helper(name, proc, os.fdopen(to_helper_w, "wb", buffering=0),
                         os.fdopen(to_parent_r, "rb", buffering=0))
        if not helper.send(config):
            return self._handshake(helper, t0, None)
        return self._handshake(helper, t0, self._start_timeout)

    def _fork_helper(self, name: str) -> _Helper | None:
        """A helper forked from the fork server, which has imported everything preloaded so far."""
        with self._forkserver_lock:
            server = self._forkserver_with_preloads()
            t0 = time.perf_counter()
            proc, to_helper, from_helper = server.fork(name)
            helper = _Helper(name, proc, to_helper, from_helper, forked=True,
                             sent_preload=self._forkserver_preloaded)
            with self._lock:
                helper.modules = set(self._preload[:self._forkserver_preloaded]) - self._bad_preloads
        return self._handshake(helper, t0, self._start_timeout)

    def _handshake(self, helper: _Helper, t0: float, timeout: float | None) -> _Helper | None:
        """Wait for the helper's Ready; None (and the helper stopped) if it does not come."""
        ready = None
        if timeout is not None:
            try:
                ready = helper.receive(timeout)
            except (TimeoutError, ProtocolError, EOFError):
                ready = None
        if self._closed.is_set():  # closing began while it started: it takes no work, and says nothing
            helper.stop(0.0)
            return None
        if not isinstance(ready, Ready):
            reason = "no handshake" if ready is None else f"unexpected {type(ready).__name__}"
            log.error("%s %s (pid %d) failed to start: %s, %s", self.family.name, helper.name, helper.pid, reason,
                      helper.describe_exit() if helper.proc.poll() is not None else "killed")
            helper.stop(0.0)
            return None
        self.stats.emit(events.HelperReady(family=self.family.name, helper=helper.name, pid=helper.pid,
                                           seconds=time.perf_counter() - t0, info=ready.info))
        log.debug("%s %s ready (pid %d) in %.2fs", self.family.name, helper.name, helper.pid,
                  time.perf_counter() - t0)
        return helper

    def _configure_message(self) -> Configure:
        """Raises OSError when the GPU's view cannot be read (it is read the first time it is needed)."""
        try:
            view = self._device_view.get() if isinstance(self._device_view, ViewOnDemand) else self._device_view
        except Exception as exc:  # a GPU in an error state, a broken driver: a start failure, retried
            raise OSError(f"cannot read the GPU's properties for helpers ({type(exc).__name__}: {exc})") from exc
        return Configure(sys_path=tuple(sys.path), builder=self.family.builder, device_view=view)

    # -- the fork server ------------------------------------------------------------------------------------
    def _forkserver_with_preloads(self) -> ForkServer:
        """The running fork server, started if need be, having imported every module preloaded so far.
        Called with _forkserver_lock held; raises ForkServerGone."""
        server = self._forkserver
        if self._closed.is_set() or not self._forking:
            raise ForkServerGone("is not started: the pool is closing or retired")
        if server is not None and not server.alive:
            log.warning("%s: the fork server (pid %d) exited (%s)", self.family.name, server.process.pid,
                        describe_exit(server.process))
            self._forkserver_died(server)
            server = None
        if server is None:
            self._forkserver_preloaded = 0  # a new fork server imports every (good) preload module again
            server, ready, t0 = self._start_forkserver()
            self.stats.emit(events.ForkServerReady(family=self.family.name, helper="forkserver", pid=ready.pid,
                                                   seconds=time.perf_counter() - t0, info=ready.info))
            with self._lock:
                keep = self._forking
                if keep:
                    self._forkserver = server
            if not keep:  # closed while it started
                server.close(0.0)
                raise ForkServerGone("is not needed any more: the pool is closing or retired")
        with self._lock:
            upto = len(self._preload)
            new = tuple(m for m in self._preload[self._forkserver_preloaded:upto] if m not in self._bad_preloads)
        if new:
            t0 = time.perf_counter()
            failed: dict[str, str] = {}
            for module in new:  # one at a time: a module whose import kills it is the only one blamed
                try:
                    failed.update(server.preload((module,)).failed)
                except ForkServerGone as exc:
                    # It died importing this one: never preload it again (a build that needs it imports it
                    # inside the job, where a crash is charged to that request); start a new fork server.
                    with self._lock:
                        self._bad_preloads.add(module)
                    log.warning("%s: the fork server died while preloading %s (%s); it will not be preloaded",
                                self.family.name, module, exc)
                    self._forkserver_died(server)
                    return self._forkserver_with_preloads()
            self._report_preload("forkserver", new, PreloadDone(failed), t0, event=events.ForkServerPreloaded)
        self._forkserver_preloaded = upto
        return server

    def _start_forkserver(self) -> tuple[ForkServer, object, float]:
        """A fork of this process while serving has not started (a fork then copies the serving
        process's page tables with its GIL held), else, or if that fails, a fresh interpreter. Called
        with _forkserver_lock held; raises ForkServerGone."""
        try:
            config = self._configure_message()
        except OSError as exc:
            raise ForkServerGone(f"could not be started ({exc})") from exc
        from_server = self._fork_from_server and not self._retire.is_set()
        server = ForkServer(python=self._python, env=self._env, start_timeout=self._start_timeout,
                            build_timeout=self._build_timeout, spawner=self._spawner, from_server=from_server)
        t0 = time.perf_counter()
        try:
            return server, server.start(config), t0
        except ForkServerGone as exc:
            if not from_server:
                raise
            self._fork_from_server = False
            log.warning("%s: a fork of this process could not become the fork server (%s); a fresh "
                        "interpreter takes its place", self.family.name, exc)
        server = ForkServer(python=self._python, env=self._env, start_timeout=self._start_timeout,
                            build_timeout=self._build_timeout, spawner=self._spawner)
        t0 = time.perf_counter()
        return server, server.start(config), t0

    def _forkserver_died(self, server: ForkServer) -> None:
        """Count a fork server's death and forget it (its helpers run on; new ones come from a new fork
        server); raises ForkServerGone once it has died too often. Called with _forkserver_lock held."""
        self._forkserver_deaths += 1
        server.close(0.0)
        if self._forkserver_deaths >= self._max_forkserver_deaths:
            raise ForkServerGone(f"exited {self._forkserver_deaths} times")
        self._forkserver = None

    def _refresh_forkserver(self) -> None:
        """Have the fork server import what was preloaded since; stop forking if it cannot."""
        try:
            with self._forkserver_lock:
                self._forkserver_with_preloads()
        except ForkServerGone as exc:
            self._stop_forking(f"the fork server {exc}")

    def _stop_forking(self, why: str) -> None:
        with self._forkserver_lock:
            if not self._forking:
                return
            self._forking = False
        if not self._closed.is_set():
            log.error("%s: %s; starting each helper as its own process from now on", self.family.name, why)
        self._close_forkserver(0.0, forever=True)

    def _close_forkserver(self, grace: float, forever: bool = False) -> None:
        """Close the fork server; ``forever``: the pool forks no more (it is closing, or forking failed).
        Not under _forkserver_lock, which a slot holds while the fork server imports: a slot still using
        this server sees its requests fail."""
        with self._lock:
            server, self._forkserver = self._forkserver, None
            if forever:
                self._forking = False
        if server is not None:
            server.close(grace)

    def _close_idle_forkserver(self) -> None:
        """No helper for FORKSERVER_IDLE_S and nothing queued: the fork server's imports go too."""
        with self._lock:
            if (self._forkserver is None or self._helpers or self._starting
                    or time.monotonic() - self._last_busy < FORKSERVER_IDLE_S):
                return
        if not self._forkserver_lock.acquire(blocking=False):  # a slot is using it right now
            return
        try:
            with self._lock:
                if self._helpers or self._starting:
                    return
                server, self._forkserver = self._forkserver, None
            if server is not None:
                log.info("%s: no helper for %.0fs; the fork server exits", self.family.name, FORKSERVER_IDLE_S)
                self.stats.emit(events.ForkServerIdleExit(family=self.family.name))
                server.close(1.0)
        finally:
            self._forkserver_lock.release()

    def _send_preloads(self, helper: _Helper) -> Stint | None:
        """Bring the helper's imports up to the pool's preload list. A forked helper is replaced by a fresh
        fork once the fork server has imported the new modules (REFRESH); a spawned one imports them
        itself. DIED if it died importing them; None when it is up to date."""
        with self._lock:
            new = tuple(m for m in self._preload[helper.sent_preload:] if m not in self._bad_preloads)
            if not helper.forked:
                helper.sent_preload = len(self._preload)
        if not new:
            return None
        if helper.forked:
            self._refresh_forkserver()
            return Stint.REFRESH
        t0 = time.perf_counter()
        failed: dict[str, str] = {}
        for module in new:  # one at a time: a module whose import kills the helper is the only one blamed
            reply = None
            if helper.send(Preload((module,))):
                try:
                    reply = helper.receive(self._build_timeout)
                except (TimeoutError, ProtocolError):
                    helper.proc.kill()
            if not isinstance(reply, PreloadDone):
                # It died importing this one: never preload it again; a build that needs it imports it
                # inside the job, where a crash is charged to that request (and can quarantine it).
                with self._lock:
                    self._bad_preloads.add(module)
                log.warning("%s %s (pid %d) died while preloading %s (%s); it will not be preloaded",
                            self.family.name, helper.name, helper.pid, module, helper.describe_exit())
                return Stint.DIED
            failed.update(reply.failed)
            if module not in reply.failed:
                helper.modules.add(module)
        self._report_preload(helper.name, new, PreloadDone(failed), t0)
        return None

    def _report_preload(self, who: str, modules: tuple[str, ...], reply: PreloadDone, t0: float,
                        event: type[events.HelperPreloaded] = events.HelperPreloaded) -> None:
        for module, error in reply.failed.items():
            log.warning("%s %s could not preload %s (%s); its builds will report the error",
                        self.family.name, who, module, error)
        self.stats.emit(event(family=self.family.name, helper=who, modules=len(modules),
                              failed=sorted(reply.failed), seconds=time.perf_counter() - t0))

    def _serve(self, helper: _Helper, slot: int) -> Stint:
        """Feed ``helper`` jobs until nothing is left for it, it dies, it needs replacing or the pool
        closes."""
        built = False
        while not self._closed.is_set():
            if helper.proc.poll() is not None:
                log.warning("%s %s (pid %d) exited while idle (%s); starting a new one", self.family.name,
                            helper.name, helper.pid, helper.describe_exit())
                return Stint.DIED
            outdated = self._send_preloads(helper)
            if outdated is not None:
                return outdated
            if self._retire.is_set() and slot >= self.serving_workers:
                break  # serving: fewer helpers beside the executor
            ticket = self.table.take_next(helper.name, timeout=HELPER_IDLE_S)
            if ticket is None:
                break  # nothing left: give the host memory back; a new helper comes with new work
            with self._lock:
                missing = set(ticket.request.modules) - helper.modules - self._bad_preloads
            if helper.forked and missing:
                # Its library was named after this helper was forked: the fork server imports it once
                # for all helpers, instead of each helper on its own; meanwhile the executor may claim it.
                self.table.release(ticket, crashed=False)
                self.preload(ticket.request.modules)
                self._refresh_forkserver()
                return Stint.REFRESH
            try:
                gone = self._run_job(helper, ticket)
            except Exception:  # a bug guard: the ticket must not stay RUNNING for a slot that is gone
                if ticket.state is State.RUNNING and ticket.owner == helper.name:
                    self.table.release(ticket, crashed=False)
                raise
            if gone is not None:
                return gone
            built = True
        return Stint.WORKED if built else Stint.IDLE

    def _run_job(self, helper: _Helper, ticket: Ticket) -> Stint | None:
        """Build one ticket in ``helper``; None if the helper is still there afterwards, else how it
        went (CRASHED: it died building, charged to the request)."""
        request = ticket.request
        job_id = next(self._job_ids)
        self.stats.emit(events.BuildStart(family=self.family.name, key=request.key, label=request.label,
                                          helper=helper.name, priority=ticket.priority.name))
        if not helper.send(Job(job_id, request)):
            self.table.release(ticket, crashed=False)
            return Stint.DIED
        t0 = time.perf_counter()
        try:
            reply = helper.receive(self._build_timeout)
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
            return Stint.DIED
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
            return Stint.CRASHED
        result = dataclasses.replace(reply.result, builder=helper.name)
        if result.ok:
            self.helper_seconds.add(result.seconds)
            helper.modules.update(request.modules)
        else:
            log.error("%s %s failed to build %s:\n%s", self.family.name, helper.name, request.label, result.error)
        self.table.finish(ticket, result)
        self.stats.emit(events.BuildFinish(family=self.family.name, key=request.key, label=request.label,
                                           helper=helper.name, ok=result.ok, error=result.error,
                                           seconds=result.seconds))
        return None

    # -- in-place builds on the executor --------------------------------------------------------------------
    def record_local_build(self, seconds: float) -> None:
        self.local_seconds.add(seconds)
