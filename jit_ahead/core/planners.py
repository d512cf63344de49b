"""Running planned launches: in planner processes forked from the server, or in the planning thread.

Enumerating a model's launch space is thousands of meta-tensor forwards: Python work that would hold
the server's GIL for as long as it runs. So the planning thread lists the launches (in priority order)
and forks planners from the server: each has the model, the providers' sites and every kernel library
already imported, and runs every Nth launch in captures, at nice 19, with no GPU (the server's device
view, pinned). A planner streams what it finds back over a pipe; the planning thread submits it to the
families' pools as it arrives, so helpers start building while planners still enumerate.

A planner touches nothing of the server: it holds copies of the server's memory, uses no GPU, and is
killed by the kernel when the planning thread that forked it ends. A planner that dies or stops making
progress is replaced by a fresh one that resumes after the launch it was running (that launch is
reported and skipped); a shard that keeps failing is run in the planning thread before serving, or
given up with one log line once serving has started.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import mmap
import os
import select
import signal
import struct
import subprocess
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .priority import Priority
from .processes import ForkedChild, detach_from_server, end_tree, fork_quietly, lower_priority
from .protocol import ProtocolError, read_message, write_message

log = logging.getLogger("jit_ahead.planning")

SEND_EVERY_S = 0.25  # a planner sends what it found at least this often
STALL_S = 60.0  # a planner whose launch runs this long without returning is taken to hang
PAUSE_POLL_S = 0.1  # how often a paused planner looks whether it may go on
MAX_RESPAWNS = 3  # per shard, before its rest runs in the planning thread (or is given up while serving)


_in_planner = False


def in_planner() -> bool:
    """True in a planner process: no thread of the server runs here (process-wide memos are safe)."""
    return _in_planner


@dataclass(frozen=True)
class LaunchGroup:
    """Launches of one family at one priority, in the order they are run."""

    priority: Priority
    family: str
    items: Sequence  # (provider, PlannedLaunch)


@dataclass(frozen=True)
class Failure:
    provider: str
    error: str  # exception type name
    message: str
    launch: str


@dataclass(frozen=True)
class Found:
    """Requests a planner captured since its last message, for launches of group ``group``."""

    group: int
    requests: tuple
    groups: tuple = ()  # autotune groups (Triton: the variants one autotuned launch benchmarks)
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True)
class GroupDone:
    group: int


@dataclass(frozen=True)
class Finished:
    launches: int
    seconds: float


class Sink(ABC):
    """What the planning thread does with results; called on that thread only."""

    @abstractmethod
    def found(self, group: int, requests: list, autotune_groups: list) -> None:
        """Requests (and autotune groups) captured by launches of ``group``, in first-seen order."""

    @abstractmethod
    def group_done(self, group: int) -> None:
        """Every launch of ``group`` has run (groups are reported in order)."""

    @abstractmethod
    def failed(self, failure: Failure) -> None:
        """A launch raised, or its planner died in it."""

    @abstractmethod
    def lost(self, group: int, count: int, why: str) -> None:
        """``count`` launches from ``group`` on will not run (serving started before they could)."""


@dataclass(frozen=True)
class Position:
    group: int
    item: int


class _Captures:
    """One capture per family for a whole run (repeated shapes hit each capture's in-memory cache), and
    what of each has been reported already."""

    def __init__(self, families: dict, stack: contextlib.ExitStack) -> None:
        self._families = families
        self._stack = stack
        self._open: dict[str, list] = {}  # family -> [capture, requests sent, autotune groups sent]

    def open(self, family: str) -> None:
        if family not in self._open:
            self._open[family] = [self._stack.enter_context(self._families[family].capture()), 0, 0]

    def fresh(self, family: str) -> tuple[list, list]:
        """Requests and autotune groups captured since the last call (captures keep first-seen order)."""
        entry = self._open.get(family)
        if entry is None:
            return [], []
        plan, sent, sent_groups = entry
        requests = plan.requests[sent:]
        groups = list(getattr(plan, "autotune_groups", ()))[sent_groups:]
        entry[1] += len(requests)
        entry[2] += len(groups)
        return requests, groups


def _positions(groups: Sequence[LaunchGroup], start: Position, offset: int, stride: int):
    """The (group, item) positions of one shard from ``start`` on: items ``offset`` mod ``stride``."""
    for g in range(start.group, len(groups)):
        first = start.item if g == start.group else 0
        first += (offset - first) % stride
        for j in range(first, len(groups[g].items), stride):
            yield Position(g, j)


class _Runner:
    """Runs positions in this process, one capture per family, and reports what they found through
    ``found(group, requests, autotune_groups, failures)`` and ``group_done(group)``: every group before
    the position now running is done (for this shard)."""

    def __init__(self, groups: Sequence[LaunchGroup], families: dict, found: Callable, group_done: Callable,
                 progress: Callable[[Position], None] | None = None,
                 paused: Callable[[], bool] | None = None, waiting: Callable[[bool], None] = lambda _: None) -> None:
        """``paused``: checked before each launch; while it is true the runner sends what it found and
        waits (a planner asked to make room for serving), saying so through ``waiting(True)`` and
        ``waiting(False)`` when it goes on."""
        self._groups = groups
        self._families = families
        self._found = found
        self._group_done = group_done
        self._progress = progress
        self._paused = paused
        self._wait = waiting
        self.launches = 0

    def run(self, start: Position, offset: int, stride: int, stop: Callable[[], bool] = lambda: False) -> Position | None:
        """Run the shard from ``start``; returns the position it stopped at when ``stop()`` turned true
        (checked before each launch), None once it ran to the end."""
        groups = self._groups
        failures: dict = {}
        with contextlib.ExitStack() as stack:
            captures = _Captures(self._families, stack)
            last = time.perf_counter()
            current = start.group

            def send(index: int) -> None:
                requests, autotune_groups = captures.fresh(groups[index].family)
                if requests or autotune_groups or failures:
                    self._found(index, requests, autotune_groups, list(failures.values()))
                    failures.clear()

            for position in _positions(groups, start, offset, stride):
                if position.group != current:
                    send(current)
                    for g in range(current, position.group):
                        self._group_done(g)
                    current = position.group
                if stop():
                    send(current)
                    return position
                if self._paused is not None and self._paused():
                    send(current)  # what it found reaches the helpers before it waits
                    self._wait(True)
                    while self._paused():
                        time.sleep(PAUSE_POLL_S)
                    self._wait(False)
                if self._progress is not None:
                    self._progress(position)
                provider, launch = groups[position.group].items[position.item]
                captures.open(groups[position.group].family)
                try:
                    launch.run()
                except Exception as exc:
                    key = (provider.name, type(exc).__name__)
                    if key not in failures:  # one report per provider and error
                        text = str(exc).splitlines()[0][:500] if str(exc) else ""
                        failures[key] = Failure(provider.name, type(exc).__name__, text, launch.label)
                self.launches += 1
                if time.perf_counter() - last > SEND_EVERY_S:
                    send(current)
                    last = time.perf_counter()
            if current < len(groups):
                send(current)
            for g in range(current, len(groups)):
                self._group_done(g)
        return None


def _deliver(sink: Sink, group: int, requests, autotune_groups, failures) -> None:
    """What launches of ``group`` found (here, or in a planner's Found message), handed to the sink."""
    if requests or autotune_groups:
        sink.found(group, list(requests), list(autotune_groups))
    for failure in failures:
        sink.failed(failure)


def run_in_thread(groups: Sequence[LaunchGroup], families: dict, sink: Sink, start: Position,
                  stop: Callable[[], bool]) -> Position | None:
    """Run every launch from ``start`` on in the calling thread; the position where ``stop()`` turned
    true, or None once all ran."""
    found = functools.partial(_deliver, sink)
    return _Runner(groups, families, found, sink.group_done).run(start, 0, 1, stop)


# -- in a planner process ----------------------------------------------------------------------------------
def _planner_main(groups: Sequence[LaunchGroup], families: dict, start: Position, offset: int, stride: int,
                  out_fd: int, progress: mmap.mmap, pauses: mmap.mmap, slot: int, enter: Callable[[], None]) -> None:
    t0 = time.perf_counter()
    out = os.fdopen(out_fd, "wb", buffering=0)

    def found(group, requests, autotune_groups, failures):
        write_message(out, Found(group, tuple(requests), tuple(autotune_groups), tuple(failures)))

    def at(position: Position) -> None:
        struct.pack_into("!ii", progress, 8 * slot, position.group, position.item)

    enter()
    def waiting(now: bool) -> None:
        pauses[2 * slot + 1] = int(now)

    runner = _Runner(groups, families, found, lambda g: write_message(out, GroupDone(g)), at,
                     lambda: pauses[2 * slot] != 0, waiting)
    runner.run(start, offset, stride)
    struct.pack_into("!ii", progress, 8 * slot, -1, -1)
    write_message(out, Finished(runner.launches, time.perf_counter() - t0))
    out.close()


def _fork_planner(groups, families, start: Position, offset: int, stride: int, progress: mmap.mmap,
                  pauses: mmap.mmap, slot: int, enter: Callable[[], None]) -> tuple[int, object]:
    """Fork one planner; returns (pid, the parent's read end). Raises OSError if it cannot fork."""
    read_fd, write_fd = os.pipe()
    struct.pack_into("!ii", progress, 8 * slot, -1, -1)
    pid = fork_quietly()
    if pid == 0:  # the planner
        global _in_planner
        _in_planner = True
        code = 0
        try:
            os.close(read_fd)
            detach_from_server(keep=(write_fd,))
            lower_priority()
            _planner_main(groups, families, start, offset, stride, write_fd, progress, pauses, slot, enter)
        except BaseException:  # noqa: BLE001 - a planner must never return into the server's code
            code = 1
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, os.fdopen(read_fd, "rb", buffering=0)


@dataclass
class _Shard:
    offset: int
    start: Position
    slot: int
    pid: int = 0
    stream: object = None
    last_news: float = field(default_factory=time.monotonic)
    last_progress: tuple = (-1, -1)
    groups_done: int = 0
    respawns: int = 0
    finished: bool = False
    paused: bool = False  # asked to wait while serving, until another planner finishes
    given_up: bool = False  # no more planners for it: its rest runs in the planning thread, or is lost


class ForkedPlanners:
    """``count`` planner processes sharing ``groups`` (planner k runs items k, k + count, ... of each)."""

    def __init__(self, groups: Sequence[LaunchGroup], families: dict, sink: Sink, count: int,
                 enter: Callable[[], None], start: Position = Position(0, 0), stall_s: float | None = None,
                 serving_count: int | None = None) -> None:
        """``serving_count``: planners left running once serving starts (the others are paused, and
        resumed one at a time as running ones finish); None: all keep running."""
        self._serving_count = serving_count
        self._groups = groups
        self._families = families
        self._sink = sink
        self._count = count
        self._enter = enter
        self._stall_s = STALL_S if stall_s is None else stall_s
        self._progress = mmap.mmap(-1, 8 * count)
        # two bytes per planner: this thread's request that it wait (serving), and its own "waiting now"
        self._pauses = mmap.mmap(-1, 2 * count)
        self._shards = [_Shard(k, start, k, groups_done=start.group) for k in range(count)]
        self._signalled = start.group  # groups below this were reported done to the sink
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._pids: set[int] = set()
        self.planner_seconds: list[float] = []  # each finished planner's own time, fork to last launch

    def run(self, cancelled: threading.Event, serving: Callable[[], bool]) -> None:
        """Fork the planners and feed the sink until every shard is done, or ``cancelled`` is set (then
        the planners are killed). Raises OSError if not even the first planner could be forked."""
        self._cancelled = cancelled
        self._spawn(self._shards[0])
        for shard in self._shards[1:]:
            try:
                self._spawn(shard)
            except OSError as exc:  # fewer planners than asked; the others take nothing of its share
                log.warning("planner %d could not be forked (%s); its share runs in the planning thread",
                            shard.slot, exc)
                shard.given_up = True
        while not cancelled.is_set():
            live = [s for s in self._shards if s.stream is not None]
            if not live:
                break
            self._pace(live, serving())
            readable, _, _ = select.select([s.stream for s in live], [], [], 0.2)
            for shard in live:
                if shard.stream in readable:
                    self._read(shard)
                elif self._pauses[2 * shard.slot + 1]:  # waiting as asked: its stall clock stands still
                    shard.last_news = time.monotonic()
                elif self._stalled(shard):
                    log.warning("planner (pid %d) made no progress for %.0fs in %s; killed", shard.pid,
                                self._stall_s, self._label(shard))
                    end_tree(shard.pid)
        if cancelled.is_set():
            self.kill()
            for shard in self._shards:
                if shard.stream is not None:
                    self._close(shard)
            return
        for shard in self._shards:
            if shard.given_up:
                self._run_here(shard, cancelled, serving)

    def kill(self) -> None:
        """Kill every planner; safe from any thread (the planning thread then sees their pipes end)."""
        with self._lock:
            pids = list(self._pids)
        for pid in pids:
            end_tree(pid)

    # -- internals ----------------------------------------------------------------------------------------
    def _pace(self, live: list[_Shard], serving: bool) -> None:
        """Once serving: no more than ``serving_count`` planners run; the others wait after their current
        launch (having sent what they found), and one goes on whenever a running one ends. A planner
        waits of its own accord, at a launch boundary: one stopped by a signal could be stopped halfway
        through a message this thread is reading."""
        if not serving or self._serving_count is None:
            return
        running = [s for s in live if not s.paused]
        for shard in running[self._serving_count:]:
            self._pauses[2 * shard.slot] = 1
            shard.paused = True
        if len(running) > self._serving_count:
            log.info("serving started: %d planners wait, %d go on (JIT_AHEAD_SERVING_PLANNERS)",
                     len(running) - self._serving_count, self._serving_count)
        waiting = [s for s in live if s.paused]
        for shard in waiting[:max(0, self._serving_count - len(running))]:
            self._pauses[2 * shard.slot] = 0
            shard.paused = False

    def _spawn(self, shard: _Shard) -> None:
        self._pauses[2 * shard.slot:2 * shard.slot + 2] = b"\0\0"
        pid, stream = _fork_planner(self._groups, self._families, shard.start, shard.offset, self._count,
                                    self._progress, self._pauses, shard.slot, self._enter)
        with self._lock:
            self._pids.add(pid)
        shard.pid, shard.stream, shard.paused = pid, stream, False
        shard.last_news, shard.last_progress = time.monotonic(), (-1, -1)

    def _current(self, shard: _Shard) -> Position | None:
        g, j = struct.unpack_from("!ii", self._progress, 8 * shard.slot)
        return None if g < 0 else Position(g, j)

    def _label(self, shard: _Shard) -> str:
        at = self._current(shard)
        return "its start" if at is None else f"launch {self._groups[at.group].items[at.item][1].label}"

    def _stalled(self, shard: _Shard) -> bool:
        now = time.monotonic()
        at = self._current(shard)
        key = (at.group, at.item) if at else (-1, -1)
        if key != shard.last_progress:
            shard.last_progress, shard.last_news = key, now
            return False
        return now - shard.last_news > self._stall_s

    def _read(self, shard: _Shard) -> None:
        try:
            message = read_message(shard.stream)
        except (ProtocolError, OSError, EOFError) as exc:
            log.warning("planner (pid %d): broken stream (%s)", shard.pid, exc)
            message = None
        shard.last_news = time.monotonic()
        if isinstance(message, Found):
            _deliver(self._sink, message.group, message.requests, message.groups, message.failures)
        elif isinstance(message, GroupDone):
            self._shard_done_with(shard, message.group + 1)
        elif isinstance(message, Finished):
            shard.finished = True
            self.planner_seconds.append(message.seconds)
            log.debug("planner (pid %d) ran %d launches in %.1fs", shard.pid, message.launches, message.seconds)
        elif message is None:
            self._ended(shard)

    def _shard_done_with(self, shard: _Shard, groups: int) -> None:
        """``shard`` has run all its launches of the groups below ``groups``: report every group all
        shards are done with."""
        shard.groups_done = max(shard.groups_done, groups)
        done = min(s.groups_done for s in self._shards)
        while self._signalled < done:
            self._sink.group_done(self._signalled)
            self._signalled += 1

    def _ended(self, shard: _Shard) -> None:
        at = self._current(shard)
        self._close(shard)
        if shard.finished or self._cancelled.is_set():  # done, or killed because planning is cancelled
            return
        how = _reap(shard.pid)
        if at is None:  # it died before its first launch (or after its last)
            resume, where = shard.start, "before its first launch"
        else:
            provider, launch = self._groups[at.group].items[at.item]
            where = f"in launch {launch.label}, which is skipped"
            self._sink.failed(Failure(provider.name, "PlannerDied", f"the planner {how}", launch.label))
            resume = Position(at.group, at.item + 1)
        shard.start = resume
        self._shard_done_with(shard, resume.group)
        shard.respawns += 1
        if shard.respawns <= MAX_RESPAWNS:
            log.warning("planner (pid %d) %s %s; a new planner goes on with its share", shard.pid, how, where)
            try:
                self._spawn(shard)
                return
            except OSError as exc:
                log.warning("the planner could not be forked again (%s)", exc)
        else:
            log.warning("planner (pid %d) %s %s; it failed %d times, so its share is not forked again",
                        shard.pid, how, where, shard.respawns)
        shard.given_up = True

    def _run_here(self, shard: _Shard, cancelled: threading.Event, serving: Callable[[], bool]) -> None:
        """A shard no planner could finish: in this thread before serving, else given up."""
        remaining = sum(1 for _ in _positions(self._groups, shard.start, shard.offset, self._count))
        if serving():
            if remaining:
                self._sink.lost(shard.start.group, remaining, "its planner failed after serving started")
            self._shard_done_with(shard, len(self._groups))
            return
        if remaining:
            log.warning("%d launches of a failed planner run in the planning thread", remaining)

        runner = _Runner(self._groups, self._families, functools.partial(_deliver, self._sink),
                         lambda g: self._shard_done_with(shard, g + 1))
        stopped = runner.run(shard.start, shard.offset, self._count,
                             lambda: cancelled.is_set() or serving())
        if stopped is not None:
            rest = sum(1 for _ in _positions(self._groups, stopped, shard.offset, self._count))
            self._sink.lost(stopped.group, rest, "serving started before the planning thread ran them")
            self._shard_done_with(shard, len(self._groups))

    def _close(self, shard: _Shard) -> None:
        with contextlib.suppress(OSError):
            shard.stream.close()
        shard.stream = None
        with self._lock:
            self._pids.discard(shard.pid)
        if shard.finished:
            _reap(shard.pid)


def _reap(pid: int) -> str:
    """Collect a planner's exit status (killing it if it lingers); how it ended, in words."""
    child = ForkedChild(pid)
    try:
        code = child.wait(2.0)
    except subprocess.TimeoutExpired:
        end_tree(pid)
        code = child.wait()
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
