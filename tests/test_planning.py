"""Enumeration in planner processes forked from the server: off the server's threads, the same plan as in
a thread, and what happens when a planner dies, hangs, or serving starts before planning is done."""
import logging
import os
import signal
import subprocess
import sys
import time

import psutil

from jit_ahead.core.planning import chunks as launch_chunks
from jit_ahead.core.planning import planners
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core import knobs
from jit_ahead.core.priority import Priority
from jit_ahead.providers import PlannedLaunch

from .conftest import REPO
from .layers import FileGate, ScaleProvider, model

LIMITS = EngineLimits(max_num_tokens=96, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))


class WhereProvider(ScaleProvider):
    """ScaleProvider whose launches append the pid of the process running them to a file."""

    name = "test-where"

    def __init__(self, path) -> None:
        super().__init__()
        self.path = path

    def launches(self, layers, limits):
        for launch in super().launches(layers, limits):
            yield PlannedLaunch(launch.priority, lambda run=launch.run: (self._note(), run()), launch.label)

    def _note(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


class FaultProvider(ScaleProvider):
    """The launch labelled ``victim`` does ``fault(os.getpid())`` the first time it runs (``once`` is a
    file, so a planner forked later sees it done), in a planner only."""

    name = "test-fault"

    def __init__(self, victim: str, fault, once) -> None:
        super().__init__()
        self.victim, self.fault, self.once = victim, fault, once

    def launches(self, layers, limits):
        for launch in super().launches(layers, limits):
            if launch.label == self.victim:
                yield PlannedLaunch(launch.priority, lambda run=launch.run: (self._strike(), run()), launch.label)
            else:
                yield launch

    def _strike(self) -> None:
        if planners.in_planner() and not self.once.exists():
            self.once.touch()
            self.fault(os.getpid())


def _keys(run) -> set[str]:
    return {t.key for t in run.tickets}


def test_planners_run_every_launch_off_the_server_and_find_what_a_thread_finds(session_factory, tmp_path, monkeypatch):
    where = tmp_path / "pids"
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "2")
    session = session_factory(workers=0)
    forked = session.plan_model(model(), LIMITS, [WhereProvider(where)])
    assert forked.wait(300) and not forked.errors
    pids = set(map(int, where.read_text().split()))
    # planners claim chunks as they go: a planner forked first may run all of a small plan
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert len(where.read_text().split()) == forked.launches

    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "0")
    monkeypatch.setenv("JIT_AHEAD_PLAN_DIR", str(tmp_path / "plans-thread"))
    threaded = session_factory(workers=0).plan_model(model(), LIMITS, [WhereProvider(tmp_path / "pids-thread")])
    assert threaded.wait(300)
    assert set(map(int, (tmp_path / "pids-thread").read_text().split())) == {os.getpid()}
    assert forked.variants == threaded.variants and _keys(forked) == _keys(threaded)


def test_a_planner_killed_mid_launch_is_replaced_and_its_launch_runs_again(session_factory, tmp_path, monkeypatch,
                                                                          caplog):
    # a planner killed from outside (the OOM killer, a user): its launch is no culprit, and the plan stays whole
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "1")
    victim = "1024x40"
    kill = FaultProvider(victim, lambda pid: os.kill(pid, signal.SIGKILL), tmp_path / "struck")
    run = session_factory(workers=0).plan_model(model(), LIMITS, [kill])
    assert run.wait(300) and (tmp_path / "struck").exists()
    assert not run.errors and run.launches_lost == 0 and run.saved_plan
    assert any("was killed by SIGKILL in launch 1024x40, which runs again" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("JIT_AHEAD_PLAN_DIR", str(tmp_path / "plans-clean"))
    clean = session_factory(workers=0).plan_model(model(), LIMITS, [ScaleProvider()])
    assert clean.wait(300)
    assert _keys(run) == _keys(clean) and run.variants == clean.variants


class _Always:
    """A FaultProvider ``once`` that never marks the fault done: the launch faults every time it runs."""

    def exists(self) -> bool:
        return False

    def touch(self) -> None:
        pass


def test_a_launch_that_kills_every_planner_is_skipped_after_two_and_the_plan_is_not_saved_whole(
        session_factory, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "1")
    victim = "1024x40"
    kill = FaultProvider(victim, lambda pid: os.kill(pid, signal.SIGKILL), _Always())
    run = session_factory(workers=0).plan_model(model(), LIMITS, [kill])
    assert run.wait(300)
    assert [e for e in run.errors if victim in e and "PlannerDied" in e and "SIGKILL" in e]
    assert run.launches_lost == 1 and run.saved_plan is None  # a plan with a hole is not saved as whole
    assert any("which killed 2 planners and is skipped" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("JIT_AHEAD_PLAN_DIR", str(tmp_path / "plans-clean"))
    clean = session_factory(workers=0).plan_model(model(), LIMITS, [ScaleProvider()])
    assert clean.wait(300)
    assert _keys(run) <= _keys(clean) and len(_keys(clean) - _keys(run)) <= 1


def test_a_launch_a_planner_died_in_is_never_run_in_the_servers_thread(session_factory, tmp_path, monkeypatch):
    # no planner left to run it again (no respawns): the launches left run in the planning thread, but not
    # that one, which may kill whatever runs it
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "1")
    monkeypatch.setattr(planners, "MAX_RESPAWNS", 0)
    victim = "1024x40"
    kill = FaultProvider(victim, lambda pid: os.kill(pid, signal.SIGKILL), tmp_path / "struck")
    run = session_factory(workers=0).plan_model(model(), LIMITS, [kill])
    assert run.wait(300) and (tmp_path / "struck").exists()
    assert [e for e in run.errors if victim in e and "not run in the server's thread" in e]
    assert run.launches_lost == 1 and run.saved_plan is None
    assert run.variants[Priority.BACKGROUND] > 0  # the others ran in the planning thread


def test_limits_far_beyond_what_planning_holds_are_cut_at_the_launch_cap_with_one_line(session_factory, monkeypatch,
                                                                                       caplog):
    # ScaleProvider lists one launch per token count: a hundred million of them here, as an engine passing a
    # long context would make a provider that cannot classify its shapes list. Before, they were all
    # materialized (millions of launches, gigabytes, the server OOM-killed).
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "0")
    monkeypatch.setenv("JIT_AHEAD_MAX_PLANNED_LAUNCHES", "300")
    huge = EngineLimits(max_num_tokens=100_000_000, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))
    t0 = time.monotonic()
    run = session_factory(workers=0).plan_model(model(), huge, [ScaleProvider()])
    assert run.wait(120) and time.monotonic() - t0 < 60
    assert run.launches == 300 and run.launches_lost == 1 and run.saved_plan is None
    lines = [r.getMessage() for r in caplog.records if "JIT_AHEAD_MAX_PLANNED_LAUNCHES" in r.getMessage()]
    assert len(lines) == 1 and "test-scale" in lines[0] and "300" in lines[0], lines
    assert run.variants[Priority.WARMUP] > 0  # what was listed is planned


def test_a_hung_planner_is_killed_after_the_stall_limit_and_planning_goes_on(session_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "1")
    monkeypatch.setattr(planners, "STALL_S", 2.0)
    victim = "1000x17"
    stop = FaultProvider(victim, lambda pid: os.kill(pid, signal.SIGSTOP), tmp_path / "struck")
    t0 = time.monotonic()
    run = session_factory(workers=0).plan_model(model(), LIMITS, [stop])
    assert run.wait(120)
    assert time.monotonic() - t0 < 60
    assert not run.errors and run.saved_plan  # the stopped planner's launch ran again in a new one
    assert run.variants[Priority.BACKGROUND] > 0


class GatedProvider(ScaleProvider):
    """Its first BACKGROUND launch waits for a file gate: planning still runs when serving starts."""

    name = "test-gated"

    def __init__(self, gate) -> None:
        super().__init__()
        self.launch_gate = gate

    def launches(self, layers, limits):
        blocked = False
        for launch in super().launches(layers, limits):
            if launch.priority == Priority.BACKGROUND and not blocked:
                blocked = True
                yield PlannedLaunch(launch.priority, lambda run=launch.run: (self.launch_gate.wait(120), run()),
                                    launch.label)
            else:
                yield launch


def test_planners_finish_the_plan_after_serving_started(session_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "1")
    session = session_factory(workers=0)
    gate = FileGate(tmp_path / "gate")
    run = session.plan_model(model(), LIMITS, [GatedProvider(gate)])
    assert session.wait_planned(timeout=120)  # WARMUP is queued; the planner waits at the gate
    session.mark_serving()
    gate.set()
    assert run.wait(120) and not run.errors and run.launches_lost == 0
    assert run.variants[Priority.BACKGROUND] > 0


class SlowProvider(ScaleProvider):
    """Each BACKGROUND launch takes a while and notes (pid, time) of the process running it."""

    name = "test-slow"

    def __init__(self, path) -> None:
        super().__init__()
        self.path = path

    def launches(self, layers, limits):
        for launch in super().launches(layers, limits):
            if launch.priority == Priority.BACKGROUND:
                yield PlannedLaunch(launch.priority, lambda run=launch.run: (self._note(), run()), launch.label)
            else:
                yield launch

    def _note(self) -> None:
        time.sleep(0.03)
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {time.monotonic()}\n")


class SkewProvider(SlowProvider):
    """Every launch notes its pid; the planner that runs the first BACKGROUND launch is the slow one:
    each launch it runs sleeps."""

    name = "test-skew"

    def __init__(self, path, slow) -> None:
        super().__init__(path)
        self.slow = slow

    def launches(self, layers, limits):
        for launch in ScaleProvider.launches(self, layers, limits):
            yield PlannedLaunch(launch.priority, lambda run=launch.run: (self._skew(), run()), launch.label)

    def _skew(self) -> None:
        if not self.slow.exists():
            self.slow.write_text(str(os.getpid()))
        if int(self.slow.read_text() or 0) == os.getpid():
            time.sleep(0.05)
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {time.monotonic()}\n")


def test_once_serving_only_the_serving_planners_go_on_and_they_run_the_rest(session_factory, tmp_path, monkeypatch):
    # Three planners, one of them left running at serving: the other two exit after their chunk, and
    # the one left runs every launch that was not run yet, each exactly once.
    monkeypatch.setattr(knobs, "usable_cpus", lambda: 4)  # three planners: not capped on a smaller machine
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "3")
    monkeypatch.setenv("JIT_AHEAD_SERVING_PLANNERS", "1")
    where = tmp_path / "launches"
    session = session_factory(workers=0)
    run = session.plan_model(model(), LIMITS, [SlowProvider(where)])
    deadline = time.monotonic() + 60
    while len({line.split()[0] for line in (where.read_text() if where.exists() else "").splitlines()}) < 3:
        assert time.monotonic() < deadline, "three planners never ran BACKGROUND launches"
        time.sleep(0.02)
    session.mark_serving()
    served = time.monotonic()
    assert run.wait(120) and not run.errors and run.launches_lost == 0
    notes = [line.split() for line in where.read_text().splitlines()]
    provider = SlowProvider(where)
    assert len(notes) == sum(1 for launch in provider.launches(provider.find_layers(model()), LIMITS)
                             if launch.priority == Priority.BACKGROUND)
    before = {int(pid) for pid, at in notes if float(at) < served}
    later = [int(pid) for pid, at in notes if float(at) > served + 0.5]
    assert len(before) == 3 and len(later) > 20 and len(set(later)) == 1


def test_a_slow_planner_runs_fewer_launches_and_the_others_take_the_rest(session_factory, tmp_path, monkeypatch):
    # Planners claim chunks as they finish them: one planner made slow (each launch it runs sleeps)
    # ends up with a small share instead of holding planning back by a fixed one.
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "2")
    where = tmp_path / "launches"
    session = session_factory(workers=0)
    run = session.plan_model(model(), LIMITS, [SkewProvider(where, tmp_path / "slow")])
    assert run.wait(120) and not run.errors
    pids = [int(line.split()[0]) for line in where.read_text().splitlines()]
    slow = int((tmp_path / "slow").read_text())
    assert len(pids) == run.launches and len(set(pids)) == 2
    assert pids.count(slow) < 0.25 * len(pids)


def test_planning_in_the_servers_thread_stops_when_serving_starts(session_factory, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "0")
    session = session_factory(workers=0)
    gate = FileGate(tmp_path / "gate")
    run = session.plan_model(model(), LIMITS, [GatedProvider(gate)])
    assert session.wait_planned(timeout=120)
    session.mark_serving()
    gate.set()  # the gated launch ends; the next one is not run on the server's thread
    assert run.wait(120)
    assert run.launches_lost > 0 and any("not planned" in e and "serving started" in e for e in run.errors)
    assert any("not planned" in r.getMessage() for r in caplog.records)


def test_closing_the_session_kills_its_planners_at_once(session_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "2")
    session = session_factory(workers=0)
    gate = FileGate(tmp_path / "gate")  # never opened
    run = session.plan_model(model(), LIMITS, [GatedProvider(gate)])
    assert session.wait_planned(timeout=120)
    children = psutil.Process().children(recursive=True)
    assert len(children) >= 2
    t0 = time.monotonic()
    session.close()
    assert time.monotonic() - t0 < 2.0
    assert run.done
    # killed and reaped by the session: none left running, and none left a zombie child of this process
    # (waiting on them here, as psutil.wait_procs does, would reap them and hide that)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive_or_unreaped(c) for c in children):
        time.sleep(0.1)
    assert not [c.pid for c in children if _alive_or_unreaped(c)]


def _alive_or_unreaped(proc: psutil.Process) -> bool:
    """Running, or exited and not yet reaped by its parent (a zombie)."""
    try:
        return proc.status() is not None
    except psutil.NoSuchProcess:
        return False


def test_a_launch_list_is_cut_into_chunks_of_one_group_covering_every_launch_once():
    groups = [launch_chunks.LaunchGroup(Priority.WARMUP, "triton", list(range(5))),
              launch_chunks.LaunchGroup(Priority.BACKGROUND, "triton", list(range(7000)))]
    for count in (1, 3, 15):
        chunks = launch_chunks.chunks_from(groups, launch_chunks.Position(0, 0), count)
        every = [(c.group, j) for c in chunks for j in range(c.first, c.last)]
        assert every == [(0, j) for j in range(5)] + [(1, j) for j in range(7000)]
        assert all(0 < c.last - c.first <= launch_chunks.MAX_CHUNK for c in chunks)
        assert len(chunks) >= min(7005, count * launch_chunks.CHUNKS_PER_PLANNER)
    resumed = launch_chunks.chunks_from(groups, launch_chunks.Position(1, 6990), 2)
    assert [(c.group, j) for c in resumed for j in range(c.first, c.last)] == [(1, j) for j in range(6990, 7000)]


def test_the_guard_says_whether_planning_had_finished_and_names_planned_variants_not_built_yet(
        session_factory, tmp_path, monkeypatch, caplog):
    import torch

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "1")
    session = session_factory(workers=0)  # nothing is built ahead: planned variants stay queued
    gate = FileGate(tmp_path / "gate")
    layer = model()[0]
    run = session.plan_model(model(), LIMITS, [GatedProvider(gate)])
    assert session.wait_planned(timeout=120)
    session.mark_serving()

    def messages() -> list[str]:
        lines = [r.getMessage() for r in caplog.records]
        caplog.clear()
        return lines

    layer(torch.empty(5, layer.hidden, device="meta", dtype=torch.float32))  # a dtype the limits do not name
    assert any("was not planned" in m and "planning was still running" in m for m in messages())
    layer(torch.empty(1, layer.hidden, device="meta", dtype=torch.bfloat16))  # planned WARMUP, never built
    assert any("was planned but is still queued (WARMUP" in m for m in messages())
    gate.set()
    assert run.wait(120)
    layer(torch.empty(5, layer.hidden, device="meta", dtype=torch.float16))
    assert any("was not planned" in m and "planning had finished" in m for m in messages())


_LIBRARIES_PROBE = """
import sys
from jit_ahead.triton.standin import ensure_driver
ensure_driver()
import jit_ahead
from jit_ahead.core.planning.limits import EngineLimits
from tests.layers import model
session = jit_ahead.start(triton={"workers": 0})
run = session.plan_model(model(), EngineLimits(16, 2, 16))  # every built-in provider looks at it
assert run.wait(300), "planning did not finish"
print("PLANNED", run.errors, sorted({m.split(".")[0] for m in sys.modules} & {"fla", "liger_kernel", "quack"}))
session.close()
"""


def test_planning_a_model_does_not_import_kernel_libraries_it_does_not_use(tmp_path):
    """Looking for a library's layers must not import the library: fla reads the GPU and Liger imports
    dozens of modules at import, which the server would carry (and tear down at exit) for nothing."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO), JIT_AHEAD_PLANNERS="0")
    proc = subprocess.run([sys.executable, "-c", _LIBRARIES_PROBE], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("PLANNED"))
    assert line == "PLANNED [] []", line  # no provider failed, and none of the libraries was imported
