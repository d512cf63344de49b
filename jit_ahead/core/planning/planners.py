"""Planner processes: forked from the server, supervised, replaced, and what no planner could run run in the
planning thread instead. The chunks they claim are ``chunks.py``'s, the state they share with the planning
thread ``run_state.py``'s, the running of a range of launches ``run_here.py``'s.

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
serving has started. Once serving, only ``serving_count`` planners go on; the others exit after their
chunk.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import select
import signal
import subprocess
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..building.protocol import ProtocolError, read_message, write_message
from ..processes import ForkedChild, detach_from_server, end_tree, fork_quietly, lower_priority
from .chunks import (Chunk, Failure, Finished, Found, LaunchGroup, Position, Range, RangeDone, RangesLeft, Sink,
                     chunks_from)
from .run_here import LaunchRunner, deliver, left_after, run_ranges_here
from .run_state import SharedRunState, range_bounds


log = logging.getLogger("jit_ahead.planning")

STALL_S = 60.0  # a planner whose launch runs this long without returning is taken to hang
MAX_RESPAWNS = 3  # replacements per planner slot, before the slot is left empty
LAUNCH_DEATHS = 2  # planners one launch may see die before it is skipped: once may be a kill from outside

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

# -- in a planner process ----------------------------------------------------------------------------------
def _planner_main(groups: Sequence[LaunchGroup], chunks: Sequence[Chunk], families: dict, shared: SharedRunState,
                  slot: int, out_fd: int, enter: Callable[[], None]) -> None:
    t0 = time.perf_counter()
    out = os.fdopen(out_fd, "wb", buffering=0)

    def found(group, requests, extras, failures):
        write_message(out, Found(group, tuple(requests), tuple((k, tuple(v)) for k, v in extras.items()),
                                 tuple(failures)))

    enter()
    runner = LaunchRunner(groups, chunks, families, found)
    try:
        while not shared.stop_asked(slot):
            part = shared.claim(slot, chunks)
            if part is None:
                break
            runner.run(part, progress=lambda item, part=part: shared.note(slot, part, item))
            write_message(out, RangeDone(*range_bounds(part)))
            shared.note(slot, None, -1)
    finally:
        runner.close()
    write_message(out, Finished(runner.launches, time.perf_counter() - t0))
    out.close()

def _fork_planner(groups, chunks, families, shared: SharedRunState, slot: int,
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
        self._ranges_left = RangesLeft(groups, self._chunks, sink, start.group)
        self._shared = SharedRunState(len(self._chunks), count)
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
            deliver(self._sink, message.group, message.requests, dict(message.extras), message.failures)
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
            self._sink.lost(self._ranges_left.group_of(stopped[0]), left_after(self._ranges_left, stopped),
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
