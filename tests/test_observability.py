"""The stats log (one JSON line per event), the one-line summary, and the zero-JIT-after-ready guard."""
import json
import logging
import os

import pytest
import torch

from jit_ahead.core.building.executor import JitAfterReadyError
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session
from jit_ahead.core.observing.stats_log import stats_log_path
from jit_ahead.triton import capture
from jit_ahead.triton.variant_diff import differences

from .conftest import wait_all
from .kernels import basic as k

X = torch.empty(4096, device="meta", dtype=torch.float32)


def serve(session):
    """Mark serving and wait for the idle helper to retire: a miss then waits for the urgent helper, forked
    from the fork server that still holds the kernel's library."""
    import time

    session.mark_serving()
    deadline = time.monotonic() + 60
    while session.families["triton"].pool.live_helpers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session.families["triton"].pool.live_helpers() == 0


def planned_session(monkeypatch, **env):
    # no helper keeps building once serving starts (serve() waits for the one helper to retire): else, on a
    # machine whose default keeps one, its slot and the urgent slot race for an urgent build
    env.setdefault("JIT_AHEAD_SERVING_WORKERS", "0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    session = Session(triton={"workers": 1}).start()
    with capture() as plan:
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=64)
    assert all(r.ok for r in wait_all(session.families["triton"].submit(plan, Priority.WARMUP)))
    return session


def run_with_stats_log(monkeypatch, tmp_path):
    """A real run: one planned variant built by a helper and loaded, one unplanned after serving (built by
    the urgent helper while the launch waits)."""
    session = planned_session(monkeypatch, JIT_AHEAD_STATS=str(tmp_path / "logs") + os.sep)
    try:
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=64)  # planned: Triton loads it from disk
        serve(session)
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=512)  # unplanned, after serving started
    finally:
        session.close()
    (path,) = (tmp_path / "logs").glob("jit_ahead_stats.*.jsonl")
    return path


def test_stats_log_has_every_event_with_phase_and_thread_and_a_summary(monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="jit_ahead")
    path = run_with_stats_log(monkeypatch, tmp_path)
    assert path.name == f"jit_ahead_stats.{os.getpid()}.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert all({"event", "time", "phase", "thread"} <= e.keys() for e in events)
    names = {e["event"] for e in events}
    assert {"variant", "queued", "helper_ready", "build_start", "build_finish", "executor_miss", "compile", "guard",
            "phase", "summary"} <= names
    compiles = [(e["phase"], e["cache_hit"], e["kernel"]) for e in events if e["event"] == "compile"]
    # the planned variant, then the unplanned one (built in a helper, not on the server's thread): disk hits
    assert compiles == [("startup", True, "add_kernel"), ("serving", True, "add_kernel")]
    builds = [(e["phase"], e["helper"], e["ok"]) for e in events if e["event"] == "build_finish"]
    assert builds == [("startup", "helper-0", True), ("serving", "helper-urgent", True)]
    assert all(e["seconds"] > 0 for e in events if e["event"] == "build_finish")
    (guard,) = [e for e in events if e["event"] == "guard"]  # still reported: it was not planned
    assert guard["phase"] == "serving" and "BLOCK: 64 -> 512" in guard["message"]
    summary = next(e for e in events if e["event"] == "summary")
    assert "executor compiles (serving)" not in summary and summary["built in helpers"] == 2
    assert any(r.getMessage().startswith("jit_ahead: planned") and "built in helpers 2" in r.getMessage()
               for r in caplog.records)


def test_guard_warns_naming_what_differs_from_the_nearest_planned_variant(monkeypatch, caplog):
    session = planned_session(monkeypatch, JIT_AHEAD_MODE="warn")
    try:
        serve(session)
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=64)  # planned: no warning
        assert not [r for r in caplog.records if "after serving started" in r.getMessage()]
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=512)
    finally:
        session.close()
    (warning,) = [r for r in caplog.records if "after serving started" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "add_kernel" in warning.getMessage() and "constexpr BLOCK: 64 -> 512" in warning.getMessage()


def test_guard_error_makes_the_launch_fail_after_serving_started(monkeypatch):
    session = planned_session(monkeypatch, JIT_AHEAD_MODE="error")
    try:
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=128)  # before serving: compiles, no error
        serve(session)
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=64)  # planned: fine
        half = torch.empty(4096, device="meta", dtype=torch.float16)
        with pytest.raises(JitAfterReadyError, match=r"arg x_ptr: \*fp32 -> \*fp16"):
            k.add_kernel[(1,)](half, X, X, 4096, BLOCK=64)
    finally:
        session.close()


def test_a_damaged_record_cannot_switch_the_guard_off(monkeypatch, tmp_path, caplog):
    # Records are data: a line whose specialization is not Triton's JSON must neither be replayed nor make
    # the guard's explanation fail, which let the unplanned launch compile with no error.
    from jit_ahead.core.records import RecordFolder
    from jit_ahead.triton.record import RecordedVariant, record_format

    fmt = record_format(("cuda", 90, 32))
    with capture() as recorded:
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=32)
    (good,) = recorded.requests
    folder = RecordFolder(tmp_path / "records", fmt, rank="rank0")
    folder.add([RecordedVariant(good)])
    folder.close()
    with open(folder.path, "a") as f:
        for spec in ("not json {", '{"signature": 5}', "[1, 2]"):
            f.write(json.dumps({**fmt.encode(RecordedVariant(good)), "spec": spec, "hash": "e" * 64}) + "\n")
    session = planned_session(monkeypatch, JIT_AHEAD_MODE="error", JIT_AHEAD_RECORD_DIR=str(tmp_path / "records"))
    try:
        assert session.families["triton"].wait_replay(120)
        serve(session)
        with pytest.raises(JitAfterReadyError, match="constexpr BLOCK: (32|64) -> 256"):
            k.add_kernel[(1,)](X, X, X, 4096, BLOCK=256)
    finally:
        session.close()
    assert any("3 unusable line(s)" in r.getMessage() for r in caplog.records)
    assert not any("miss handling failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["error", "warn"])
def test_a_failure_in_miss_handling_does_not_switch_the_guard_off(monkeypatch, caplog, mode):
    session = planned_session(monkeypatch, JIT_AHEAD_MODE=mode)
    try:
        serve(session)

        def broken(fn, compile, env=None):
            raise RuntimeError("a bug in jit_ahead's miss handling")

        monkeypatch.setattr("jit_ahead.triton.executor.request_from_hook", broken)
        if mode == "error":
            with pytest.raises(JitAfterReadyError, match="could not handle the miss .RuntimeError: a bug"):
                k.add_kernel[(1,)](X, X, X, 4096, BLOCK=1024)
        else:  # warn: the launch compiles the DSL's way, and the log says why
            k.add_kernel[(1,)](X, X, X, 4096, BLOCK=1024)
            assert any("miss handling failed" in r.getMessage() for r in caplog.records)
    finally:
        session.close()


SHARED_CACHE_SERVER = """
import sys, time
from jit_ahead.triton.standin import ensure_driver
ensure_driver()
import torch
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session
from jit_ahead.triton import capture
from tests.conftest import wait_all
from tests.kernels import basic as k
x = torch.empty(4096, device="meta", dtype=torch.float32)
with capture() as planned:
    for block in (16, 32, 64, 128, 256, 512):
        for warps in (1, 2, 4):
            k.add_kernel[(1,)](x, x, x, 4096, BLOCK=block, num_warps=warps)
session = Session(triton={"workers": 2}).start()
go = float(sys.argv[1])
while time.time() < go:  # every server queues the same variants at the same moment
    time.sleep(0.005)
wait_all(session.families["triton"].submit(planned, Priority.BACKGROUND), timeout=600)
session.close()
"""


def test_servers_sharing_one_cache_report_each_compile_once_across_their_logs(tmp_path):
    # before: a helper that found its variant built by another server (under the variant's lock) reported
    # it as built, and six servers' logs added up to 144 builds for 24 compiles
    import subprocess
    import sys
    import time

    from jit_ahead.report import analyse, read_events

    from .conftest import REPO

    logs, cache = tmp_path / "logs", tmp_path / "cache"
    logs.mkdir()
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), JIT_AHEAD_STATS=str(logs) + os.sep,
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    go = time.time() + 8
    servers = [subprocess.Popen([sys.executable, "-c", SHARED_CACHE_SERVER, str(go)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for server in servers:
        out, err = server.communicate(timeout=600)
        assert server.returncode == 0, err[-3000:]
    compiled = {p.parent.name for p in cache.rglob("*.cubin")}  # Triton's entries: one per variant compiled
    assert len(compiled) == 18
    built = found = 0
    for path in logs.iterdir():
        coverage = analyse(*read_events(path))
        built += sum(row.built_ahead for row in coverage.kernels.values())
        found += sum(row.found_built for row in coverage.kernels.values())
    assert built == len(compiled), (built, found)  # each compile reported once, by the server that made it
    # the servers raced: helpers found variants another server had compiled (a ticket taken after the entry
    # appeared is not built at all), and none of those counts as built
    assert 0 < found < 3 * len(compiled), (built, found)


def test_stats_log_path_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert stats_log_path("1", pid=7) == tmp_path / "jit_ahead_stats.7.jsonl"
    assert stats_log_path(str(tmp_path), pid=7) == tmp_path / "jit_ahead_stats.7.jsonl"
    assert stats_log_path(str(tmp_path / "run-{pid}.jsonl"), pid=7) == tmp_path / "run-7.jsonl"
    assert stats_log_path("0") is None and stats_log_path(None) is None


def test_an_unwritable_stats_log_is_one_error_line_and_no_log(monkeypatch, caplog):
    monkeypatch.setenv("JIT_AHEAD_STATS", "/proc/jit_ahead_cannot_write_here.jsonl")
    session = Session(triton={"workers": 0})
    try:
        assert session.stats_log is None
    finally:
        session.close()
    (error,) = [r for r in caplog.records if "JIT_AHEAD_STATS" in r.getMessage()]
    assert error.levelno == logging.ERROR and "running without a stats log" in error.getMessage()


def test_variant_differences_name_the_argument_and_the_option():
    half = torch.empty(4096, device="meta", dtype=torch.float16)
    with capture() as plan:
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=64)
        k.add_kernel[(1,)](X, X, X, 1, BLOCK=64)
        k.add_kernel[(1,)](half, X, X, 4095, BLOCK=64, num_warps=8)
    base, one, other = (r.specialization_data for r in plan.requests)
    assert differences(base, one) == ["arg n: i32 -> (none)", "constexpr n: (none) -> 1",
                                      "spec n: tt.divisibility=16 -> (none)"]
    assert differences(base, other) == ["arg x_ptr: *fp32 -> *fp16", "option num_warps: 4 -> 8",
                                        "spec n: tt.divisibility=16 -> (none)"]


def test_coverage_report_text_and_html_from_a_real_log(monkeypatch, tmp_path, capsys):
    from jit_ahead.cli import main

    path = run_with_stats_log(monkeypatch, tmp_path)
    with open(path, "a") as f:
        f.write("not json\n")  # a damaged line is skipped, not fatal
    page = tmp_path / "report.html"
    assert main(["report", str(path), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("tests.kernels.basic.add_kernel"))
    # kernel, planned by (no provider: submitted directly), planned, built ahead, failed, loaded, waits,
    # waited s, compiles warmup, s, compiles serving, s, unused
    # the unplanned variant: built ahead by the urgent helper (never loaded as a planned one), one wait
    assert row[1:8] == ["-", "1", "2", "0", "1", "1", row[7]] and row[10] == "0" and row[12] == "0", out
    assert "executor compiles after serving started: 0" in out
    assert "constexpr BLOCK: 64 -> 512" in out
    text = page.read_text()
    assert text.count("<svg") == 1 and 'fill="#4c9a2a"' in text and 'fill="#2980b9"' in text  # build, wait
    assert ">serving</text>" in text and "constexpr BLOCK: 64 -&gt; 512" in text


def test_compile_counter_counts_real_compiles_by_phase_and_chains_the_previous_listener():
    from triton import knobs

    from jit_ahead.demo_models import CompileCounter

    seen = []
    knobs.compilation.listener = lambda **kwargs: seen.append(kwargs["cache_hit"])
    counter = CompileCounter().install()
    try:
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=32)  # no session: Triton compiles it here
        counter.phase = "serving"
        k.add_kernel[(1,)](X, X, X, 4096, BLOCK=32)  # in-memory hit: no compile() at all
    finally:
        counter.uninstall()
        restored = knobs.compilation.listener
        knobs.compilation.listener = None
    assert counter.compiled == {"warmup": ["add_kernel"], "serving": []}
    assert seen == [False] and restored is not counter
