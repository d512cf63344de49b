"""The engine lifecycle: plan at model construction without blocking, WARMUP first, wait for readiness."""
import logging
import random
import threading

import psutil
import pytest
import torch

from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session
from jit_ahead.core.building.table import State
from jit_ahead.providers import PlannedLaunch
from jit_ahead.triton import capture

from .conftest import import_probe
from .kernels import basic as k
from .layers import BrokenProvider, FileGate, ScaleLayer, ScaleProvider, model


class SlowBackgroundProvider(ScaleProvider):
    """ScaleProvider whose first BACKGROUND launch blocks on a gate: a long enumeration still running."""

    name = "test-slow-background"

    def launches(self, layers, limits):
        blocked = False
        for launch in super().launches(layers, limits):
            if launch.priority == Priority.BACKGROUND and not blocked:
                blocked = True
                yield PlannedLaunch(launch.priority, lambda run=launch.run: (self.gate.wait(60), run()), launch.label)
            else:
                yield launch

    def find_layers(self, model):
        return [m for m in model.modules() if isinstance(m, ScaleLayer)]


def test_waiting_for_warmup_does_not_wait_for_the_background_enumeration(session_factory, tmp_path):
    session = session_factory(workers=1)
    limits = EngineLimits(max_num_tokens=64, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))
    gate = FileGate(tmp_path / "gate")
    run = session.plan_model(model(), limits, [SlowBackgroundProvider(gate)])
    try:
        # WARMUP: planned and built while BACKGROUND is blocked
        assert session.wait_ready(timeout=300, whole_plan=False)
        assert run.wait(0, Priority.WARMUP) and not run.wait(0, Priority.BACKGROUND) and not run.done
        warm = [t for t in run.tickets if t.priority == Priority.WARMUP]
        assert warm and all(t.result is not None and t.result.ok for t in warm)
        assert not session.wait_ready(timeout=0.5, priority=Priority.BACKGROUND)
    finally:
        gate.set()
    assert session.wait_ready(timeout=300, priority=Priority.BACKGROUND)
    assert run.done and run.variants[Priority.BACKGROUND] > 0 and all(t.result.ok for t in run.tickets)


def test_ready_with_planning_still_running_says_so_in_one_line_and_the_hold_waits_for_the_whole_plan(
        session_factory, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="jit_ahead")
    session = session_factory(workers=1)
    events = []
    session.stats.subscribe(events.append)
    limits = EngineLimits(max_num_tokens=64, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))
    gate = FileGate(tmp_path / "gate")
    run = session.plan_model(model(), limits, [SlowBackgroundProvider(gate)])
    try:
        monkeypatch.setenv("JIT_AHEAD_READY", "warmup")
        assert session.wait_ready(timeout=300)
        (ready,) = [e for e in events if e["event"] == "ready"]
        assert not ready["planning_done"] and ready["rule"] == "warmup"
        assert ready["listed"] == sum(run.variants.values()) > 0 and ready["pending_warmup"] == 0
        lines = [r for r in caplog.records if "jit_ahead ready" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING
        assert "planning still running" in lines[0].getMessage()
        assert "variants listed so far" in lines[0].getMessage()
        assert "; plan unfinished: " in session.describe() and " listed so far, " in session.describe()
        # The hold: the default rule (the whole plan listed) does not call a blocked plan ready.
        monkeypatch.delenv("JIT_AHEAD_READY")
        assert not session.wait_ready(timeout=0.5)
        assert not session.wait_ready(timeout=0.5, whole_plan=True, priority=Priority.WARMUP)
    finally:
        gate.set()
    monkeypatch.setenv("JIT_AHEAD_READY", "all")
    assert session.wait_ready(timeout=300)
    assert run.done and all(t.result.ok for t in run.tickets)
    state = session.readiness()
    assert state.complete and state.built == state.listed == sum(run.variants.values())
    assert "the plan is complete" in state.line()
    assert session.describe().endswith(f"; plan complete: {state.listed} variants listed, {state.listed} built, "
                                       "0 queued or building")
    assert len([e for e in events if e["event"] == "ready"]) == 1  # said once per session


def test_without_wait_ready_the_ready_line_comes_when_serving_starts(session_factory, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_TUNE_AHEAD", "0")
    session = session_factory(workers=1)
    limits = EngineLimits(max_num_tokens=64, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))
    run = session.plan_model(model(), limits, [ScaleProvider()])
    assert run.wait(300)
    assert session.families["triton"].table.wait_idle(300)
    session.mark_serving()
    lines = [r.getMessage() for r in caplog.records if "jit_ahead ready" in r.getMessage()]
    assert lines == [f"jit_ahead ready: the plan is complete: {sum(run.variants.values())} variants, all built "
                     f"or on disk (planning took {run.seconds:.1f}s)"]


@pytest.mark.parametrize("value", ["sometimes", "0"])
def test_a_bad_ready_rule_gets_one_line_and_the_default(monkeypatch, caplog, value):
    from jit_ahead.core.planning.readiness import DEFAULT_READY_RULE, ReadyRule

    monkeypatch.setenv("JIT_AHEAD_READY", value)
    assert ReadyRule.from_knob() == ReadyRule.named(DEFAULT_READY_RULE)
    assert [r.levelno for r in caplog.records if "JIT_AHEAD_READY" in r.getMessage()] == [logging.ERROR]


def test_plan_model_returns_at_once_queues_warmup_first_and_covers_real_calls(session_factory, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = session_factory(workers=1)
    events = []
    session.stats.subscribe(events.append)
    limits = EngineLimits(max_num_tokens=512, max_batch_size=8, dtypes=("float16", "float32"),
                          cuda_graph_batch_sizes=(1, 8))
    gate = threading.Event()
    run = session.plan_model(model(), limits, [ScaleProvider(gate), BrokenProvider()])
    assert not run.done  # returned while the provider was still walking the model
    gate.set()
    assert session.wait_ready(timeout=300, priority=Priority.BACKGROUND)
    assert run.done and all(t.result.ok for t in run.tickets)
    assert run.variants[Priority.WARMUP] > 0 and run.variants[Priority.BACKGROUND] > 0
    assert any("test-broken" in r.getMessage() and "changed its API" in r.getMessage() for r in caplog.records)

    planned = [e for e in events if e["event"] == "planned"]
    assert [e["priority"] for e in planned] == ["WARMUP", "BACKGROUND"]
    starts = [e["priority"] for e in events if e["event"] == "build_start"]
    assert starts[: starts.count("WARMUP")] == ["WARMUP"] * starts.count("WARMUP")

    # Coverage: real calls at random shapes within the limits need nothing that was not planned.
    planned_keys = {t.key for t in run.tickets}
    rng = random.Random(0)
    layers = list(model())
    for _ in range(40):
        layer = rng.choice(layers)
        tokens = rng.randint(1, limits.max_num_tokens)
        dtype = rng.choice(limits.torch_dtypes())
        with capture() as real:
            layer(torch.empty(tokens, layer.hidden, device="meta", dtype=dtype))
        missing = [r for r in real.requests if r.predicted_hash not in planned_keys]
        assert not missing, f"{layer.hidden}x{tokens} {dtype}: {[r.label for r in missing]}"


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_num_tokens"):
        EngineLimits(max_num_tokens=0)
    with pytest.raises(ValueError, match="cuda_graph_batch_sizes"):
        EngineLimits(max_batch_size=4, cuda_graph_batch_sizes=(8,))
    with pytest.raises(ValueError, match="dtypes"):
        EngineLimits(dtypes=("bfloat17",)).torch_dtypes()


def test_helpers_finish_the_queue_then_retire_once_serving(session_factory):
    import time

    import psutil

    session = session_factory(workers=1)
    events = []
    session.stats.subscribe(events.append)
    x = torch.empty(4096, device="meta", dtype=torch.float32)
    with capture() as planned:
        for block in (32, 64, 128):
            k.add_kernel[(1,)](x, x, x, 4096, BLOCK=block)
    tickets = session.families["triton"].submit(planned, Priority.BACKGROUND)
    deadline = time.monotonic() + 120
    while not session.families["triton"].pool.helper_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    (pid,) = session.families["triton"].pool.helper_pids().values()
    session.mark_serving()
    assert all(t.wait(120) is State.DONE for t in tickets)  # queued work is finished first
    while session.families["triton"].pool.live_helpers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session.families["triton"].pool.live_helpers() == 0

    def exited() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def retired() -> list:
        return [e["helper"] for e in events if e["event"] == "helper_retired"]

    while not (exited() and retired()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exited() and retired() == ["helper-0"]
    # A miss while serving goes to a helper forked at once from the fork server, which still holds the
    # kernel's library: the server's own thread compiles nothing.
    kernel = k.add_kernel[(1,)](x, x, x, 4096, BLOCK=256)
    assert kernel is not None
    assert session.families["triton"].pool.table.get(kernel.hash).result.builder in ("helper-0", "helper-urgent")


class PreloadingProvider(ScaleProvider):
    """Finds its layers at once, then enumerates slowly (the gate)."""

    name = "test-preloading"

    def find_layers(self, model):
        return [m for m in model.modules() if isinstance(m, ScaleLayer)]

    def launches(self, layers, limits):
        self.gate.wait(30)
        yield from super().launches(layers, limits)


class AbsentProvider(ScaleProvider):
    """A library the model does not use: its modules are never imported in helpers."""

    name = "test-absent"
    modules = ("tests_absent_library",)

    def find_layers(self, model):
        return []


def test_helpers_start_with_the_first_request_and_import_its_library_once(session_factory, tmp_path, monkeypatch):
    # A library module that records which processes imported it. No helper process (nor the fork server)
    # starts while the provider still enumerates and nothing is queued; the first request starts the fork
    # server, which imports the provider's library once for every helper forked from it. A library the
    # model does not use is never imported there.
    import time

    probe, marker = import_probe(tmp_path, monkeypatch)
    monkeypatch.setattr(PreloadingProvider, "modules", (probe,))
    session = session_factory(workers=1)
    events = []
    session.stats.subscribe(events.append)
    gate = threading.Event()
    run = session.plan_model(model(), EngineLimits(max_num_tokens=4), [AbsentProvider(), PreloadingProvider(gate)])
    try:
        time.sleep(2.0)  # planning is held by the gate: nothing is queued
        assert not run.done and not run.tickets
        assert not psutil.Process().children(recursive=True)
        assert not [e for e in events if e["event"].endswith("_ready")]
    finally:
        gate.set()
    assert session.wait_ready(timeout=300, priority=Priority.BACKGROUND)
    (forkserver,) = [e["pid"] for e in events if e["event"] == "forkserver_ready"]
    assert marker.read_text().split() == [str(forkserver)]
    assert "tests_absent_library" not in session.families["triton"].pool.preloads
    helpers = [e for e in events if e["event"] == "helper_ready"]
    assert helpers and all(e["info"]["forked_from"] == forkserver for e in helpers)


def test_preload_from_the_environment_comes_before_the_first_build(tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_TRITON_PRELOAD", "json, tests.kernels.basic")
    session = Session(triton={"workers": 1})
    events = []
    session.stats.subscribe(events.append)
    with session:  # no plan, no request: no process is started
        assert not session.families["triton"].pool.table.has_queued()
        x = torch.empty(64, device="meta")
        with capture() as plan:
            k.scale_kernel[(1,)](x, x, 64, 0.5, BLOCK=64)
        (ticket,) = session.families["triton"].submit(plan, Priority.BACKGROUND)
        assert ticket.wait(120) is State.DONE
    # The fork server imported them before it forked the helper.
    (event,) = [e for e in events if e["event"] == "forkserver_preloaded"]
    assert event["modules"] == 2 and event["failed"] == []
    assert [e["event"] for e in events if "ready" in e["event"]] == ["forkserver_ready", "helper_ready"]


def test_warmup_can_start_once_planned_and_each_launch_then_gets_its_variant_built_once():
    session = Session(triton={"workers": 1})  # not started yet: nothing is built until start()
    try:
        limits = EngineLimits(max_num_tokens=64, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))
        run = session.plan_model(model(), limits, [ScaleProvider()])
        assert session.wait_planned(timeout=300)
        warm = [t for t in run.tickets if t.priority == Priority.WARMUP]
        assert warm and all(t.state is State.QUEUED for t in warm)
        assert not session.wait_ready(timeout=0.5)  # planned is not built

        session.start()
        events = []
        session.stats.subscribe(events.append)
        layer = model()[1]  # hidden 1000: its own variants
        for tokens in limits.cuda_graph_batch_sizes:  # what warmup runs, now, while helpers start
            layer(torch.empty(tokens, layer.hidden, device="meta", dtype=limits.torch_dtypes()[0]))
        launched = [e["key"] for e in events if e["event"] == "executor_miss"]
        assert launched, "the warmup launches found nothing to wait for"
        tickets = {t.key: t for t in run.tickets}
        assert all(tickets[key].state is State.DONE for key in launched)
        assert all(tickets[key].priority == Priority.URGENT for key in launched)  # raised ahead of the queue
        assert session.wait_ready(timeout=300)
        builds = [e["key"] for e in events if e["event"] == "build_finish"]
        assert len(builds) == len(set(builds)) and set(launched) <= set(builds)  # each built once
    finally:
        session.close()


class KnobProvider(ScaleProvider):
    name = "test-knob"
    extra_limits = {"scale_repeat": "how often each launch is planned"}


def test_an_extra_limit_no_provider_reads_gets_one_warning_naming_the_closest_key(session_factory, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = session_factory(workers=0)  # planning alone: nothing needs building here
    limits = EngineLimits(max_num_tokens=8, max_batch_size=8, extra={"scale_repat": 2, "scale_repeat": 1})
    run = session.plan_model(model(), limits, [KnobProvider()])
    assert run.wait(timeout=300)
    lines = [r.getMessage() for r in caplog.records if "EngineLimits.extra" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "'scale_repat'" in lines[0] and "did you mean 'scale_repeat' (test-knob)" in lines[0]
    assert run.variants[Priority.BACKGROUND] > 0  # the rest of planning went on


def test_with_no_helpers_wait_ready_builds_what_is_queued_in_place_instead_of_waiting_for_ever(
        session_factory, triton_cache):
    session = session_factory(workers=0)  # JIT_AHEAD_TRITON_WORKERS=0 / demo --workers 0
    run = session.plan_model(model(), EngineLimits(max_num_tokens=16, max_batch_size=2), [ScaleProvider()])
    assert session.wait_ready(timeout=300, priority=Priority.BACKGROUND)
    assert run.tickets and all(t.state is State.DONE for t in run.tickets)
    assert {t.result.builder for t in run.tickets} == {"executor"}  # built here, once each
    assert session.families["triton"].pool.helper_pids() == {}
    assert not any(p.name().startswith("python") for p in psutil.Process().children(recursive=True)
                   if p.status() != psutil.STATUS_ZOMBIE and "jit_ahead_helpers" in " ".join(p.cmdline()))


def test_a_closed_session_leaves_tritons_hook_slot_as_it_found_it():
    import triton.runtime.jit as triton_jit
    from triton import knobs

    serializer = triton_jit.serialize_specialization_data  # wrapped with the hook on Triton 3.6

    def theirs(**kwargs):  # another tool's hook, there before jit_ahead started
        return None

    knobs.runtime.jit_cache_hook = theirs
    session = Session(triton={"workers": 0}).start()
    try:
        with capture():  # planning holds the hook too, and lets go
            k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"),
                               torch.empty(64, device="meta"), 64, BLOCK=64)
        assert knobs.runtime.jit_cache_hook is not theirs  # ours, chaining theirs
        Session(triton={"workers": 0}).close()  # one never started removes nothing of the running one's
        assert knobs.runtime.jit_cache_hook is not theirs
        session.close()
        assert knobs.runtime.jit_cache_hook is theirs and triton_jit.serialize_specialization_data is serializer
        with capture():  # a capture without a session holds it for its length only
            assert knobs.runtime.jit_cache_hook is not theirs
        assert knobs.runtime.jit_cache_hook is theirs
    finally:
        session.close()
        knobs.runtime.jit_cache_hook = None


def test_a_closed_session_gives_torch_back_its_own_meta_kernel():
    # planning answers host reads of meta tensors by replacing torch's meta kernel of _local_scalar_dense
    from jit_ahead.providers import meta

    session = Session(triton={"workers": 0}).start()
    try:
        with meta.meta_reads_answered(3):
            assert torch.empty((), device="meta", dtype=torch.int64).item() == 3
    finally:
        session.close()
    assert meta._reads_library is None
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors"):
        torch.empty((), device="meta", dtype=torch.int64).item()


def test_a_hook_put_over_ours_that_chains_ours_neither_loops_nor_loses_ours_in_the_next_session():
    # Another tool put its hook over ours and calls ours from it. Our session closes (the slot stays
    # theirs) and a new one starts: it used to put ours over theirs again, chained to theirs, which calls
    # ours, which calls theirs... every miss ended in a RecursionError.
    from triton import knobs

    session = Session(triton={"workers": 0}).start()
    theirs_saw = []
    try:
        below = knobs.runtime.jit_cache_hook  # ours

        def theirs(**kwargs):
            theirs_saw.append(kwargs["fn"].name)
            return below(**kwargs)

        knobs.runtime.jit_cache_hook = theirs
        session.close()
        assert knobs.runtime.jit_cache_hook is theirs
        session = Session(triton={"workers": 0}).start()
        misses = session.stats.count("executor_miss")
        k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"),
                           torch.empty(64, device="meta"), 64, BLOCK=64)
        assert theirs_saw == ["add_kernel"]
        assert session.stats.count("executor_miss") == misses + 1  # ours, below theirs, saw the miss
        with capture() as plan:  # and planning through theirs still captures
            k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"),
                               torch.empty(64, device="meta"), 64, BLOCK=32)
        assert len(plan.requests) == 1
    finally:
        session.close()
        knobs.runtime.jit_cache_hook = None


STAND_IN_OUTLIVES_NO_SESSION = """
import torch, triton
from jit_ahead.session import Session
from jit_ahead.triton import capture
from tests.kernels import basic as k

assert triton.runtime.driver._active is None and not torch.cuda.is_available()
queries = {name: getattr(torch.cuda, name) for name in ("get_device_name", "get_device_capability",
                                                          "get_device_properties", "device_count")}
session = Session(triton={"workers": 0}).start()
with capture() as plan:  # planning on a machine without a GPU: the stand-in shows an sm_90 GPU meanwhile
    assert torch.cuda.get_device_name() == "NVIDIA H200"
    k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"),
                       torch.empty(64, device="meta"), 64, BLOCK=64)
assert len(plan.requests) == 1
session.close()
print("driver after", type(triton.runtime.driver._active).__name__)
print("torch after", all(getattr(torch.cuda, name) is query for name, query in queries.items()))
"""


def test_a_closed_session_leaves_no_stand_in_gpu_on_a_machine_without_one(tmp_path):
    # The stand-in Triton driver and torch's device answers that planning installs where there is no GPU
    # stayed for the life of the process: after the session, the process still "had" an H200.
    import subprocess
    import sys

    from .conftest import REPO

    done = subprocess.run([sys.executable, "-c", STAND_IN_OUTLIVES_NO_SESSION], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ,
                                                       "TRITON_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["driver after NoneType", "torch after True"]


STAND_IN_HOLDS = """
import triton
from triton.backends.compiler import GPUTarget
from jit_ahead.triton import capture
from jit_ahead.triton.standin import StandInDriver, ensure_driver

try:  # a target the stand-in cannot show: the capture fails, and must hold nothing
    with capture(GPUTarget("hip", "gfx942", 64)):
        pass
except Exception as exc:
    print("refused", type(exc).__name__)
with capture():
    pass
print("after a failed hold", type(triton.runtime.driver._active).__name__)
with capture():
    ensure_driver()  # a script's own stand-in, asked for while planning holds one
print("after ensure_driver in a hold", type(triton.runtime.driver._active).__name__)
"""


def test_a_failed_stand_in_hold_holds_nothing_and_a_process_wide_one_outlives_the_holds(tmp_path):
    import subprocess
    import sys

    from .conftest import REPO

    done = subprocess.run([sys.executable, "-c", STAND_IN_HOLDS], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "TRITON_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[1:3] == ["after a failed hold NoneType", "after ensure_driver in a hold StandInDriver"]


def test_a_hook_that_replaced_ours_without_chaining_it_does_not_keep_the_next_session_out():
    from triton import knobs

    session = Session(triton={"workers": 0}).start()
    try:
        knobs.runtime.jit_cache_hook = lambda **kwargs: None  # another tool's, over ours, calling nothing
        session.close()
        session = Session(triton={"workers": 0}).start()
        misses = session.stats.count("executor_miss")
        k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"),
                           torch.empty(64, device="meta"), 64, BLOCK=16)
        assert session.stats.count("executor_miss") == misses + 1
    finally:
        session.close()
        knobs.runtime.jit_cache_hook = None


def test_a_hook_set_over_ours_while_the_session_runs_goes_below_ours_with_one_line(caplog):
    # Another tool sets Triton's one hook slot after the session started, without calling what it
    # replaced: jit_ahead's executor stopped seeing misses (a variant a helper was building compiled again
    # in the server), with no message.
    import logging
    import os

    from triton import knobs

    caplog.set_level(logging.WARNING, logger="jit_ahead.triton")
    session = Session(triton={"workers": 0}).start()
    theirs_saw = []
    try:
        def theirs(**kwargs):
            theirs_saw.append(kwargs["fn"].name)

        knobs.runtime.jit_cache_hook = theirs
        assert knobs.runtime.jit_cache_hook is not theirs  # ours stays in the slot
        misses = session.stats.count("executor_miss")
        k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"),
                           torch.empty(64, device="meta"), 64, BLOCK=8)
        assert theirs_saw == ["add_kernel"]  # theirs is called, first
        assert session.stats.count("executor_miss") == misses + 1  # and ours still sees the miss
        lines = [r.getMessage() for r in caplog.records if "another tool set Triton's jit_cache_hook" in r.getMessage()]
        assert len(lines) == 1 and "theirs" in lines[0]
        knobs.runtime.jit_cache_hook = None  # the tool takes its hook out: from under ours
        k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"),
                           torch.empty(64, device="meta"), 64, BLOCK=4)
        assert theirs_saw == ["add_kernel"] and session.stats.count("executor_miss") == misses + 2
        knobs.runtime.jit_cache_hook = theirs
        pid = os.fork()  # a fork (a helper, a planner) sets the slot as it likes: nothing is kept there
        if pid == 0:
            knobs.runtime.jit_cache_hook = None
            os._exit(0 if knobs.runtime.jit_cache_hook is None else 1)
        assert os.waitpid(pid, 0)[1] == 0
        session.close()
        assert knobs.runtime.jit_cache_hook is theirs  # the slot is theirs when jit_ahead lets go
        knobs.runtime.jit_cache_hook = None
        assert knobs.runtime.jit_cache_hook is None  # a plain slot again
    finally:
        session.close()
        knobs.runtime.jit_cache_hook = None
    with knobs.runtime.scope():  # Triton's own save and restore of the knobs still holds the hook
        knobs.runtime.jit_cache_hook = theirs
    assert knobs.runtime.jit_cache_hook is None
