"""The family contract (core/family.py), pinned by a toy third family (tests/toy): registered through the
``jit_ahead.families`` entry-point group, it goes through the pool's helpers, the executor's wait and
build-in-place paths, the guard, records and replay, the stats log and the report, and its hooks are gone
once its session closes. The toy DSL builds a file per (kernel, spec)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jit_ahead import registry
from jit_ahead.core.building.executor import JitAfterReadyError
from jit_ahead.core.family import Family
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session
from jit_ahead.report import analyse

from .toy import dsl
from .toy import INFO
from .toy.family import ToyFamily

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "jit_ahead" / "core"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy family declared by an installed package's entry point (a dist-info folder on sys.path),
    its DSL's cache empty; yields a function making sessions, all closed after the test."""
    dist = tmp_path / "site" / "toy_jit_family-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-jit-family\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[jit_ahead.families]\ntoy = tests.toy:INFO\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_entry_points_read", False)
    monkeypatch.setattr(registry, "_unloadable", set())
    monkeypatch.setenv(dsl.CACHE_KNOB, str(tmp_path / "toy-cache"))
    monkeypatch.setattr(dsl, "compiled_here", [])
    sessions = []

    def make(**options) -> Session:
        session = Session(("toy",), toy=options)
        session.seen = []  # every event from the start on (the replay thread reports at once)
        session.stats.subscribe(session.seen.append)
        sessions.append(session.start())
        return session

    yield make
    for session in sessions:
        session.close()


def test_the_entry_point_group_registers_a_family_and_a_session_starts_it(toy):
    assert registry.family_info("toy") == INFO
    assert registry.triggers(["toy", "nonesuch"]) == ("tests.toy.dsl",)
    assert "toy" in registry.known_families() and "triton" in registry.known_families()
    session = toy(workers=1)
    family = session.families["toy"]
    assert isinstance(family, ToyFamily) and isinstance(family, Family)
    assert dsl.handler == family.executor.on_miss
    session.close()
    assert dsl.handler is None  # nothing of the family survives its session


def test_a_broken_entry_point_is_one_line_and_leaves_the_others(toy, tmp_path, caplog):
    (tmp_path / "site" / "toy_jit_family-0.1.dist-info" / "entry_points.txt").write_text(
        "[jit_ahead.families]\ntoy = tests.toy:INFO\nbroken = tests.toy.nonesuch:INFO\nwrong = tests.toy.family:SPEC\n")

    def lines():
        return [r.getMessage() for r in caplog.records if r.name == "jit_ahead.registry"]

    assert registry.family_info("toy") == INFO
    assert not lines()  # only the entry point asked for is loaded (each imports its package's module)
    assert registry.family_info("broken") is None and registry.family_info("wrong") is None
    assert len(lines()) == 2 and any("broken" in line and "cannot be loaded" in line for line in lines())
    with pytest.raises(ValueError, match="unknown jit_ahead family 'broken'; known: .*toy"):
        Session(("broken",))
    assert len(lines()) == 2  # said once each


def test_planned_variants_are_built_by_helpers_and_loaded_without_a_compile(toy):
    session = toy(workers=1)
    events = session.seen
    with session.families["toy"].capture() as calls:
        for spec in ("a", "b", "c"):
            dsl.compile("add", spec)
    assert calls == [("add", "a"), ("add", "b"), ("add", "c")] and not dsl.path_of("add", "a").exists()
    tickets = session.families["toy"].submit(calls, Priority.WARMUP)
    assert len(tickets) == 3 and session.wait_ready(timeout=60)
    built = [e for e in events if e["event"] == "build_finish"]
    assert len(built) == 3 and all(e["ok"] and e["helper"].startswith("helper") for e in built)
    assert dsl.compile("add", "b").startswith("add(b) built by pid")
    (miss,) = [e for e in events if e["event"] == "executor_miss"]
    assert (miss["outcome"], miss["planned"]) == ("disk", True)
    assert dsl.compiled_here == []
    assert session.families["toy"].submit([("add", "a")], Priority.WARMUP) == []  # on disk: nothing queued again


def test_a_launch_waits_for_the_helper_building_its_variant(toy):
    session = toy(workers=1)
    events = session.seen
    (ticket,) = session.families["toy"].submit([("add", "slow:1.5")], Priority.BACKGROUND)
    deadline = time.monotonic() + 120
    while ticket.state.value == "queued":  # until the helper has it
        assert time.monotonic() < deadline, "no helper took the request"
        session.families["toy"].pool.table.wait_for_change(ticket, 0.05)
    text = dsl.compile("add", "slow:1.5")
    assert "built by pid" in text and dsl.compiled_here == []
    (miss,) = [e for e in events if e["event"] == "executor_miss"]
    assert miss["outcome"] == "ready" and miss["seconds"] > 0.1


def test_without_helpers_a_launch_builds_in_place_once(toy):
    session = toy(workers=0)
    events = session.seen
    dsl.compile("mul", "x")
    dsl.compile("mul", "x")
    misses = [e["outcome"] for e in events if e["event"] == "executor_miss"]
    assert misses == ["built_here", "disk"]
    assert [e["helper"] for e in events if e["event"] == "build_finish"] == ["executor"]
    assert dsl.compiled_here == []  # built by jit_ahead's in-place build, not the DSL's own path


def test_a_failed_build_falls_back_to_the_dsl_and_the_guard_names_unplanned_variants(toy, monkeypatch):
    session = toy(workers=0)
    events = session.seen
    with pytest.raises(RuntimeError, match="does not compile spec 'fail'"):
        dsl.compile("add", "fail")  # jit_ahead's build failed; the DSL's own compile raises as it would
    assert [e["outcome"] for e in events if e["event"] == "executor_miss"] == ["fallback"]
    session.mark_serving(tune_ahead=False)
    dsl.compile("add", "late")
    (guard,) = [e for e in events if e["event"] == "guard"]
    assert guard["family"] == "toy" and "add[late] was not planned" in guard["message"]
    session.families["toy"].executor.guard = "error"
    with pytest.raises(JitAfterReadyError, match=r"add\[later\] was not planned.*JIT_AHEAD_MODE=error"):
        dsl.compile("add", "later")


def test_records_are_replayed_by_helpers_at_the_next_start(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_RECORD_DIR", str(tmp_path / "records"))
    (tmp_path / "records").mkdir(mode=0o700)
    first = toy(workers=0)
    for spec in ("r1", "r2"):
        dsl.compile("add", spec)
    assert first.families["toy"].wait_replay(10)
    first.close()
    monkeypatch.setenv(dsl.CACHE_KNOB, str(tmp_path / "another-cache"))  # a second node: nothing built
    second = toy(workers=1)
    events = second.seen
    assert second.wait_ready(timeout=60, priority=Priority.REPLAY)
    (replay,) = [e for e in events if e["event"] == "replay"]
    assert (replay["variants"], replay["queued"]) == (2, 2)
    assert sorted(e["label"] for e in events if e["event"] == "build_finish") == ["add[r1]", "add[r2]"]
    assert all(dsl.path_of("add", spec).exists() for spec in ("r1", "r2"))


def test_the_report_reads_the_toy_family_from_its_stats(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_STATS", str(tmp_path / "stats.jsonl"))
    session = toy(workers=1)
    with session.families["toy"].capture() as calls:
        dsl.compile("add", "p")
    session.families["toy"].submit(calls, Priority.WARMUP)
    assert session.wait_ready(timeout=60)
    dsl.compile("add", "p")
    session.mark_serving(tune_ahead=False)
    dsl.compile("add", "unplanned")  # raised to URGENT, built by the helper while the launch waits
    session.close()
    events = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    coverage = analyse(events)
    row = coverage.kernels["tests.toy.kernels.add"]
    assert (row.planned, row.built_ahead, row.loaded, row.waits) == (1, 2, 1, 1)
    # the toy family's misses are its calls (FamilyInfo.misses_are_calls): the unplanned one is listed
    assert [(u["label"], u["phase"]) for u in coverage.unplanned] == [("add[unplanned]", "serving")]
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_entry_points_read", True)  # a report process that does not know it
    assert analyse(events).unplanned == []


def test_importing_the_core_imports_no_dsl():
    """Every module of the family-agnostic core, imported in a fresh process, imports no kernel DSL (a
    family brings its own) and no torch."""
    code = ("import importlib, pkgutil, sys\nimport jit_ahead.core as core\n"
            "for m in pkgutil.walk_packages(core.__path__, 'jit_ahead.core.'):\n    importlib.import_module(m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in "
            "('triton', 'cutlass', 'tilelang', 'deep_gemm', 'flashinfer', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    assert len(list(CORE.rglob("*.py"))) > 20  # the modules are there to import (in their rooms too)


def test_helpers_that_never_start_leave_the_warmup_to_the_waiting_thread(toy, monkeypatch):
    # Every helper is its own interpreter (JIT_AHEAD_HELPER_START=spawn) and each fails at its start (a
    # Python home that does not exist: a broken environment); each slot gives up after its retries while the
    # server waits for its warmup, which is then built on the waiting thread instead of waiting out the
    # timeout with nothing building it.
    monkeypatch.setenv("JIT_AHEAD_HELPER_START", "spawn")
    monkeypatch.setenv("PYTHONHOME", "/nonexistent-python-home")
    session = toy(workers=1)
    family = session.families["toy"]
    with family.capture() as calls:
        dsl.compile("add", "w1")
    family.submit(calls, Priority.WARMUP)
    assert session.wait_ready(timeout=120, priority=Priority.WARMUP)
    assert dsl.path_of("add", "w1").exists() and dsl.compiled_here == []  # the builder's build, not the DSL's
    assert not family.pool.may_get_helpers()
