"""Saved plans: planning a model within limits is done once. A start whose plan is saved and built runs
no enumeration and starts no process; a changed model, limit or library version plans again."""
import logging
import os
import shutil
import time

import psutil
import pytest
import torch

from jit_ahead.core.planning import plan_cache
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session

from .layers import LoggedProvider, ScaleLayer, ScaleProvider, model

LIMITS = EngineLimits(max_num_tokens=64, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))


class CountingProvider(ScaleProvider):
    """ScaleProvider that counts how often it is asked to find layers (a planning pass over the model)."""

    name = "test-counting"
    passes = 0

    def find_layers(self, model):
        CountingProvider.passes += 1
        return super().find_layers(model)


def start(events=None, workers=1) -> Session:
    session = Session(triton={"workers": workers})
    if events is not None:
        session.stats.subscribe(events.append)
    return session.start()


def plan(session, net, limits=LIMITS, provider=None):
    run = session.plan_model(net, limits, [provider or CountingProvider()])
    assert run.wait(300), "planning did not finish"
    return run


def test_a_second_start_reads_the_saved_plan_and_starts_no_process_when_all_is_built():
    first = start()
    try:
        run = plan(first, model())
        assert first.wait_ready(300, priority=Priority.BACKGROUND)
        assert run.saved_plan and os.path.exists(run.saved_plan) and all(t.result.ok for t in run.tickets)
    finally:
        first.close()
    CountingProvider.passes = 0
    events = []
    second = start(events)
    try:
        again = plan(second, model())
        assert CountingProvider.passes == 0  # no probe of the model, no enumeration
        assert again.saved_plan == run.saved_plan and again.variants == run.variants and again.launches == run.launches
        assert not again.tickets  # everything is on disk: nothing queued
        time.sleep(1.0)
        assert not psutil.Process().children(recursive=True)  # no planner, no fork server, no helper
        assert not [e for e in events if e["event"].endswith("_ready")]
        assert [e["event"] for e in events if e["event"].startswith("plan")] == ["plan_loaded"]
        # the plan is known to the executor: the guard and the report compare against it
        assert len(second.families["triton"].executor.planned_requests()) == sum(run.variants.values())
    finally:
        second.close()


def test_a_start_with_some_builds_missing_builds_only_those():
    from triton.runtime.cache import get_cache_manager

    first = start()
    try:
        run = plan(first, model())
        assert first.wait_ready(300, priority=Priority.BACKGROUND)
    finally:
        first.close()
    lost = run.tickets[0].key
    shutil.rmtree(get_cache_manager(lost).cache_dir)  # one variant's cache entry is gone
    second = start()
    try:
        again = plan(second, model())
        assert [t.key for t in again.tickets] == [lost]
        assert second.wait_ready(300, priority=Priority.BACKGROUND) and again.tickets[0].result.ok
    finally:
        second.close()


def test_a_changed_model_or_limit_plans_again_and_says_what_changed(caplog):
    caplog.set_level(logging.INFO, logger="jit_ahead")
    session = start(workers=0)
    try:
        base = plan(session, model())
        CountingProvider.passes = 0
        wider = torch.nn.Sequential(ScaleLayer(1024), ScaleLayer(2048))
        changed_model = plan(session, wider)
        changed_limits = plan(session, model(), EngineLimits(max_num_tokens=48, max_batch_size=8,
                                                             cuda_graph_batch_sizes=(1, 8)))
        assert CountingProvider.passes == 2
        assert len({base.saved_plan, changed_model.saved_plan, changed_limits.saved_plan}) == 3
        assert any("differs in limits" in r.getMessage() and "max_num_tokens=48" in r.getMessage()
                   for r in caplog.records)
        assert any("differs in model changed" in r.getMessage() for r in caplog.records)
    finally:
        session.close()


def _library(root, version: str) -> None:
    """An installed distribution ``tests_plan_lib`` of that version (a package and its dist-info)."""
    package = root / "tests_plan_lib"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    for old in root.glob("tests_plan_lib-*.dist-info"):
        shutil.rmtree(old)
    info = root / f"tests_plan_lib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tests_plan_lib\nVersion: {version}\n")
    (info / "top_level.txt").write_text("tests_plan_lib\n")
    (info / "RECORD").write_text(f"tests_plan_lib/__init__.py,,0\ntests_plan_lib-{version}.dist-info/METADATA,,\n")


class LibraryProvider(CountingProvider):
    name = "test-library"
    library = "tests_plan_lib"


def _new_process_view() -> None:
    """What a new process would see: distributions are read once per process, and this test upgrades
    one between two starts in the same process."""
    plan_cache.distribution_digest.cache_clear()


def test_a_changed_library_version_plans_again(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="jit_ahead")
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    _library(root, "1.0")
    _new_process_view()
    session = start(workers=0)
    try:
        first = plan(session, model(), provider=LibraryProvider())
        CountingProvider.passes = 0
        same = plan(session, model(), provider=LibraryProvider())
        assert CountingProvider.passes == 0 and same.saved_plan == first.saved_plan
        _library(root, "1.1")
        _new_process_view()
        upgraded = plan(session, model(), provider=LibraryProvider())
        assert CountingProvider.passes == 1 and upgraded.saved_plan != first.saved_plan
        assert any("differs in libraries" in r.getMessage() and "1.1" in r.getMessage() for r in caplog.records)
    finally:
        session.close()
        _new_process_view()


def test_a_corrupt_plan_is_replanned_and_an_unsafe_folder_is_refused(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = start(workers=0)
    try:
        first = plan(session, model())
        with open(first.saved_plan, "w") as f:
            f.write('{"jit_ahead_plan": 1, "key": \n')  # torn mid-write by hand
        CountingProvider.passes = 0
        again = plan(session, model())
        assert CountingProvider.passes == 1 and again.variants == first.variants
        assert any("is unusable" in r.getMessage() and "planning again" in r.getMessage() for r in caplog.records)
    finally:
        session.close()
    unsafe = tmp_path / "shared-plans"
    unsafe.mkdir()
    unsafe.chmod(0o777)
    monkeypatch.setenv("JIT_AHEAD_PLAN_DIR", str(unsafe))
    session = start(workers=0)
    try:
        run = plan(session, model())
        assert run.saved_plan is None and run.variants[Priority.BACKGROUND] > 0 and not list(unsafe.iterdir())
        assert any("writable by group or others" in r.getMessage() for r in caplog.records)
    finally:
        session.close()


def test_a_plan_folder_where_the_lock_cannot_be_taken_still_gives_its_plan_and_plans_without_it(caplog):
    # plans baked into a read-only image: the lock file cannot be made. Its place is taken by a folder here
    # (the tests run as root, whom a mode does not stop), which refuses the lock as a read-only folder does
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = start(workers=0)
    try:
        first = plan(session, model())
        lock = session_store_lock(first)
        if os.path.exists(lock):
            os.remove(lock)
        os.mkdir(lock)
        CountingProvider.passes = 0
        again = plan(session, model())
        assert CountingProvider.passes == 0 and again.read_saved and again.variants == first.variants
        assert not again.errors
        assert [r for r in caplog.records if "cannot take the lock" in r.getMessage() and str(lock) in r.getMessage()]
        os.remove(first.saved_plan)  # no plan there: this process plans, without the lock
        fresh = plan(session, model())
        assert CountingProvider.passes == 1 and fresh.variants == first.variants and not fresh.errors
    finally:
        session.close()


def test_a_fifo_in_a_saved_plans_place_is_one_line_and_planning_goes_on_and_replaces_it(caplog):
    # opening a FIFO for reading waits for a writer: planning blocked on it forever
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = start(workers=0)
    try:
        first = plan(session, model())
        os.remove(first.saved_plan)
        os.mkfifo(first.saved_plan, 0o600)
        CountingProvider.passes = 0
        run = session.plan_model(model(), LIMITS, [CountingProvider()])
        assert run.wait(60), "planning blocked on the FIFO"
        assert CountingProvider.passes == 1 and run.variants == first.variants and not run.errors
        assert [r for r in caplog.records if first.saved_plan in r.getMessage() and "FIFO" in r.getMessage()]
        assert os.path.isfile(first.saved_plan)  # the fresh plan took its place
        CountingProvider.passes = 0
        assert plan(session, model()).read_saved and CountingProvider.passes == 0
    finally:
        session.close()


@pytest.mark.parametrize("content", [b"\xff\xfe\x00 not text\n", b"[1, 2]\n{}\n", b"42\n"],
                         ids=["not-utf8", "list-header", "int-header"])
def test_a_plan_that_is_not_text_or_whose_header_is_no_object_is_one_line_and_replaced(content, caplog):
    # before: "planning stopped early" with a traceback and 0 variants on every start, the file left as it was
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = start(workers=0)
    try:
        first = plan(session, model())
        with open(first.saved_plan, "wb") as f:
            f.write(content)
        CountingProvider.passes = 0
        again = plan(session, model())
        assert CountingProvider.passes == 1 and again.variants == first.variants and not again.errors
        lines = [r.getMessage() for r in caplog.records if first.saved_plan in r.getMessage()]
        assert len(lines) == 1 and "planning again" in lines[0], lines
        assert not [r for r in caplog.records if r.exc_info]
        CountingProvider.passes = 0
        assert plan(session, model()).read_saved and CountingProvider.passes == 0  # the fresh plan replaced it
    finally:
        session.close()


def session_store_lock(run) -> str:
    """The lock file next to a saved plan (``plan-<digest>.jsonl`` -> ``.plan-<digest>.lock``)."""
    folder, name = os.path.split(run.saved_plan)
    return os.path.join(folder, "." + name.rsplit(".", 1)[0] + ".lock")


STOPPED_PLANNER = """
import sys, time
from jit_ahead.triton.standin import ensure_driver
ensure_driver()  # the device the test process plans for: the same plan key
from jit_ahead.session import Session
from tests.layers import LoggedProvider, model
from tests.test_plan_cache import LIMITS
session = Session(triton={"workers": 0}).start()
session.plan_model(model(), LIMITS, [LoggedProvider(sys.argv[1], pause=0.05)])
time.sleep(600)  # killed halfway through planning
"""


def test_a_start_killed_mid_planning_is_followed_by_one_that_goes_on_and_ends_with_the_same_plan(
        tmp_path, monkeypatch):
    # Before: only a finished plan was saved, so the next start planned everything again (issue 44).
    import signal
    import subprocess
    import sys

    from .conftest import REPO

    folder = tmp_path / "plans"
    monkeypatch.setenv("JIT_AHEAD_PLAN_DIR", str(folder))
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "1")
    first_log = tmp_path / "first.log"
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_PLANNER, str(first_log)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            partial = list(folder.glob("plan-*.partial.jsonl"))
            if partial and first_log.exists() and len(first_log.read_text().splitlines()) >= 60:
                break
            assert proc.poll() is None, "the planning process ended before it was killed"
            time.sleep(0.05)
        else:
            raise AssertionError("no partial plan within 120 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ran_first = len(first_log.read_text().splitlines())
    (partial,) = folder.glob("plan-*.partial.jsonl")
    assert not [p for p in folder.glob("plan-*.jsonl") if p != partial]  # no whole plan: it was killed

    second_log = tmp_path / "second.log"
    session = start(workers=0)
    try:
        run = plan(session, model(), provider=LoggedProvider(second_log))
    finally:
        session.close()
    ran_second = len(second_log.read_text().splitlines())
    assert run.launches_resumed > 0 and ran_second == run.launches - run.launches_resumed
    assert ran_second < run.launches and run.launches_resumed <= ran_first
    assert run.saved_plan and not partial.exists()  # the whole plan is saved, the partial one gone

    # the same plan as a start that was never stopped
    monkeypatch.setenv("JIT_AHEAD_PLAN_DIR", str(tmp_path / "other-plans"))
    session = start(workers=0)
    try:
        whole = plan(session, model(), provider=LoggedProvider(tmp_path / "whole.log"))
    finally:
        session.close()
    assert whole.launches == run.launches and whole.launches_resumed == 0
    assert {r.predicted_hash for r in run.requests} == {r.predicted_hash for r in whole.requests}
    assert dict(run.variants) == dict(whole.variants)


def test_a_damaged_partial_plan_is_one_line_and_planning_starts_over(tmp_path, caplog):
    first = start(workers=0)
    try:
        whole = plan(first, model())
    finally:
        first.close()
    saved = whole.saved_plan
    partial = saved.replace(".jsonl", ".partial.jsonl")
    os.remove(saved)
    with open(partial, "w") as f:
        f.write('{"jit_ahead_plan": 1, "partial": true, "key": {}}\nnot json\n')
    os.chmod(partial, 0o600)
    CountingProvider.passes = 0
    second = start(workers=0)
    try:
        again = plan(second, model())
    finally:
        second.close()
    assert CountingProvider.passes == 1 and again.launches_resumed == 0 and again.launches == whole.launches
    assert [r.levelno for r in caplog.records if partial in r.getMessage()] == [logging.WARNING]
    assert not os.path.exists(partial) and os.path.exists(saved)  # the whole plan replaced it


def test_a_plan_cut_at_a_line_end_is_refused_not_half_read(tmp_path, caplog):
    # Before: a file that lost its last lines whole (a copy cut short, a disk that filled between lines)
    # still parsed, so the start took a plan without those families' variants and never planned them.
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = start(workers=0)
    try:
        first = plan(session, model())
        with open(first.saved_plan) as f:
            header = f.readline()
        with open(first.saved_plan, "w") as f:
            f.write(header)  # the header alone: every family's line is gone
        CountingProvider.passes = 0
        again = plan(session, model())
        assert CountingProvider.passes == 1 and again.variants == first.variants
        assert any(first.saved_plan in r.getMessage() and "cut short" in r.getMessage() for r in caplog.records)

        # a partial plan likewise: its progress says launches ran, whose variants the lost lines held
        store = plan_cache.PlanStore(tmp_path / "plans")
        families = session.families
        parts = {"model_class": "test", "n": 1}
        saved = plan_cache.SavedPlan(requests={"triton": [(Priority.WARMUP, r) for r in first.requests]},
                                     launches=first.launches, progress={"g": [[0, first.launches]]})
        path = store.save(parts, saved, families)
        assert path and store.load(parts, families, partial=True).progress == {"g": [[0, first.launches]]}
        lines = path.read_text().splitlines()
        path.write_text(lines[0] + "\n")
        assert store.load(parts, families, partial=True) is None
        path.write_text("\n".join(lines)[:-40])  # cut mid-line
        assert store.load(parts, families, partial=True) is None
    finally:
        session.close()


def test_a_huge_plan_file_is_refused_unread(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = start(workers=0)
    try:
        first = plan(session, model())
        with open(first.saved_plan, "r+b") as f:
            f.truncate(plan_cache.MAX_PLAN_BYTES + 1)  # sparse: no disk, but reading it whole would take it all
        peak = psutil.Process().memory_info().rss
        CountingProvider.passes = 0
        again = plan(session, model())
        assert CountingProvider.passes == 1 and again.variants == first.variants
        assert psutil.Process().memory_info().rss - peak < plan_cache.MAX_PLAN_BYTES // 2
        assert [r for r in caplog.records if "bytes, more than any plan" in r.getMessage()]
        assert os.path.getsize(again.saved_plan) < 1 << 20  # replaced by the real plan
    finally:
        session.close()


def test_a_partial_plan_that_cannot_be_written_is_said_once_and_planning_ends_whole(tmp_path, monkeypatch,
                                                                                      caplog):
    # The partial file's place is taken by a folder (as a read-only or full disk would refuse the file,
    # also for root): each save fails; planning goes on, says so once, and saves the whole plan.
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setattr("jit_ahead.core.planning.run.PARTIAL_EVERY_S", 0.0)  # a save after every group's step
    session = start(workers=0)
    try:
        whole = plan(session, model(), provider=LoggedProvider(tmp_path / "first.log"))
        partial = whole.saved_plan.replace(".jsonl", ".partial.jsonl")
        os.remove(whole.saved_plan)
        os.mkdir(partial)
        caplog.clear()
        again = plan(session, model(), provider=LoggedProvider(tmp_path / "second.log"))
        assert again.launches == whole.launches and again.variants == whole.variants and again.saved_plan
        said = [r for r in caplog.records if "cannot save the plan" in r.getMessage()]
        assert len(said) == 1 and partial in said[0].getMessage()
    finally:
        session.close()
