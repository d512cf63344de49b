"""The helper pool with the real Triton builder: order, deduplication, failures, crashes, isolation."""
import dataclasses
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

from jit_ahead.core import knobs
from jit_ahead.core.building.pool import HelperPool
from jit_ahead.core.priority import Priority
from jit_ahead.core.observing.stats import Stats
from jit_ahead.core.building.table import State
from jit_ahead.triton import capture
from jit_ahead.triton.family import SPEC

from .conftest import REPO, import_probe, wait_all
from .kernels import basic as k


def add_requests(blocks):
    x = torch.empty(4096, device="meta", dtype=torch.float32)
    with capture() as planned:
        for block in blocks:
            k.add_kernel[(1,)](x, x, x, 4096, BLOCK=block)
    return planned.requests


def make_pool(triton_cache, workers=1, **options) -> HelperPool:
    stats = Stats()
    events = []
    stats.subscribe(events.append)
    pool = HelperPool(SPEC, workers=workers, stats=stats, env_overrides={"TRITON_CACHE_DIR": str(triton_cache)},
                      **options)
    pool.events = events
    return pool


@pytest.fixture
def pools():
    made = []
    yield made
    for pool in made:
        pool.close()


def test_helpers_build_in_priority_order_and_a_raised_request_jumps_ahead(triton_cache, pools):
    pool = make_pool(triton_cache)
    pools.append(pool)
    r = add_requests([16, 32, 64, 128, 256, 512])
    tickets = [pool.submit(r[0].build_request(), Priority.BACKGROUND),
               pool.submit(r[1].build_request(), Priority.BACKGROUND),
               pool.submit(r[2].build_request(), Priority.REPLAY),
               pool.submit(r[3].build_request(), Priority.WARMUP),
               pool.submit(r[4].build_request(), Priority.URGENT),
               pool.submit(r[5].build_request(), Priority.BACKGROUND)]
    pool.submit(r[1].build_request(), Priority.WARMUP)  # raised: ahead of r[3], which came first at WARMUP
    pool.start()
    assert all(res.ok for res in wait_all(tickets))
    started = [e["key"] for e in pool.events if e["event"] == "build_start"]
    # Within a level, first come first served: r[3] was at WARMUP before r[1] was raised to it.
    assert started == [r[i].predicted_hash for i in (4, 3, 1, 2, 0, 5)]


def test_duplicate_requests_build_once(triton_cache, pools):
    pool = make_pool(triton_cache, workers=2)
    pools.append(pool)
    pool.start()
    requests = add_requests([16, 32, 64])
    tickets = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in requests * 3]
    wait_all(tickets)
    assert len({id(t) for t in tickets}) == 3
    assert sum(e["event"] == "build_finish" for e in pool.events) == 3


def test_compile_and_import_errors_fail_only_their_request(triton_cache, pools, caplog):
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    pool = make_pool(triton_cache)
    pools.append(pool)
    pool.start()
    x = torch.empty(256, device="meta", dtype=torch.float32)
    with capture() as planned:
        k.broken_kernel[(1,)](x, BLOCK=256)
    (broken,) = planned.requests
    (good,) = add_requests([32])
    missing = dataclasses.replace(good, module="tests.kernels.no_such_module", predicted_hash="f" * 64)
    tickets = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in (broken, missing, good)]
    results = wait_all(tickets)
    assert [r.ok for r in results] == [False, False, True]
    assert "undefined_name" in results[0].error
    assert "ModuleNotFoundError" in results[1].error
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "undefined_name" in logged and "no_such_module" in logged
    assert {r.builder for r in results} == {"helper-0"}  # one helper slot served all three, none crashed
    assert not any(e["event"] == "helper_crash" for e in pool.events)


def test_a_hash_mismatch_is_an_error_with_both_hashes(triton_cache, pools, caplog):
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    pool = make_pool(triton_cache)
    pools.append(pool)
    pool.start()
    (good,) = add_requests([64])
    wrong = dataclasses.replace(good, predicted_hash="0" * 64)
    (result,) = wait_all([pool.submit(wrong.build_request(), Priority.BACKGROUND)])
    assert not result.ok and "HashMismatch" in result.error
    assert good.predicted_hash in result.error and "0" * 64 in result.error
    assert any("0" * 64 in r.getMessage() for r in caplog.records)


def test_a_request_that_kills_helpers_twice_is_quarantined(triton_cache, pools, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_TEST_CRASH", "1")  # helpers that import tests.kernels.crasher die
    from .kernels import crasher

    x = torch.empty(64, device="meta", dtype=torch.float32)
    with capture() as planned:
        crasher.crash_kernel[(1,)](x, BLOCK=64)
    (deadly,) = planned.requests
    (good,) = add_requests([128])
    # a fork server of its own interpreter: a fork of this process has the module imported already
    pool = make_pool(triton_cache, backoff_initial=0.05, start_mode="fork")
    pools.append(pool)
    pool.preload([deadly.module])  # the first helper dies preloading it; it is not preloaded again
    bad_ticket = pool.submit(deadly.build_request(), Priority.URGENT)
    good_ticket = pool.submit(good.build_request(), Priority.BACKGROUND)
    pool.start()
    assert bad_ticket.wait(120) is State.QUARANTINED and bad_ticket.crashes == 2
    assert good_ticket.wait(120) is State.DONE  # the pool goes on after respawning
    assert sum(e["event"] == "helper_crash" for e in pool.events) == 2
    assert any("quarantined" in r.getMessage() for r in caplog.records)
    assert any("died while preloading" in r.getMessage() for r in caplog.records)


def test_helpers_are_isolated_niced_and_use_pipes_only(triton_cache, pools, monkeypatch):
    for name, value in {"OMPI_COMM_WORLD_RANK": "3", "SLURM_PROCID": "1", "RANK": "3",
                        "MASTER_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": "0"}.items():
        monkeypatch.setenv(name, value)
    pool = make_pool(triton_cache)
    pools.append(pool)
    pool.start()
    (ticket,) = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in add_requests([32])]
    assert ticket.wait(120) is State.DONE
    ready = [e for e in pool.events if e["event"] == "helper_ready"]
    info = ready[-1]["info"]
    assert info["nice"] == 19 and info["cuda_visible_devices"] == "" and info["launcher_vars"] == []
    assert info["cache_dir"] == str(triton_cache) and os.path.isabs(info["cache_dir"])
    assert info["thread_pools"] == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    helper = psutil.Process(pool.helper_pids()["helper-0"])
    assert helper.net_connections(kind="inet") == [] and helper.net_connections(kind="unix") == []
    assert helper.cmdline()[0] == psutil.Process().exe() or helper.exe() == psutil.Process().exe()
    pool.close()
    assert not psutil.pid_exists(helper.pid) or helper.status() == psutil.STATUS_ZOMBIE


def test_bad_knob_values_log_and_fall_back(monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_TRITON_WORKERS", "lots")
    monkeypatch.setenv("JIT_AHEAD_WAIT_TIMEOUT_S", "-3")
    assert knobs.worker_count("JIT_AHEAD_TRITON_WORKERS") == knobs.default_worker_count()
    assert knobs.wait_timeout_s() == 120.0
    messages = [r.getMessage() for r in caplog.records]
    assert any("JIT_AHEAD_TRITON_WORKERS='lots'" in m and "default" in m for m in messages)
    assert any("JIT_AHEAD_WAIT_TIMEOUT_S='-3'" in m for m in messages)
    monkeypatch.setenv("JIT_AHEAD_TRITON_WORKERS", "0")
    assert knobs.worker_count("JIT_AHEAD_TRITON_WORKERS") == 0


def test_default_workers_share_the_cpus_among_local_ranks(monkeypatch):
    monkeypatch.setattr(knobs, "usable_cpus", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert knobs.default_worker_count() == 15
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert knobs.default_worker_count() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert knobs.default_worker_count() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8(x2)")
    assert knobs.default_worker_count() == 1


def test_a_helper_that_cannot_start_is_reported(triton_cache, pools, caplog):
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    pool = make_pool(triton_cache, python="/bin/false", backoff_initial=0.01, max_start_failures=2,
                     start_timeout=5, start_mode="spawn")
    pools.append(pool)
    pool.submit(add_requests([256])[0].build_request(), Priority.BACKGROUND)  # helpers start for queued work
    pool.start()
    deadline = time.monotonic() + 30
    while pool.may_get_helpers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pool.may_get_helpers()
    assert any("failed to start" in r.getMessage() for r in caplog.records)
    assert any("starts failed in a row" in r.getMessage() for r in caplog.records)


def test_forked_helpers_share_one_import_of_the_preloaded_modules(triton_cache, pools, tmp_path, monkeypatch):
    probe, marker = import_probe(tmp_path, monkeypatch)
    pool = make_pool(triton_cache, workers=2)
    pools.append(pool)
    pool.preload([probe])
    pool.start()
    tickets = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in add_requests([16, 32, 64, 128])]
    assert all(t.wait(120) is State.DONE for t in tickets)
    (server,) = [e for e in pool.events if e["event"] == "forkserver_ready"]
    assert server["info"]["nice"] == 19 and server["info"]["cuda_visible_devices"] == ""
    assert marker.read_text().split() == [str(server["pid"])]  # imported once, by the fork server
    ready = [e for e in pool.events if e["event"] == "helper_ready"]
    assert len(ready) >= 2 and all(e["info"]["forked_from"] == server["pid"] for e in ready)
    assert {t.result.builder for t in tickets} <= {"helper-0", "helper-1"}
    # Helpers with nothing left to build exit; a module preloaded later is imported by the fork server
    # before the next helper is forked from it.
    deadline = time.monotonic() + 30
    while pool.live_helpers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.live_helpers() == 0
    pool.preload(["json"])
    (later,) = add_requests([256])
    assert pool.submit(later.build_request(), Priority.BACKGROUND).wait(120) is State.DONE
    # The probe, then the kernels' own module (named by the first jobs, imported once), then json.
    assert [e["modules"] for e in pool.events if e["event"] == "forkserver_preloaded"] == [1, 1, 1]
    assert not any(e["event"] == "helper_preloaded" for e in pool.events)
    assert [e["pid"] for e in pool.events if e["event"] == "forkserver_ready"] == [server["pid"]]
    pids = [*pool.helper_pids().values(), server["pid"]]
    pool.close()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


HALF_IMPORTED = """
import os, time
import triton
import triton.language as tl


@triton.jit
def late_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


# Only in the test's own process: the import stops here until the test lets it finish.
while os.getpid() == {pid} and not os.path.exists({release!r}):
    time.sleep(0.01)
"""


def test_a_module_another_thread_is_importing_at_the_fork_is_imported_afresh_in_helpers(
        triton_cache, pools, tmp_path, monkeypatch):
    # A server goes on importing while the pool forks the fork server from it. The module lock of an
    # import in progress is held, in the fork, by a thread that does not exist there: a helper importing
    # that module to build its kernel waited forever (a CI run's helper hung 600 s on the basic kernel).
    release = tmp_path / "release"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "tests_half_imported.py").write_text(
        HALF_IMPORTED.format(pid=os.getpid(), release=str(release)))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    importer = threading.Thread(target=importlib.import_module, args=("tests_half_imported",), daemon=True)
    importer.start()
    deadline = time.monotonic() + 60
    while not hasattr(sys.modules.get("tests_half_imported"), "late_kernel"):
        assert time.monotonic() < deadline and importer.is_alive()
        time.sleep(0.01)
    try:
        x = torch.empty(64, device="meta", dtype=torch.float32)
        with capture() as planned:
            sys.modules["tests_half_imported"].late_kernel[(1,)](x, 64, BLOCK=64)
        pool = make_pool(triton_cache, build_timeout=60)  # the fork server is forked mid-import
        pools.append(pool)
        pool.start()
        ticket = pool.submit(planned.requests[0].build_request(), Priority.BACKGROUND)
        assert ticket.wait(240) is State.DONE, ticket.result and ticket.result.error
        assert ticket.result.builder == "helper-0"
        assert importer.is_alive()  # the import the helpers did not wait for is still under way here
    finally:
        release.touch()
        importer.join(60)
    assert not importer.is_alive()


def test_a_killed_fork_server_is_replaced_and_builds_go_on(triton_cache, pools):
    pool = make_pool(triton_cache, workers=1, backoff_initial=0.05)
    pools.append(pool)
    pool.start()
    first, second = add_requests([16, 32])
    assert pool.submit(first.build_request(), Priority.BACKGROUND).wait(120) is State.DONE
    (server,) = [e["pid"] for e in pool.events if e["event"] == "forkserver_ready"]
    (helper,) = pool.helper_pids().values()
    psutil.Process(server).kill()
    psutil.Process(helper).wait(10)  # a forked helper follows its fork server (it watches its parent)
    # The slot starts a new fork server and a new helper from it.
    assert pool.submit(second.build_request(), Priority.BACKGROUND).wait(120) is State.DONE
    servers = [e["pid"] for e in pool.events if e["event"] == "forkserver_ready"]
    assert len(servers) == 2 and servers[0] == server
    assert helper not in pool.helper_pids().values()


def test_spawn_mode_starts_each_helper_as_its_own_interpreter(triton_cache, pools):
    pool = make_pool(triton_cache, workers=1, start_mode="spawn")
    pools.append(pool)
    pool.start()
    (ticket,) = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in add_requests([32])]
    assert ticket.wait(120) is State.DONE
    assert not any(e["event"].startswith("forkserver") for e in pool.events)
    (helper,) = pool.helper_pids().values()
    assert psutil.Process(helper).ppid() == os.getpid()


def test_once_serving_starts_helpers_beyond_serving_workers_stop_and_the_rest_finish_the_queue(triton_cache, pools):
    pool = make_pool(triton_cache, workers=2, serving_workers=1)
    pools.append(pool)
    x = torch.empty(1024, device="meta", dtype=torch.float32)
    with capture() as planned:
        for steps in range(2, 14):  # builds of up to a few seconds each on a CPU
            k.slow_kernel.warmup(x, STEPS=steps, BLOCK=256, grid=(1,))
    tickets = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in planned.requests]
    pool.start()
    while sum(e["event"] == "build_start" for e in pool.events) < 2:  # both helpers are building
        time.sleep(0.01)
    pool.retire_when_idle()
    assert all(t.wait(300) is State.DONE for t in tickets)  # nothing queued is dropped
    events = list(pool.events)
    first_retired = next(i for i, e in enumerate(events) if e["event"] == "helper_retired")
    assert events[first_retired]["helper"] == "helper-1"  # it stopped after its build; the queue was not empty
    later = [e["helper"] for e in events[first_retired:] if e["event"] == "build_start"]
    assert later and set(later) == {"helper-0"}


def test_a_helper_whose_server_is_gone_stops_quietly():
    # a server that exits or crashes closes its end of the pipes; a helper answering a message then gets
    # EPIPE, and stops without a traceback of its own next to the server's
    from jit_ahead.core.building.protocol import Preload, write_message
    from jit_ahead_helpers import worker

    inbox_r, inbox_w = os.pipe()
    outbox_r, outbox_w = os.pipe()
    with os.fdopen(inbox_w, "wb", buffering=0) as to_helper:
        write_message(to_helper, Preload(("json",)))
    os.close(outbox_r)
    with os.fdopen(inbox_r, "rb", buffering=0) as inbox, os.fdopen(outbox_w, "wb", buffering=0) as outbox:
        assert worker.serve(inbox, outbox, builder=None) == 0


def test_a_fork_server_silent_past_its_start_timeout_is_killed_and_reaped(tmp_path):
    # A fork server that never answers its handshake (hung in an import, stopped): killed after the start
    # timeout and waited for, so it is neither left running nor left a zombie child of the server.
    from jit_ahead.core.building.forkserver import ForkServer, ForkServerGone
    from jit_ahead.core.building.helper_env import helper_environment
    from jit_ahead.core.building.protocol import Configure

    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    server = ForkServer(python=str(silent), env=helper_environment(os.environ, {}), start_timeout=1.0,
                        build_timeout=5.0)
    with pytest.raises(ForkServerGone, match="no reply"):
        server.start(Configure(sys_path=tuple(sys.path), builder="jit_ahead.triton.build", device_view=None))
    pid = server.process.pid
    assert not os.path.exists(f"/proc/{pid}") or psutil.Process(pid).ppid() != os.getpid()  # gone: reaped


def test_by_default_the_fork_server_is_a_fork_of_this_process_and_a_fresh_one_once_serving(triton_cache, pools):
    pool = make_pool(triton_cache, workers=1)
    pools.append(pool)
    pool.start()
    (first, second) = add_requests([16, 32])
    assert pool.submit(first.build_request(), Priority.BACKGROUND).wait(120) is State.DONE
    (server,) = [e for e in pool.events if e["event"] == "forkserver_ready"]
    assert server["info"]["forked_from_server"] is True and server["info"]["nice"] == 19
    assert psutil.Process(server["pid"]).ppid() == os.getpid()
    # it has what this process imported: the kernels' module needed no import of its own
    (preloaded,) = [e for e in pool.events if e["event"] == "forkserver_preloaded"]
    assert preloaded["seconds"] < 0.5
    # once serving started, a new fork server is a fresh interpreter: no fork of the serving process
    pool.retire_when_idle()
    deadline = time.monotonic() + 30  # its helper exits once idle (it would outlive a dead fork server)
    while pool.live_helpers() and time.monotonic() < deadline:
        time.sleep(0.05)
    psutil.Process(server["pid"]).kill()
    assert pool.submit(second.build_request(), Priority.BACKGROUND).wait(120) is State.DONE
    later = [e for e in pool.events if e["event"] == "forkserver_ready"][1:]
    assert later and later[0]["info"]["forked_from_server"] is False


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400", "86401", "-1"])
def test_durations_no_wait_can_take_are_refused_with_one_line_and_the_default(monkeypatch, caplog, value):
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    for name in ("JIT_AHEAD_WAIT_TIMEOUT_S", "JIT_AHEAD_BUILD_TIMEOUT_S", "JIT_AHEAD_WARMUP_S"):
        monkeypatch.setenv(name, value)
    assert knobs.wait_timeout_s() == 120.0
    assert knobs.build_timeout_s() == 600.0
    assert knobs.env_seconds("JIT_AHEAD_WARMUP_S", 300.0) == 300.0  # as autostart reads it
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all(repr(value) in line and "using the default" in line for line in lines), lines


def test_a_count_written_other_than_in_plain_digits_is_refused_not_read_as_another_number(monkeypatch, caplog):
    # Python's int() reads "1_000" as 1000 and Arabic-Indic digits as digits: a knob refuses both with its line
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    monkeypatch.setattr(knobs, "usable_cpus", lambda: 4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for raw in ("1_000", "\u0663", "0x10", "2.0"):
        monkeypatch.setenv("JIT_AHEAD_PLANNERS", raw)
        caplog.clear()
        assert knobs.planner_count() == knobs.default_worker_count() == 3
        assert [r.getMessage() for r in caplog.records if repr(raw) in r.getMessage()], raw
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", " +2 ")
    assert knobs.planner_count() == 2
    # a default worked out later is named as such, not as the -1 that stands for it
    monkeypatch.setenv("JIT_AHEAD_TUNE_AHEAD_MEMORY_MB", "lots")
    caplog.clear()
    assert knobs.tune_ahead_budget_bytes(16 << 30) == 1 << 30
    (line,) = [r.getMessage() for r in caplog.records]
    assert "using the default (a sixteenth of the free GPU memory)" in line and "-1" not in line
    monkeypatch.setenv("JIT_AHEAD_WAIT_TIMEOUT_S", "1_0")
    assert knobs.wait_timeout_s() == 120.0
    for raw, seconds in (("2.5", 2.5), ("1e1", 10.0), (".5", 0.5)):
        monkeypatch.setenv("JIT_AHEAD_WAIT_TIMEOUT_S", raw)
        assert knobs.wait_timeout_s() == seconds


def test_process_counts_beyond_the_cpus_are_capped_with_a_warning(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setattr(knobs, "usable_cpus", lambda: 4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("JIT_AHEAD_TRITON_WORKERS", "100000")
    monkeypatch.setenv("JIT_AHEAD_SERVING_WORKERS", "64")
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "64")
    assert knobs.worker_count("JIT_AHEAD_TRITON_WORKERS") == knobs.default_worker_count()  # beyond any bound
    assert knobs.serving_worker_count() == 4
    assert knobs.planner_count() == 4  # each planner is a fork of the server: no more than the CPUs either
    monkeypatch.setenv("JIT_AHEAD_SERVING_PLANNERS", "64")
    assert knobs.serving_planner_count() == 4
    lines = [r.getMessage() for r in caplog.records]
    assert any("JIT_AHEAD_PLANNERS=64 is more than the 4 CPUs" in m and "using 4" in m for m in lines), lines
    assert any("JIT_AHEAD_SERVING_PLANNERS=64 is more than the 4 CPUs" in m for m in lines), lines
    assert any("JIT_AHEAD_TRITON_WORKERS='100000'" in m for m in lines)
    assert any("JIT_AHEAD_SERVING_WORKERS=64 is more than the 4 CPUs" in m and "using 4" in m for m in lines), lines
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # more ranks than CPUs: still one helper, not none
    monkeypatch.setenv("JIT_AHEAD_TRITON_WORKERS", "3")
    assert knobs.worker_count("JIT_AHEAD_TRITON_WORKERS") == 1


def test_absurd_limits_from_the_environment_are_refused(monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_MAX_NUM_TOKENS", str(10**12))
    monkeypatch.setenv("JIT_AHEAD_CUDA_GRAPH_SIZES", "1,2,999999999")
    limits = knobs.engine_limits()
    assert limits.max_num_tokens == 8192 and limits.cuda_graph_batch_sizes == (1, 2, 4, 8, 16)
    assert len(caplog.records) == 2


@pytest.mark.parametrize("options", [{"workers": -3}, {"workers": 100000}, {"workers": 1.5},
                                     {"serving_workers": -1}, {"build_timeout": float("inf")},
                                     {"build_timeout": float("nan")}, {"start_timeout": 0}])
def test_absurd_pool_arguments_raise_a_clear_error(options):
    with pytest.raises(ValueError, match=next(iter(options))):
        HelperPool(SPEC, **{"workers": 1, **options}, stats=Stats())


def test_an_explicit_wait_timeout_no_wait_can_take_raises():
    for value in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="wait_timeout"):
            knobs.wait_timeout_s(value)
    assert knobs.wait_timeout_s(2) == 2.0


def slow_requests(steps_list):
    x = torch.empty(1024, device="meta", dtype=torch.float32)
    with capture() as planned:
        for steps in steps_list:
            k.slow_kernel.warmup(x, STEPS=steps, BLOCK=1024, grid=(1,))
    return planned.requests


def test_a_fork_server_killed_while_its_helper_builds_charges_nothing_to_the_build(triton_cache, pools):
    # Its helpers died with it (parent-death signal): the healthy variant being built was charged with
    # a crash ("killed by SIGKILL"), and a second kill quarantined it.
    pool = make_pool(triton_cache, workers=1, backoff_initial=0.05)
    pools.append(pool)
    (slow, later) = slow_requests([14, 15])
    ticket = pool.submit(slow.build_request(), Priority.BACKGROUND)
    pool.start()
    deadline = time.monotonic() + 120
    while not any(e["event"] == "build_start" for e in pool.events):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (server,) = [e for e in pool.events if e["event"] == "forkserver_ready"]
    psutil.Process(server["pid"]).kill()
    assert ticket.wait(240) is State.DONE and ticket.crashes == 0
    assert ticket.result.builder == "helper-0"
    assert not [e for e in pool.events if e["event"] == "helper_crash"]
    # the helper goes on building for the pool; a new fork server comes when a new helper is needed
    assert pool.submit(later.build_request(), Priority.BACKGROUND).wait(240) is State.DONE


def test_a_helper_killed_while_idle_charges_nothing_to_the_next_request_it_is_given(triton_cache, pools, caplog):
    # before: each idle helper's death was charged to the next request as a crash (6 of 6), and with one
    # real crash an innocent variant was quarantined
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    pool = make_pool(triton_cache, workers=1, backoff_initial=0.05)
    pools.append(pool)
    requests = add_requests([16, 32, 64, 128, 256])
    first = pool.submit(requests[0].build_request(), Priority.BACKGROUND)
    pool.start()
    assert first.wait(120) is State.DONE
    for request in requests[1:]:
        idle = [e for e in pool.events if e["event"] == "helper_ready"][-1]["pid"]
        os.kill(idle, signal.SIGKILL)  # the helper that built the last one waits for work
        ticket = pool.submit(request.build_request(), Priority.BACKGROUND)
        assert ticket.wait(120) is State.DONE and ticket.crashes == 0
    assert not [e for e in pool.events if e["event"] == "helper_crash"]
    # a helper that dies in a build is still charged (test_a_request_that_kills_helpers_twice_is_quarantined)


def test_a_module_that_kills_the_fork_server_is_the_only_one_not_preloaded(triton_cache, pools, tmp_path,
                                                                            monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_TEST_CRASH", "1")
    probe, marker = import_probe(tmp_path, monkeypatch)
    pool = make_pool(triton_cache, workers=1, backoff_initial=0.05, start_mode="fork")
    pools.append(pool)
    pool.preload([probe, "tests.kernels.crasher", "json"])
    pool.start()
    (good,) = add_requests([128])
    assert pool.submit(good.build_request(), Priority.BACKGROUND).wait(120) is State.DONE
    died = [r.getMessage() for r in caplog.records if "died while preloading" in r.getMessage()]
    assert len(died) == 1 and "tests.kernels.crasher" in died[0] and probe not in died[0], died
    servers = [e["pid"] for e in pool.events if e["event"] == "forkserver_ready"]
    assert len(servers) == 2
    # both fork servers imported the probe: the second one was not told to leave it out
    assert sorted(marker.read_text().split()) == sorted(map(str, servers))


def test_requests_that_crash_helpers_hold_up_other_builds_only_briefly(triton_cache, pools, monkeypatch):
    # Each crash doubled the slot's backoff (to 30 s): after a few crashing requests a healthy build
    # queued behind them waited for minutes. A crash charged to a request now restarts after the initial
    # backoff; the growing backoff is for helpers that die starting up.
    monkeypatch.setenv("JIT_AHEAD_TEST_CRASH", "1")
    from .kernels import crasher

    x = torch.empty(1024, device="meta", dtype=torch.float32)
    with capture() as planned:
        for block in (64, 128, 256, 512):
            crasher.crash_kernel[(1,)](x, BLOCK=block)
    pool = make_pool(triton_cache, workers=1, start_mode="fork")  # the default backoff: 0.5 s, up to 30 s
    pools.append(pool)
    tickets = [pool.submit(r.build_request(), Priority.URGENT) for r in planned.requests]
    (good,) = add_requests([64])
    good_ticket = pool.submit(good.build_request(), Priority.BACKGROUND)
    t0 = time.monotonic()
    pool.start()
    assert good_ticket.wait(240) is State.DONE
    waited = time.monotonic() - t0
    assert all(t.state is State.QUARANTINED for t in tickets)
    crashes = sum(e["event"] == "helper_crash" for e in pool.events)
    assert crashes == 8
    # eight restarts at the initial backoff and the builds themselves; doubling would be 0.5+1+...+30 s
    assert waited < 30.0, waited


def test_closing_starts_no_helper_and_leaves_none(triton_cache, pools):
    # Closing with work still queued: the slots must not start helpers for it (a short process paid for
    # helpers started while it closed).
    pool = make_pool(triton_cache, workers=2)
    pools.append(pool)
    requests = add_requests([16, 32, 64, 128, 256, 512, 1024, 2048])
    for r in requests:
        pool.submit(r.build_request(), Priority.BACKGROUND)
    pool.start()
    deadline = time.monotonic() + 120
    while not any(e["event"] == "build_start" for e in pool.events):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    closing = len(pool.events)
    pids = [*pool.helper_pids().values()]
    pool.close(grace=1.0)
    after = [e["event"] for e in pool.events[closing:]]
    assert not {"helper_ready", "forkserver_ready"} & set(after), after
    assert pool.table.counts()["queued"] > 0  # there was work left that a new helper could have taken
    assert pool.live_helpers() == 0
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


PID_LIMITED = """
import json, logging, os, sys, time
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")
cgroup = sys.argv[1]
with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
from tests.test_pool import add_requests, make_pool
from jit_ahead.core.priority import Priority

cache = sys.argv[2]
requests = add_requests([16, 32, 64])
pool = make_pool(cache, workers=2, backoff_initial=0.05)
pool.start()
time.sleep(0.5)
with open(os.path.join(cgroup, "pids.current")) as f:
    current = f.read().strip()
with open(os.path.join(cgroup, "pids.max"), "w") as f:  # not one more thread or process
    f.write(current)
tickets = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in requests]
t0 = time.monotonic()
while not pool.builds_nothing() and time.monotonic() - t0 < 60:
    time.sleep(0.1)
print("RESULT", json.dumps({"builds_nothing": pool.builds_nothing(), "seconds": time.monotonic() - t0}), flush=True)
with open(os.path.join(cgroup, "pids.max"), "w") as f:
    f.write("max")
pool.close()
"""


def _pids_cgroup(tmp_path):
    root = "/sys/fs/cgroup/pids"
    if not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup v1 pids controller on this machine")
    path = os.path.join(root, f"jit_ahead_test_{os.getpid()}_{tmp_path.name}"[:100])
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip(f"cannot make a pids cgroup here ({exc})")
    return path


def test_at_a_process_limit_the_pool_gives_up_in_a_few_lines_and_misses_build_in_place(triton_cache, tmp_path):
    # Under a pid limit, each slot's thread died on "can't start new thread" with a traceback, and the
    # pool never said it would build nothing: launches and wait_ready waited for helpers that could not
    # come. Now the slots' threads start with the first request (here, under the limit): the submit
    # succeeds, one line says the slots could not start, and builds_nothing() turns True.
    import json
    import subprocess
    import sys

    from .conftest import REPO

    cgroup = _pids_cgroup(tmp_path)
    try:
        done = subprocess.run([sys.executable, "-c", PID_LIMITED, cgroup, str(triton_cache)], cwd=REPO,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            left = f.read().split()
        for pid in left:  # back to the root group, so the cgroup can go
            with open("/sys/fs/cgroup/pids/cgroup.procs", "w") as f:
                f.write(pid)
        os.rmdir(cgroup)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["builds_nothing"] is True and result["seconds"] < 30, result
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("jit_ahead")]
    assert len(ours) == 1 and "2 of 2 helper slots could not start" in ours[0], ours


ORPHAN_PROBE = r"""
import ctypes, json, os, signal, subprocess, sys, time
from jit_ahead.core.building.forkserver import ForkServer
from jit_ahead.core.building.helper_env import helper_environment
from jit_ahead.core.building.protocol import Configure, Ready, read_message

# this process adopts orphans (as init would) and so decides when the helper's pid is free again
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
server = ForkServer(python=sys.executable, env=helper_environment(os.environ, {}), start_timeout=120,
                    build_timeout=120)
server.start(Configure(sys_path=tuple(sys.path), builder="jit_ahead.triton.build"))
helper, to_helper, from_helper = server.fork("helper-0")
assert isinstance(read_message(from_helper), Ready)
server.process.kill()  # the fork server dies: the helper is orphaned, reparented to this process
server.process.wait()
while server.alive:
    time.sleep(0.01)
pid = helper.pid
os.kill(pid, signal.SIGKILL)
deadline = time.monotonic() + 30
while True:  # reap it here, as init would: its pid is free
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            break
    except ChildProcessError:
        break
    assert time.monotonic() < deadline, "the orphaned helper was not reaped"
    time.sleep(0.01)
stranger = None
for _ in range(50):  # another process takes the pid (the next pid the kernel gives is pid)
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    candidate = subprocess.Popen(["sleep", "60"])
    if candidate.pid == pid:
        stranger = candidate
        break
    candidate.kill(); candidate.wait()
assert stranger is not None, "could not give the pid to another process"
helper.kill()  # the pool stopping the helper it knows, as it does on close
time.sleep(0.2)
alive = stranger.poll() is None
stranger.kill(); stranger.wait()
print(json.dumps({"stranger_alive": alive, "helper_returncode": helper.poll()}))
"""


@pytest.mark.skipif(not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK),
                    reason="needs root and a writable /proc/sys/kernel/ns_last_pid to give a pid to another process")
def test_an_orphaned_helper_whose_pid_went_to_another_process_is_never_signalled():
    # After its fork server died, a forked helper is reaped by whoever adopted it, and its pid may be given
    # to an unrelated process. Stopping "the helper" then killed that process (the pid was all the pool had).
    out = subprocess.run([sys.executable, "-c", ORPHAN_PROBE], capture_output=True, text=True, timeout=300,
                         cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"stranger_alive": True, "helper_returncode": -9}


DETACHED = """
import json, os
from jit_ahead.core.processes import detach_descriptors
device = os.open("/dev/zero", os.O_RDONLY)  # a character device, as a GPU driver's /dev/nvidia* are
pipe_read, pipe_write = os.pipe()
report_read, report_write = os.pipe()
pid = os.fork()
if pid == 0:
    detach_descriptors(keep=(report_write,))
    os.write(report_write, json.dumps({fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (device, pipe_write)}).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps(list(json.loads(os.read(report_read, 4096)).values())))
"""


def test_a_forked_process_keeps_the_servers_devices_and_lets_go_of_its_pipes():
    # A GPU driver's descriptors pointed at /dev/null make NVML fail in a planner forked from a vLLM worker
    # (results/2026-12-07-h100-transformers-serve-and-nvml-probe/); a pipe's end kept would hold a reader
    # of the server's waiting.
    out = subprocess.run([sys.executable, "-c", DETACHED], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == ["/dev/zero", "/dev/null"]
