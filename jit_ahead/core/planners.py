"""Running planned launches: in planner processes forked from the server, or in the planning thread.

Enumerating a model's launch space is thousands of meta-tensor forwards: Python work that would hold
the server's GIL for as long as it runs. So the planning thread lists the launches (in priority order),
cuts them into chunks of consecutive launches of one group, and forks planners from the server: each has
the model, the providers' sites and every kernel library already imported, and claims the next chunk
whenever it finished one, so all of them end together however uneven the launches' costs or the CPUs
are. They run at nice 19, with no GPU (the server's device view, pinned). A planner streams what it
finds back over a pipe; the planning thread submits it to the families' pools as it arrives, so helpers
start building while planners still enumerate.

A planner touches nothing of the server: it holds copies of the server's memory, uses no GPU, and is
killed by the kernel when the planning thread that forked it ends. A planner that dies or stops making
progress is replaced and its chunk goes back to be claimed again, the launch it was running included: a
planner killed from outside is no fault of that launch. A launch that a second planner dies in is skipped
and reported, and the plan is not whole (not saved as such). What no planner could run is run in the
planning thread before serving (never a launch a planner died in), or given up with one log line once
serving has started. Once serving, only ``serving_count`` planners go
on; the others exit after their chunk.
"""
from __future__ import annotations

import contextlib
import contextvars
import fcntl
import functools
import logging
import mmap
import os
import select
import signal
import struct
import subprocess
import tempfile
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .priority import Priority
from .processes import ForkedChild, detach_from_server, end_tree, fork_quietly, lower_priority
from .protocol import ProtocolError, read_message, write_message

log = logging.getLogger("jit_ahead.planning")

SEND_EVERY_S = 0.25  # a planner sends what it found at least this often
STALL_S = 60.0  # a planner whose launch runs this long without returning is taken to hang
MAX_RESPAWNS = 3  # replacements per planner slot, before the slot is left empty
LAUNCH_DEATHS = 2  # planners one launch may see die before it is skipped: once may be a kill from outside
MAX_CHUNK = 64  # launches a planner claims at a time, at most
CHUNKS_PER_PLANNER = 32  # at least this many chunks per planner, so that planners end together


_in_planner = False


def in_planner() -> bool:
    """True in a planner process: no thread of the server runs here (process-wide memos are safe)."""
    return _in_planner


def mark_planner() -> None:
    """In a process just forked from the planning thread: it is a planner from now on."""
    global _in_planner
    _in_planner = True


# what a process forked from the planning thread runs first (the session's device view, its families'
# set-up): set by the planning run while providers list their launches, for the processes they fork
planner_entry: contextvars.ContextVar[Callable[[], None]] = contextvars.ContextVar("jit_ahead_planner_entry",
                                                                                  default=lambda: None)


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
    extras: tuple = ()  # (kind, items): what the family's capture found besides variants (Family.extra_kinds)
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True)
class RangeDone:
    """Every launch of ``Range(chunk, first, last)`` has run and what it found was sent."""

    chunk: int
    first: int
    last: int


@dataclass(frozen=True)
class Finished:
    launches: int
    seconds: float


class Sink(ABC):
    """What the planning thread does with results; called on that thread only."""

    @abstractmethod
    def found(self, group: int, requests: list, extras: dict[str, list]) -> None:
        """Requests captured by launches of ``group``, in first-seen order, and by kind what the family's
        capture found besides them (``Family.extra_kinds``, read by the family alone)."""

    @abstractmethod
    def group_done(self, group: int) -> None:
        """Every launch of ``group`` has run (groups are reported in order)."""

    @abstractmethod
    def failed(self, failure: Failure) -> None:
        """A launch raised, or its planner died in it."""

    @abstractmethod
    def lost(self, group: int, count: int, why: str) -> None:
        """``count`` launches from ``group`` on will not run (serving started before they could)."""

    def ran(self, group: int, first: int, last: int) -> None:
        """Launches ``first`` to ``last`` (excluded) of ``group`` have run and what they found was handed
        over: progress a later start may skip."""


@dataclass(frozen=True)
class Position:
    group: int
    item: int


@dataclass(frozen=True)
class Chunk:
    """Launches ``first`` to ``last`` (excluded) of group ``group``: what a planner claims at a time."""

    group: int
    first: int
    last: int


@dataclass(frozen=True)
class Range:
    """Launches ``first`` to ``last`` (excluded) of chunk ``chunk``: a whole chunk, or what is left of one
    whose planner died in it."""

    chunk: int
    first: int
    last: int

    def __len__(self) -> int:
        return self.last - self.first


def chunks_from(groups: Sequence[LaunchGroup], start: Position, planners: int) -> list[Chunk]:
    """The launches from ``start`` on, in order, cut into chunks of one group each: small enough that
    ``planners`` planners claiming them one after another end close together."""
    total = sum(len(g.items) for g in groups[start.group:]) - (start.item if start.group < len(groups) else 0)
    size = max(1, min(MAX_CHUNK, total // max(1, planners * CHUNKS_PER_PLANNER)))
    chunks = []
    for g in range(start.group, len(groups)):
        for first in range(start.item if g == start.group else 0, len(groups[g].items), size):
            chunks.append(Chunk(g, first, min(first + size, len(groups[g].items))))
    return chunks


class _RangesLeft:
    """The ranges not run yet; tells the sink each group done, in order, once none of its ranges is
    left."""

    def __init__(self, groups: Sequence[LaunchGroup], chunks: list[Chunk], sink: Sink, first_group: int) -> None:
        self._groups = groups
        self._chunks = chunks
        self._sink = sink
        self.open: set[Range] = {Range(k, c.first, c.last) for k, c in enumerate(chunks)}
        self._left = Counter(c.group for c in chunks)
        self._next = first_group  # groups below this were reported done

    def group_of(self, part: Range) -> int:
        return self._chunks[part.chunk].group

    def done(self, part: Range) -> None:
        if part in self.open:
            self._drop(part)
            self._sink.ran(self.group_of(part), part.first, part.last)
        self._advance()

    def _drop(self, part: Range) -> None:
        self.open.discard(part)
        self._left[self.group_of(part)] -= 1

    def split(self, part: Range, culprit: int) -> list[Range]:
        """``part`` is replaced by what is left of it without launch ``culprit``; returns the new ranges.
        The culprit is not progress a later start may skip: that start runs it again, and plans around it
        again if it kills planners there too."""
        if part not in self.open:
            return []
        self._drop(part)
        rest = [r for r in (Range(part.chunk, part.first, culprit), Range(part.chunk, culprit + 1, part.last)) if len(r)]
        for r in rest:
            self.open.add(r)
            self._left[self.group_of(r)] += 1
        self._advance()
        return rest

    def finish(self) -> None:
        """Nothing more will run: report every group left."""
        self._left.clear()
        self._advance()

    def _advance(self) -> None:
        while self._next < len(self._groups) and self._left[self._next] <= 0:
            self._sink.group_done(self._next)
            self._next += 1


class _Captures:
    """One capture per family for a whole run (repeated shapes hit each capture's in-memory cache), and
    what of each has been reported already."""

    def __init__(self, families: dict, stack: contextlib.ExitStack) -> None:
        self._families = families
        self._stack = stack
        # family -> (capture, how many of its requests and of each extra kind were sent)
        self._open: dict[str, tuple[Any, dict[str, int]]] = {}

    def open(self, family: str) -> None:
        if family not in self._open:
            self._open[family] = (self._stack.enter_context(self._families[family].capture()), {})

    def fresh(self, family: str) -> tuple[list, dict[str, list]]:
        """Requests, and by kind the family's extras, captured since the last call (captures keep first-seen
        order)."""
        entry = self._open.get(family)
        if entry is None:
            return [], {}
        plan, sent = entry
        fresh = {}
        for kind in ("requests", *self._families[family].extra_kinds):
            items = list(getattr(plan, kind)[sent.get(kind, 0):])
            sent[kind] = sent.get(kind, 0) + len(items)
            if items:
                fresh[kind] = items
        return fresh.pop("requests", []), fresh


class _Runner:
    """Runs ranges of launches in this process, one capture per family for its whole life (repeated shapes
    hit each capture's in-memory cache), and reports what they found through
    ``found(group, requests, extras, failures)`` at least every SEND_EVERY_S and at the end of each range."""

    def __init__(self, groups: Sequence[LaunchGroup], chunks: Sequence[Chunk], families: dict,
                 found: Callable) -> None:
        self._groups = groups
        self._chunks = chunks
        self._found = found
        self._stack = contextlib.ExitStack()
        self._captures = _Captures(families, self._stack)
        self.launches = 0

    def close(self) -> None:
        self._stack.close()

    def run(self, part: Range, stop: Callable[[], bool] = lambda: False,
            progress: Callable[[int], None] | None = None) -> int | None:
        """Run ``part``; returns the launch where ``stop()`` turned true (checked before each), None once
        all ran."""
        group = self._chunks[part.chunk].group
        items, family = self._groups[group].items, self._groups[group].family
        failures: dict = {}
        last = time.perf_counter()
        try:
            for item in range(part.first, part.last):
                if stop():
                    return item
                if progress is not None:
                    progress(item)
                provider, launch = items[item]
                self._captures.open(family)
                try:
                    launch.run()
                except Exception as exc:
                    key = (provider.name, type(exc).__name__)
                    if key not in failures:  # one report per provider and error
                        text = str(exc).splitlines()[0][:500] if str(exc) else ""
                        failures[key] = Failure(provider.name, type(exc).__name__, text, launch.label)
                self.launches += 1
                if time.perf_counter() - last > SEND_EVERY_S:
                    self._send(group, family, failures)
                    last = time.perf_counter()
            return None
        finally:
            self._send(group, family, failures)

    def _send(self, group: int, family: str, failures: dict) -> None:
        requests, extras = self._captures.fresh(family)
        if requests or extras or failures:
            self._found(group, requests, extras, list(failures.values()))
            failures.clear()


def _deliver(sink: Sink, group: int, requests, extras: dict, failures) -> None:
    """What launches of ``group`` found (here, or in a planner's Found message), handed to the sink."""
    if requests or extras:
        sink.found(group, list(requests), {kind: list(items) for kind, items in extras.items()})
    for failure in failures:
        sink.failed(failure)


def run_ranges_here(groups: Sequence[LaunchGroup], chunks: Sequence[Chunk], families: dict, sink: Sink,
                    ranges_left: _RangesLeft, ranges: list[Range], stop: Callable[[], bool]) -> tuple[Range, int] | None:
    """Run ``ranges`` in order in the calling thread; where ``stop()`` turned true (the range, and its
    first launch not run), or None once all ran."""
    runner = _Runner(groups, chunks, families, functools.partial(_deliver, sink))
    try:
        for part in ranges:
            stopped = runner.run(part, stop)
            if stopped is not None:
                return part, stopped
            ranges_left.done(part)
        return None
    finally:
        runner.close()


def _left_after(ranges_left: _RangesLeft, stopped: tuple[Range, int]) -> int:
    """Launches not run: the open ranges, less what ran of the one stopped in."""
    part, item = stopped
    return sum(len(r) for r in ranges_left.open) - (item - part.first)


def run_in_thread(groups: Sequence[LaunchGroup], families: dict, sink: Sink, start: Position,
                  stop: Callable[[], bool]) -> Position | None:
    """Run every launch from ``start`` on in the calling thread; the position where ``stop()`` turned
    true, or None once all ran (then every group was reported done)."""
    chunks = chunks_from(groups, start, 1)
    ranges_left = _RangesLeft(groups, chunks, sink, start.group)
    stopped = run_ranges_here(groups, chunks, families, sink, ranges_left,
                              [Range(k, c.first, c.last) for k, c in enumerate(chunks)], stop)
    return None if stopped is None else Position(chunks[stopped[0].chunk].group, stopped[1])


# -- shared between the planning thread and its planners ---------------------------------------------------
class _SharedRunState:
    """Shared memory of one planning run: the next chunk to claim, ranges handed back (the rest of a
    chunk whose planner died), and per planner slot the range and launch it runs and whether it is asked
    to stop. Claims take a POSIX record lock on an unlinked file: the kernel drops it with its holder, so
    a planner killed while claiming leaves no lock behind (``flock`` would not do: forks share one open
    file description, hence one flock)."""

    _HEAD = struct.Struct("!ii")  # next chunk, ranges handed back
    _RANGE = struct.Struct("!iii")
    _SLOT = struct.Struct("!iiiib")  # chunk, first, last, launch running (-1: none yet), stop asked
    RETURNED = 256  # ranges handed back at a time; more wait in the planning thread

    def __init__(self, chunks: int, slots: int) -> None:
        self.chunks = chunks
        self._slots_at = self._HEAD.size + self.RETURNED * self._RANGE.size
        self._memory = mmap.mmap(-1, self._slots_at + slots * self._SLOT.size)
        self._lock_file = tempfile.TemporaryFile()
        self.lock_fd = self._lock_file.fileno()
        for slot in range(slots):
            self.reset(slot)

    @contextlib.contextmanager
    def _locked(self):
        fcntl.lockf(self.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self.lock_fd, fcntl.LOCK_UN)

    def claim(self, slot: int, chunks: Sequence[Chunk]) -> Range | None:
        """In a planner: the next range to run (one handed back first), noted as this slot's; None when
        nothing is left to claim."""
        with self._locked():
            following, returned = self._HEAD.unpack_from(self._memory, 0)
            if returned:
                part = Range(*self._RANGE.unpack_from(self._memory, self._HEAD.size + (returned - 1) * self._RANGE.size))
                returned -= 1
            elif following < self.chunks:
                chunk = chunks[following]
                part = Range(following, chunk.first, chunk.last)
                following += 1
            else:
                return None
            self.note(slot, part, -1)  # before the claim is counted: a planner dying in between repeats it
            self._HEAD.pack_into(self._memory, 0, following, returned)
            return part

    def hand_back(self, parts: list[Range]) -> list[Range]:
        """In the planning thread: ranges for planners to claim again; returns those that did not fit."""
        with self._locked():
            following, returned = self._HEAD.unpack_from(self._memory, 0)
            while parts and returned < self.RETURNED:
                self._RANGE.pack_into(self._memory, self._HEAD.size + returned * self._RANGE.size, *_bounds(parts.pop()))
                returned += 1
            self._HEAD.pack_into(self._memory, 0, following, returned)
        return parts

    def take_all(self) -> None:
        """In the planning thread, once no planner is left: nothing more is claimed from the shared state."""
        with self._locked():
            self._HEAD.pack_into(self._memory, 0, self.chunks, 0)

    def note(self, slot: int, part: Range | None, launch: int) -> None:
        at = self._slots_at + slot * self._SLOT.size
        stop = self._memory[at + self._SLOT.size - 1]
        chunk, first, last = (part.chunk, part.first, part.last) if part is not None else (-1, -1, -1)
        self._SLOT.pack_into(self._memory, at, chunk, first, last, launch, stop)

    def running(self, slot: int) -> tuple[Range | None, int]:
        """The range a slot's planner runs (None: none) and the launch it is in (-1: none yet)."""
        chunk, first, last, launch, _ = self._SLOT.unpack_from(self._memory, self._slots_at + slot * self._SLOT.size)
        return (Range(chunk, first, last) if chunk >= 0 else None), launch

    def ask_to_stop(self, slot: int) -> None:
        self._memory[self._slots_at + (slot + 1) * self._SLOT.size - 1] = 1

    def stop_asked(self, slot: int) -> bool:
        return self._memory[self._slots_at + (slot + 1) * self._SLOT.size - 1] != 0

    def reset(self, slot: int) -> None:
        self._SLOT.pack_into(self._memory, self._slots_at + slot * self._SLOT.size, -1, -1, -1, -1, 0)

    def close(self) -> None:
        self._lock_file.close()


def _bounds(part: Range) -> tuple[int, int, int]:
    return part.chunk, part.first, part.last


# -- in a planner process ----------------------------------------------------------------------------------
def _planner_main(groups: Sequence[LaunchGroup], chunks: Sequence[Chunk], families: dict, shared: _SharedRunState,
                  slot: int, out_fd: int, enter: Callable[[], None]) -> None:
    t0 = time.perf_counter()
    out = os.fdopen(out_fd, "wb", buffering=0)

    def found(group, requests, extras, failures):
        write_message(out, Found(group, tuple(requests), tuple((k, tuple(v)) for k, v in extras.items()),
                                 tuple(failures)))

    enter()
    runner = _Runner(groups, chunks, families, found)
    try:
        while not shared.stop_asked(slot):
            part = shared.claim(slot, chunks)
            if part is None:
                break
            runner.run(part, progress=lambda item, part=part: shared.note(slot, part, item))
            write_message(out, RangeDone(*_bounds(part)))
            shared.note(slot, None, -1)
    finally:
        runner.close()
    write_message(out, Finished(runner.launches, time.perf_counter() - t0))
    out.close()


def _fork_planner(groups, chunks, families, shared: _SharedRunState, slot: int,
                  enter: Callable[[], None]) -> tuple[int, object]:
    """Fork one planner; returns (pid, the parent's read end). Raises OSError if it cannot fork."""
    read_fd, write_fd = os.pipe()
    shared.reset(slot)
    pid = fork_quietly()
    if pid == 0:  # the planner
        mark_planner()
        code = 0
        try:
            os.close(read_fd)
            detach_from_server(keep=(write_fd, shared.lock_fd))
            lower_priority()
            _planner_main(groups, chunks, families, shared, slot, write_fd, enter)
        except BaseException:  # noqa: BLE001 - a planner must never return into the server's code
            code = 1
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, os.fdopen(read_fd, "rb", buffering=0)


@dataclass
class _Slot:
    index: int
    pid: int = 0
    stream: object = None
    last_news: float = 0.0
    last_progress: tuple = ()
    respawns: int = 0
    finished: bool = False
    stopping: bool = False  # asked to exit after its range (serving)


class ForkedPlanners:
    """``count`` planner processes claiming chunks of ``groups`` from ``start`` on until none is left."""

    def __init__(self, groups: Sequence[LaunchGroup], families: dict, sink: Sink, count: int,
                 enter: Callable[[], None], start: Position = Position(0, 0), stall_s: float | None = None,
                 serving_count: int | None = None) -> None:
        """``serving_count``: planners left running once serving starts (the others exit after their
        range, and the rest is claimed by those); None: all keep running."""
        self._groups = groups
        self._families = families
        self._sink = sink
        self._enter = enter
        self._stall_s = STALL_S if stall_s is None else stall_s
        self._serving_count = serving_count
        self._chunks = chunks_from(groups, start, count)
        self._ranges_left = _RangesLeft(groups, self._chunks, sink, start.group)
        self._shared = _SharedRunState(len(self._chunks), count)
        self._returned: list[Range] = []  # handed back, waiting for room in the shared state
        self._deaths: Counter = Counter()  # (chunk, launch) -> planners that died running it
        self._slots = [_Slot(k) for k in range(count)]
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._pids: set[int] = set()
        self.planner_seconds: list[float] = []  # each finished planner's own time, fork to last launch

    def run(self, cancelled: threading.Event, serving: Callable[[], bool]) -> None:
        """Fork the planners and feed the sink until every launch ran, or ``cancelled`` is set (then the
        planners are killed). Raises OSError if not even the first planner could be forked."""
        self._cancelled = cancelled
        try:
            self._spawn(self._slots[0])
            for slot in self._slots[1:]:
                try:
                    self._spawn(slot)
                except OSError as exc:  # fewer planners than asked: the others claim its share
                    log.warning("planner %d could not be forked (%s); the others take its share", slot.index, exc)
            self._watch(cancelled, serving)
            if cancelled.is_set():
                self.kill()
                for slot in self._slots:
                    if slot.stream is not None:
                        self._close(slot)
                return
            self._run_rest_here(cancelled, serving)
        finally:
            self._shared.close()

    def kill(self) -> None:
        """Kill every planner; safe from any thread (the planning thread then sees their pipes end)."""
        with self._lock:
            pids = list(self._pids)
        for pid in pids:
            end_tree(pid)

    # -- internals ----------------------------------------------------------------------------------------
    def _watch(self, cancelled: threading.Event, serving: Callable[[], bool]) -> None:
        while not cancelled.is_set():
            live = [s for s in self._slots if s.stream is not None]
            if not live:
                return
            if self._returned:
                self._returned = self._shared.hand_back(self._returned)
            if serving():
                self._make_room(live)
            readable, _, _ = select.select([s.stream for s in live], [], [], 0.2)
            for slot in live:
                if slot.stream in readable:
                    self._read(slot)
                elif self._stalled(slot):
                    log.warning("planner (pid %d) made no progress for %.0fs in %s; killed", slot.pid,
                                self._stall_s, self._label(slot))
                    end_tree(slot.pid)

    def _make_room(self, live: list[_Slot]) -> None:
        """Serving: planners beyond ``serving_count`` exit after the range they run."""
        if self._serving_count is None:
            return
        going = [s for s in live if not s.stopping]
        for slot in going[self._serving_count:]:
            self._shared.ask_to_stop(slot.index)
            slot.stopping = True
        if len(going) > self._serving_count:
            log.info("serving started: %d planners stop after their current launches, %d go on "
                     "(JIT_AHEAD_SERVING_PLANNERS)", len(going) - self._serving_count, self._serving_count)

    def _spawn(self, slot: _Slot) -> None:
        pid, stream = _fork_planner(self._groups, self._chunks, self._families, self._shared, slot.index, self._enter)
        with self._lock:
            self._pids.add(pid)
        slot.pid, slot.stream, slot.finished = pid, stream, False
        slot.last_news, slot.last_progress = time.monotonic(), ()

    def _label(self, slot: _Slot) -> str:
        part, launch = self._shared.running(slot.index)
        if part is None or launch < 0:
            return "its start" if part is None else "a claim"
        return f"launch {self._groups[self._ranges_left.group_of(part)].items[launch][1].label}"

    def _stalled(self, slot: _Slot) -> bool:
        now = time.monotonic()
        key = self._shared.running(slot.index)
        if key != slot.last_progress:
            slot.last_progress, slot.last_news = key, now
            return False
        return now - slot.last_news > self._stall_s

    def _read(self, slot: _Slot) -> None:
        try:
            message = read_message(slot.stream)
        except (ProtocolError, OSError, EOFError) as exc:
            log.warning("planner (pid %d): broken stream (%s)", slot.pid, exc)
            message = None
        slot.last_news = time.monotonic()
        if isinstance(message, Found):
            _deliver(self._sink, message.group, message.requests, dict(message.extras), message.failures)
        elif isinstance(message, RangeDone):
            self._ranges_left.done(Range(message.chunk, message.first, message.last))
        elif isinstance(message, Finished):
            slot.finished = True
            self.planner_seconds.append(message.seconds)
            log.debug("planner (pid %d) ran %d launches in %.1fs", slot.pid, message.launches, message.seconds)
        elif message is None:
            self._ended(slot)

    def _ended(self, slot: _Slot) -> None:
        part, launch = self._shared.running(slot.index)
        how = self._close(slot)
        if slot.finished or self._cancelled.is_set():  # done, or killed because planning is cancelled
            return
        where = "before its first launch"
        if part is not None and launch >= 0 and part in self._ranges_left.open:
            group = self._ranges_left.group_of(part)
            provider, planned = self._groups[group].items[launch]
            self._deaths[(part.chunk, launch)] += 1
            if self._deaths[(part.chunk, launch)] < LAUNCH_DEATHS:
                # killed from outside (the OOM killer, a user) as likely as by its launch: run again, whole
                where = f"in launch {planned.label}, which runs again in another planner"
                self._returned.append(part)
            else:  # its launch kills planners: skipped, and the plan is not whole
                where = f"in launch {planned.label}, which killed {LAUNCH_DEATHS} planners and is skipped"
                self._sink.failed(Failure(provider.name, "PlannerDied", f"the planner {how}", planned.label))
                self._sink.lost(group, 1, f"launch {planned.label} killed {LAUNCH_DEATHS} planners")
                self._returned.extend(self._ranges_left.split(part, launch))
        elif part is not None and part in self._ranges_left.open:
            self._returned.append(part)  # claimed, not started
        self._returned = self._shared.hand_back(self._returned)  # before a new planner claims
        slot.respawns += 1
        if slot.stopping:
            log.warning("planner (pid %d) %s %s", slot.pid, how, where)
            return
        if slot.respawns <= MAX_RESPAWNS:
            log.warning("planner (pid %d) %s %s; a new planner takes its place", slot.pid, how, where)
            try:
                self._spawn(slot)
                return
            except OSError as exc:
                log.warning("the planner could not be forked again (%s)", exc)
        else:
            log.warning("planner (pid %d) %s %s; it failed %d times, so it is not forked again",
                        slot.pid, how, where, slot.respawns)

    def _run_rest_here(self, cancelled: threading.Event, serving: Callable[[], bool]) -> None:
        """Launches no planner ran (every planner failed, or stopped at serving with work left): in this
        thread before serving, else given up."""
        self._shared.take_all()
        rest = sorted(self._ranges_left.open, key=lambda r: (r.chunk, r.first))
        remaining = sum(len(r) for r in rest)
        if not remaining:
            self._ranges_left.finish()
            return
        first_group = self._ranges_left.group_of(rest[0])
        if serving():
            self._sink.lost(first_group, remaining, "its planners failed after serving started")
            self._ranges_left.finish()
            return
        rest = self._without_suspects(rest)
        remaining = sum(len(r) for r in rest)
        if not remaining:
            self._ranges_left.finish()
            return
        log.warning("%d launches no planner could run run in the planning thread", remaining)
        stopped = run_ranges_here(self._groups, self._chunks, self._families, self._sink, self._ranges_left, rest,
                                  lambda: cancelled.is_set() or serving())
        if stopped is not None:
            self._sink.lost(self._ranges_left.group_of(stopped[0]), _left_after(self._ranges_left, stopped),
                            "serving started before the planning thread ran them")
        self._ranges_left.finish()

    def _without_suspects(self, rest: list[Range]) -> list[Range]:
        """``rest`` less each launch a planner died in: what may kill a planner is not run in the server's
        own thread. Each is reported and the plan is not whole."""
        for chunk, launch in self._deaths:
            part = next((r for r in rest if r.chunk == chunk and r.first <= launch < r.last), None)
            if part is None:
                continue
            group = self._ranges_left.group_of(part)
            label = self._groups[group].items[launch][1].label
            self._sink.lost(group, 1, f"a planner died in launch {label}, which is not run in the server's thread")
            rest = [r for r in rest if r != part] + self._ranges_left.split(part, launch)
        return sorted(rest, key=lambda r: (r.chunk, r.first))

    def _close(self, slot: _Slot) -> str:
        """Close its stream and reap it, whether it finished, died or was killed (a killed planner left
        unreaped stays a zombie child of the server); how it ended, in words."""
        with contextlib.suppress(OSError):
            slot.stream.close()
        slot.stream = None
        with self._lock:
            self._pids.discard(slot.pid)
        return _reap(slot.pid)


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
