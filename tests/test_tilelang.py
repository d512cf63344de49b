"""The TileLang family: TileLang kernels of our own (tests/kernels/tilelang_rows.py) captured without
lowering, built for sm_90a by real CPU-only helpers into TileLang's own cache, and found there by the
server's TileLang calls; nothing of TileLang or the pool is mocked."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from jit_ahead.core.building.executor import JitAfterReadyError
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session
from jit_ahead.core.building.table import State
from jit_ahead.providers.tilelang_calls import TileLangTokenCalls
from jit_ahead.report import analyse, read_events
from jit_ahead.tilelang import build, hook
from jit_ahead.tilelang.plan import calls_go_on, capture, plan_call
from jit_ahead.tilelang.request import legal_out_idx

from .conftest import REPO, helper_running, without_jit_ahead
from .kernels.tilelang_rows import TARGET, SplitRowSums, scale_rows, split_count, split_row_sums


@pytest.fixture(autouse=True)
def tilelang_cache(tmp_path, monkeypatch):
    """Each test gets an empty TileLang cache (TileLang reads the variable at each use) and empty in-memory
    caches: the decorators' own and the kernel caches'."""
    cache = tmp_path / "tilelang-cache"
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(cache))
    for impl in (scale_rows, split_row_sums):
        impl.out_idx = [-1]  # as declared: TileLang's adapter rewrites the decorator's list in place
    clear_memory_caches()
    return cache


def entries() -> list[str]:
    root = build.entry_root()
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def tilelang_session(**options) -> Session:
    return Session(families=("tilelang",), tilelang=options).start()


def wait_settled(tickets, timeout=300.0) -> None:
    deadline = time.monotonic() + timeout
    for ticket in tickets:
        ticket.wait(max(0.0, deadline - time.monotonic()))
    assert all(t.state is State.DONE for t in tickets), [(t.request.label, t.state, t.result) for t in tickets]


def compiled_once_in_a_session(rows: int, splits: int) -> list[dict]:
    """``split_row_sums(rows, splits)`` called once in a session without helpers: the events it saw."""
    session = tilelang_session(workers=0)
    events = []
    session.stats.subscribe(events.append)
    try:
        assert split_row_sums(rows, splits) is not None
    finally:
        session.close()
    return events


def clear_memory_caches() -> None:
    from tilelang.cache import _dispatch_map

    for impl in (scale_rows, split_row_sums):
        impl._kernel_cache.clear()
        impl._call_form_cache.clear()
    for kernel_cache in _dispatch_map.values():
        kernel_cache._memory_cache.clear()


def test_out_idx_is_made_legal_as_tilelangs_own_adapter_makes_it_when_it_loads_a_kernel():
    # TileLang's adapter rewrites the decorator's out_idx list in place when it loads a kernel from disk: from
    # then on the process computes other keys for that decorator's kernels (see the warm-start test below).
    func = scale_rows.get_tir(128)
    expected = legal_out_idx(func, [-1])
    scale_rows(128)  # TileLang alone, compiled: the list stays as declared
    assert scale_rows.out_idx == [-1]
    clear_memory_caches()
    scale_rows(128)  # loaded from disk: the adapter rewrites it
    assert scale_rows.out_idx == expected == [1]
    assert legal_out_idx(func, -1) == -1  # an int is keyed as given (the adapter makes a new list of it)


WARM_START = """
import sys
if sys.argv[1] == "jit_ahead":
    from jit_ahead.session import Session
    Session(families=("tilelang",), tilelang={"workers": 0}).start()
from tests.kernels.tilelang_rows import split_row_sums
for n_splits in (1, 2, 4):
    split_row_sums(256, n_splits)
"""


def test_a_warm_start_compiles_nothing_with_jit_ahead_where_tilelang_alone_compiles_again(tmp_path):
    # TileLang 0.1.15 alone: the first kernel a start loads from disk rewrites the decorator's out_idx, the
    # others are looked up under other keys and compiled again. With jit_ahead the keys never change.
    compiled = {}
    for arm in ("tilelang", "jit_ahead"):
        env = {**os.environ, "TILELANG_CACHE_DIR": str(tmp_path / arm)}
        compiled[arm] = [subprocess.run([sys.executable, "-c", WARM_START, arm], cwd=REPO, env=env, text=True,
                                        capture_output=True, timeout=300).stdout.count("begins to compile")
                         for _ in ("cold", "warm")]
    assert compiled == {"tilelang": [3, 2], "jit_ahead": [3, 0]}


def test_a_planned_key_is_the_key_tilelang_files_its_own_compile_under():
    with capture() as plan:  # nothing is lowered: the call raises once its request is recorded
        for n_splits in (1, 2):
            with pytest.raises(hook.Captured):
                split_row_sums(256, n_splits)
    assert len(plan.requests) == 2 and not entries()
    assert {r.qualname for r in plan.requests} == {"split_row_sums"}
    hook.install()  # the server's hook, with no executor: TileLang compiles as it would alone
    try:
        split_row_sums(256, 1)
        split_row_sums(256, 2)
    finally:
        hook.release()
    assert entries() == sorted(r.key for r in plan.requests)
    from tilelang.cache.kernel_cache import KernelCache

    assert KernelCache.cached is hook._original_cached  # the last holder put TileLang's own back


def test_a_library_op_goes_on_past_each_captured_kernel_and_a_kernel_met_before_is_not_elaborated_again(
        monkeypatch):
    def op(x, n_splits):  # a library op of two kernels, launched on its own buffers (vLLM's mHC ops are such)
        scale_rows(256)(x)
        split_row_sums(256, n_splits)(x)
        return x.sum()

    x = torch.empty(8, 256, dtype=torch.float16, device="meta")
    with capture() as alone:  # a capture alone: the op stops at its first kernel
        with pytest.raises(hook.Captured):
            op(x, 2)
    assert [r.qualname for r in alone.requests] == ["scale_rows"]

    elaborated = []
    with capture() as plan, calls_go_on():
        original = hook._original_compile
        monkeypatch.setattr(hook, "_original_compile", lambda impl, *a, **k: (elaborated.append(a),
                                                                               original(impl, *a, **k))[1])
        for rows, n_splits in ((8, 2), (64, 2), (8, 4)):
            op(torch.empty(rows, 256, dtype=torch.float16, device="meta"), n_splits)
    assert [r.qualname for r in plan.requests] == ["scale_rows", "split_row_sums", "split_row_sums"]
    assert elaborated == [(256,), (256, 2), (256, 4)]  # the second op's calls were met before
    assert not entries()  # nothing was lowered or built
    with capture() as again, pytest.raises(hook.Captured):  # and nothing was kept in the kernels' caches
        op(x, 2)
    assert [r.qualname for r in again.requests] == ["scale_rows"]


FRESH_SERVER = """
import json
from jit_ahead.session import Session
from tests.kernels.tilelang_rows import scale_rows, split_row_sums
session = Session(families=("tilelang",), tilelang={"workers": 0}).start()
events = []
session.stats.subscribe(events.append)
for n_splits in (1, 2, 4, 8):
    split_row_sums(512, n_splits)
scale_rows(512)
session.close()
print(json.dumps([e["outcome"] for e in events if e["event"] == "executor_miss"]))
"""


def test_helpers_build_what_planning_captured_and_a_fresh_server_compiles_nothing(tilelang_cache):
    session = tilelang_session(workers=1)
    try:
        requests = [plan_call(split_row_sums, 512, n) for n in (1, 2, 4, 8)] + [plan_call(scale_rows, 512)]
        tickets = session.families["tilelang"].submit(requests, Priority.WARMUP)
        wait_settled(tickets)
        assert {t.result.builder for t in tickets} == {"helper-0"}
    finally:
        session.close()
    assert entries() == sorted(r.key for r in requests)
    stats = tilelang_cache.parent / "server-stats.jsonl"
    out = subprocess.run([sys.executable, "-c", FRESH_SERVER], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TILELANG_CACHE_DIR": str(tilelang_cache), "JIT_AHEAD_STATS": str(stats)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["disk"] * 5
    assert "begins to compile" not in out.stdout + out.stderr, out.stdout[-3000:]
    rows = analyse(read_events(stats)[0]).kernels  # the coverage report: a row per factory, no compile
    assert {name: row.compiles["startup"][0] for name, row in rows.items()} == {
        "tests.kernels.tilelang_rows.split_row_sums": 0, "tests.kernels.tilelang_rows.scale_rows": 0}


def test_a_compile_in_flight_in_a_helper_is_waited_for_or_built_once_never_twice():
    session = tilelang_session(workers=1)
    events = []
    session.stats.subscribe(events.append)
    try:
        request = plan_call(split_row_sums, 384, 3)
        session.families["tilelang"].submit([request], Priority.BACKGROUND)
        kernel = split_row_sums(384, 3)  # at once: queued or building in the helper
        assert kernel is not None
        misses = [e for e in events if e["event"] == "executor_miss"]
        assert [m["outcome"] for m in misses] in (["ready"], ["built_here"], ["disk"]), misses
        builds = [e for e in events if e["event"] == "build_finish" and e["key"] == request.key]
        assert len(builds) <= 1  # the helper's, or this thread's, or none (already done): never two
    finally:
        session.close()
    assert entries() == [request.key]


def test_after_serving_an_unplanned_compile_is_refused_in_error_mode_and_reported_in_warn_mode(monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_MODE", "error")
    session = tilelang_session(workers=0)
    try:
        session.mark_serving(tune_ahead=False)
        with pytest.raises(JitAfterReadyError, match="split_row_sums"):
            split_row_sums(128, 4)
        assert not entries()
    finally:
        session.close()
    monkeypatch.setenv("JIT_AHEAD_MODE", "warn")
    session = tilelang_session(workers=0)
    events = []
    session.stats.subscribe(events.append)
    try:
        session.mark_serving(tune_ahead=False)
        assert split_row_sums(128, 4) is not None
        assert [e["event"] for e in events if e["event"] in ("guard", "executor_miss")] == ["guard", "executor_miss"]
        assert [e["outcome"] for e in events if e["event"] == "executor_miss"] == ["built_here"]
    finally:
        session.close()


def test_compiles_recorded_in_one_run_are_built_by_helpers_at_the_next_start_on_an_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_RECORD_DIR", str(tmp_path / "records"))
    session = tilelang_session(workers=0)
    try:
        assert session.families["tilelang"].wait_replay(60)
        split_row_sums(192, 2)
        split_row_sums(192, 3)
        first = entries()
    finally:
        session.close()
    assert len(first) == 2
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "empty"))
    clear_memory_caches()
    session = tilelang_session(workers=1)
    events = []
    session.stats.subscribe(events.append)
    try:
        assert session.families["tilelang"].wait_replay(60)
        assert session.wait_ready(timeout=300, priority=Priority.REPLAY)
        assert entries() == first
        split_row_sums(192, 2)
        split_row_sums(192, 3)
        assert [e["outcome"] for e in events if e["event"] == "executor_miss"] == ["disk", "disk"]
    finally:
        session.close()


def test_a_helper_killed_mid_build_leaves_no_entry_and_the_request_is_built_again():
    session = tilelang_session(workers=1)
    try:
        request = plan_call(split_row_sums, 640, 5)
        (ticket,) = session.families["tilelang"].submit([request], Priority.WARMUP)
        os.kill(helper_running(session.families["tilelang"].pool, "nvcc"), signal.SIGKILL)
        assert not build.is_built(request)
        wait_settled([ticket])
        assert build.is_built(request) and entries() == [request.key]
    finally:
        session.close()


def test_a_request_this_tilelang_keys_otherwise_is_refused_with_one_line_and_nothing_written():
    request = plan_call(split_row_sums, 256, 2)
    other = dataclasses.replace(request, key="0" * 64)
    with pytest.raises(build.KeyMismatch, match="another TileLang version"):
        build.build(other)
    assert not entries()


def test_jit_ahead_1_with_the_tilelang_family_starts_it_when_tilelang_is_imported():
    code = ("import json, sys, tilelang, jit_ahead; s = jit_ahead.current(); "
            "print(json.dumps([sorted(s.families), s.families['tilelang'].pool.workers]))")
    env = without_jit_ahead(os.environ)
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=300,
                         env={**env, "JIT_AHEAD": "1", "JIT_AHEAD_FAMILIES": "tilelang", "JIT_AHEAD_TILELANG_WORKERS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [["tilelang"], 1]
    assert "jit_ahead on (JIT_AHEAD=1): tilelang with 1 helper" in out.stderr


class SplitRowSumsProvider(TileLangTokenCalls):
    name = "test-split-row-sums"

    def find_layers(self, model):
        return [m for m in model.modules() if isinstance(m, SplitRowSums)]

    def calls(self, layer, num_tokens):
        return [layer.kernel_call(num_tokens)]


SERVE_AT_RANDOM = """
import json, random, sys
from jit_ahead.core import device_view
device_view.pin(device_view.DeviceView.h200())  # torch answers as on the H200 (132 SMs), as the planners saw
from jit_ahead.session import Session
from tests.kernels.tilelang_rows import SplitRowSums
session = Session(families=("tilelang",), tilelang={"workers": 0}).start()
events = []
session.stats.subscribe(events.append)
layer = SplitRowSums(1024)
rng = random.Random(int(sys.argv[1]))
for num_tokens in [rng.randint(1, 4096) for _ in range(24)] + [1, 4096]:
    kernel, args, kwargs = layer.kernel_call(num_tokens)
    kernel(*args, **kwargs)
session.close()
print(json.dumps(sorted({e["outcome"] for e in events if e["event"] == "executor_miss"})))
"""


def test_split_counts_from_token_count_and_sm_count_are_planned_for_every_token_count(tilelang_cache):
    # mHC-style: the split count follows from the token count and the SM count (132 on an H200, seen by the
    # forked planners through the device view); every split count the limits reach is built, and a server
    # serving random token counts across the limits compiles nothing.
    import random

    from jit_ahead.core.planning.limits import EngineLimits

    session = tilelang_session(workers=1)
    try:
        model = torch.nn.Sequential(SplitRowSums(1024), SplitRowSums(1024))
        session.plan_model(model, EngineLimits(max_num_tokens=4096, max_batch_size=16, max_seq_len=4096),
                           [SplitRowSumsProvider()])
        assert session.wait_ready(timeout=600, priority=Priority.BACKGROUND)
    finally:
        session.close()
    reachable = {split_count(n, 1024, 132) for n in range(1, 4097)}
    assert len(entries()) == len(reachable) == 7  # 2 to 8 splits: one split needs more than 132 row blocks
    seed = random.randrange(1 << 30)
    out = subprocess.run([sys.executable, "-c", SERVE_AT_RANDOM, str(seed)], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TILELANG_CACHE_DIR": str(tilelang_cache)})
    assert out.returncode == 0, (seed, out.stderr[-3000:])
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["disk"], seed
    assert "begins to compile" not in out.stdout + out.stderr, seed


def test_a_provider_of_a_family_the_session_does_not_run_is_one_line_naming_the_knob(caplog):
    from jit_ahead.core.planning.limits import EngineLimits

    session = Session(families=("triton",), triton={"workers": 0}).start()
    try:
        with caplog.at_level("WARNING", logger="jit_ahead"):
            session.plan_model(torch.nn.Sequential(SplitRowSums(1024)), EngineLimits(64, 4, 64), [SplitRowSumsProvider()])
            assert session.wait_planned(120, priority=None)
    finally:
        session.close()
    lines = [r.getMessage() for r in caplog.records if "test-split-row-sums" in r.getMessage()]
    assert len(lines) == 1 and "1 launch of the tilelang family not planned" in lines[0], lines
    assert "JIT_AHEAD_FAMILIES" in lines[0] and "this session runs triton" in lines[0]


THIRD_PARTY_SERVER = """
import json
from jit_ahead.session import Session
from fla.ops.generalized_delta_rule.dplr.backends.tilelang import cumsum
session = Session(families=("tilelang",), tilelang={"workers": 0}).start()
events = []
session.stats.subscribe(events.append)
cumsum._chunk_local_cumsum_rect_kernel_tl(4, 64, 64, 16, "bfloat16", 1.4426950408889634, True)
session.close()
print(json.dumps([e["outcome"] for e in events if e["event"] == "executor_miss"]))
"""


def test_a_third_party_tilelang_kernel_is_planned_built_by_a_helper_and_loaded_with_no_code_of_its_own(
        tilelang_cache, monkeypatch):
    # flash-linear-attention's TileLang DPLR cumsum kernel, which names no target: TileLang's default target
    # is the H200's here (on a GPU, "auto" resolves to it)
    from fla.ops.generalized_delta_rule.dplr.backends.tilelang import cumsum

    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", json.dumps(TARGET))
    session = tilelang_session(workers=1)
    try:
        request = plan_call(cumsum._chunk_local_cumsum_rect_kernel_tl, 4, 64, 64, 16, "bfloat16",
                            1.4426950408889634, True)
        assert request.module == cumsum.__name__ and '"arch":"sm_90a"' in request.target
        wait_settled(session.families["tilelang"].submit([request], Priority.WARMUP))
    finally:
        session.close()
    out = subprocess.run([sys.executable, "-c", THIRD_PARTY_SERVER], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TILELANG_CACHE_DIR": str(tilelang_cache)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["disk"]
    assert "begins to compile" not in out.stdout + out.stderr


def test_where_tilelang_cannot_be_imported_the_family_is_left_out_with_one_line():
    code = ("import sys, json\nsys.modules['tilelang'] = None  # as where it is not installed\n"
            "from jit_ahead.session import Session\n"
            "s = Session(families=('tilelang',), skip_unavailable=True, tilelang={'workers': 0}).start()\n"
            "print(json.dumps(sorted(s.families)))\ns.close()\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    lines = [line for line in out.stderr.splitlines() if "tilelang" in line]
    assert len(lines) == 1 and "the tilelang family is not available" in lines[0], out.stderr


def test_a_wrapper_another_tool_put_over_ours_between_two_sessions_does_not_loop():
    from tilelang.cache.kernel_cache import KernelCache

    hook.install()
    below = KernelCache.cached  # ours

    def theirs(self, *args, **kwargs):  # another tool's wrapper, calling what it found
        return below(self, *args, **kwargs)

    KernelCache.cached = theirs
    hook.release()
    hook.install()  # a second session
    try:
        assert split_row_sums(96, 2) is not None  # compiled by TileLang, no RecursionError
    finally:
        hook.release()
        KernelCache.cached = hook._original_cached


def test_with_tilelangs_cache_off_a_compile_is_left_to_tilelang_once(monkeypatch):
    monkeypatch.setenv("TILELANG_DISABLE_CACHE", "1")
    events = compiled_once_in_a_session(96, 3)
    assert not [e for e in events if e["event"] in ("build_finish", "executor_miss")], events


def test_the_token_count_provider_takes_calls_whose_arguments_are_lists():
    from jit_ahead.core.planning.limits import EngineLimits

    class ListArguments(TileLangTokenCalls):
        name = "test-list-arguments"

        def find_layers(self, model):
            return [model]

        def calls(self, layer, num_tokens):
            return [(split_row_sums, (128, [1, 2][num_tokens % 2]), {"blocks": [64, 64]})]

    launches = list(ListArguments().launches([object()], EngineLimits(max_num_tokens=64, max_batch_size=4,
                                                                       max_seq_len=64)))
    assert len(launches) == 2


def _damage(request, fault: str) -> None:
    path = build.entry_path(request)
    if fault == "cut":  # the kernel library cut short: TileLang's manifest says another size
        library = os.path.join(path, next(f for f in os.listdir(path) if f.endswith(".so")))
        with open(library, "r+b") as f:
            f.truncate(os.path.getsize(library) // 2)
    else:  # a file of a complete entry missing
        os.remove(os.path.join(path, "params.json"))


@pytest.mark.parametrize("fault", ["cut", "missing"])
def test_a_damaged_entry_is_one_line_removed_and_built_again_by_a_helper(fault, caplog):
    # Before: the manifest alone made an entry "built": nothing was queued for it, and TileLang threw it
    # away at the server's compile and compiled there.
    import logging

    request = plan_call(split_row_sums, 448, 7)
    build.build(request)
    assert build.is_built(request)
    _damage(request, fault)
    caplog.set_level(logging.WARNING, logger="jit_ahead.tilelang")
    session = tilelang_session(workers=1)
    try:
        tickets = session.families["tilelang"].submit([request], Priority.WARMUP)
        assert len(tickets) == 1
        wait_settled(tickets)
        assert tickets[0].result.builder == "helper-0"
    finally:
        session.close()
    assert build.is_built(request) and entries() == [request.key]
    lines = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(lines) == 1 and request.key in lines[0], lines


def test_a_damaged_entry_met_at_the_servers_compile_is_built_again_not_taken_for_one_on_disk():
    request = plan_call(split_row_sums, 320, 6)
    build.build(request)
    _damage(request, "cut")
    clear_memory_caches()
    (miss,) = [e for e in compiled_once_in_a_session(320, 6) if e["event"] == "executor_miss"]
    assert miss["outcome"] == "built_here"  # before: "disk", and TileLang compiled it again unseen
    assert build.is_built(request)
