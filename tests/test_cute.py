"""The CuTe DSL family: helper-built objects, the exported object's bytes, races and kills, on a CPU."""
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

from jit_ahead.core.building.pool import FamilySpec, HelperPool
from jit_ahead.core.priority import Priority
from jit_ahead.core.observing.stats import Stats
from jit_ahead.core.building.table import State
from jit_ahead.cute.build import build_into, make_request, object_path
from jit_ahead.cute.request import StreamSpec, TensorSpec

from .conftest import REPO

SPEC = FamilySpec(name="cute", builder="jit_ahead.cute.build", workers_knob="JIT_AHEAD_CUTE_WORKERS",
                  preload_knob="JIT_AHEAD_CUTE_PRELOAD")


def add_request(dtype="Float16"):
    tensor = TensorSpec(dtype, (None,), assumed_align=16)
    return make_request("tests.kernels.cute_add", "add", [tensor, tensor, tensor, StreamSpec()], arch="sm_90a")


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """A fresh process with no GPU, the repository on its path."""
    full_env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=600)


BUILD = """
    import json, pickle, sys
    from pathlib import Path
    from jit_ahead.cute.build import build_into
    request = pickle.loads(bytes.fromhex(sys.argv[1]))
    print("RESULT", json.dumps(build_into(request, Path(sys.argv[2]))))
"""


def build_in_process(request, root, extra=""):
    import pickle

    code = textwrap.dedent(extra) + textwrap.dedent(BUILD)
    return subprocess.Popen([sys.executable, "-c", code, pickle.dumps(request).hex(), str(root)], cwd=REPO,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def embedded_cubin_arch(obj: bytes) -> int | None:
    """The SM of the CUDA ELF (e_machine 190) inside the host object: the low byte of its e_flags."""
    at = obj.find(b"\x7fELF", 1)
    while at > 0:
        if struct.unpack_from("<H", obj, at + 18)[0] == 190:
            return struct.unpack_from("<I", obj, at + 48)[0] & 0xFF
        at = obj.find(b"\x7fELF", at + 1)
    return None


def test_a_helper_built_object_loads_in_another_process_with_the_original_signature(tmp_path):
    request = add_request()
    pool = HelperPool(SPEC, workers=1, stats=Stats(), env_overrides={"JIT_AHEAD_CUTE_CACHE_DIR": str(tmp_path)})
    try:
        pool.start()
        ticket = pool.submit(request.build_request(), Priority.WARMUP)
        assert ticket.wait(600) is State.DONE, ticket.result.error
    finally:
        pool.close()
    assert ticket.result.builder.startswith("helper-") and ticket.result.details["built"] is True
    assert object_path(request, tmp_path).exists()
    loaded = run_python(f"""
        import inspect, json, pickle
        from pathlib import Path
        from jit_ahead.cute.executor import load
        from tests.kernels import cute_add
        request = pickle.loads(bytes.fromhex({__import__("pickle").dumps(request).hex()!r}))
        fn = load(request, Path({str(tmp_path)!r}))
        loaded = fn.execution_args.original_signature.parameters
        original = inspect.signature(cute_add.add).parameters
        print("RESULT", json.dumps([[str(p) for p in loaded.values()], [str(p) for p in original.values()]]))
    """)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got, expected = json.loads(loaded.stdout.split("RESULT ", 1)[1])
    assert got == expected and [p.split(":")[0] for p in got] == ["a", "b", "c", "stream"]


def test_two_builds_give_identical_bytes_and_the_key_follows_what_changes_the_object(tmp_path):
    request = add_request()
    for root in ("one", "two"):
        assert build_into(request, tmp_path / root)["built"] is True
    first, second = (object_path(request, tmp_path / root).read_bytes() for root in ("one", "two"))
    assert first == second and first[:4] == b"\x7fELF"
    assert embedded_cubin_arch(first) == 90
    other = add_request("Float32")
    assert other.key != request.key
    assert build_into(other, tmp_path / "one")["built"] is True
    assert object_path(other, tmp_path / "one").read_bytes() != first


def test_two_processes_racing_on_one_variant_build_it_once(tmp_path):
    request = add_request()
    racers = [build_in_process(request, tmp_path) for _ in range(2)]
    results = []
    for proc in racers:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.split("RESULT ", 1)[1]))
    assert sorted(r["built"] for r in results) == [False, True]
    assert object_path(request, tmp_path).exists()


def test_a_build_killed_midway_leaves_no_partial_object(tmp_path):
    request = add_request()
    # The build writes part of its object, then the process is killed (SIGKILL: no cleanup runs).
    killed = build_in_process(request, tmp_path, """
        import os, signal
        import jit_ahead.cute.build as b
        def dying(request, folder):
            (folder / "kernel.o").write_bytes(b"half an object")
            os.kill(os.getpid(), signal.SIGKILL)
        b.compile_and_export = dying
    """)
    killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL
    assert not object_path(request, tmp_path).exists()
    again = build_into(request, tmp_path)  # the lock died with the process
    assert again["built"] is True and object_path(request, tmp_path).read_bytes()[:4] == b"\x7fELF"


def test_specs_taken_from_a_call_rebuild_equivalent_arguments_and_keep_shared_symbols():
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

    from jit_ahead.cute.request import ConstSpec, ScalarSpec, SymSpec
    from jit_ahead.cute.arg_specs import UnsupportedCall, fake_args, specs_of

    rows, stride = cute.sym_int32(divisibility=8), cute.sym_int64(divisibility=4)
    args = [make_fake_compact_tensor(cutlass.Float16, (rows, 64), stride_order=(1, 0), assumed_align=16),
            make_fake_tensor(cutlass.BFloat16, (rows, 128), stride=(stride, 1), assumed_align=8),
            make_fake_stream(use_tvm_ffi_env_stream=True), cutlass.Float32(0), None, 3]
    specs = specs_of(args)
    x, y = specs[0], specs[1]
    assert x.shape == (SymSpec(0, 32, 8), 64) and y.shape[0] == x.shape[0]  # one symbol, one slot
    assert y.stride == (SymSpec(1, 64, 4), 1) and (x.assumed_align, y.assumed_align) == (16, 8)
    assert specs[2] == StreamSpec(use_tvm_ffi_env_stream=True)
    assert specs[3:] == (ScalarSpec("Float32"), ConstSpec(None), ConstSpec(3))
    rebuilt = fake_args(specs)
    assert specs_of(rebuilt) == specs
    assert rebuilt[0].shape[0] is rebuilt[1].shape[0]  # the helper's arguments share the symbol too
    try:
        specs_of([object()])
    except UnsupportedCall as exc:
        assert "argument 0" in str(exc)
    else:
        raise AssertionError("an argument with no spec was accepted")


SERVER = """
    import inspect, json, logging
    import cutlass.cute as cute
    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session
    from jit_ahead.cute import hook
    from tests.kernels import cute_add

    compiles = []  # the DSL's own compiles in this process (the helpers are other processes)
    events = []
    session = Session(families=("cute",), cute={"workers": 1})
    session.stats.subscribe(lambda e: events.append(e))
    session.start()
    real = hook._original
    def counting(cc, func, *args, **kwargs):
        compiles.append(func.__qualname__)
        return real(cc, func, *args, **kwargs)
    hook._original = counting

    # Planning: the host side runs in a capture; nothing compiles; a helper builds the request.
    with session.families["cute"].capture() as plan:
        planned = cute_add.compile_add("Float16")
        cute_add.compile_add_tvm_ffi("Float16")
    tickets = session.families["cute"].submit(plan, Priority.WARMUP)
    assert [t.wait(600).name for t in tickets] == ["DONE", "DONE"], [t.result for t in tickets]
    after_planning = list(compiles)

    # The server's own calls of the planned variants load the helper's objects.
    served = cute_add.compile_add("Float16")
    again = cute_add.compile_add("Float16")
    served_ffi = cute_add.compile_add_tvm_ffi("Float16")
    # An unplanned variant: obtained through the pool (built once, in place or by the helper), then loaded.
    unplanned = cute_add.compile_add("Float32")
    # A call jit_ahead cannot describe compiles in place, as without it.
    local = cute_add.compile_add_locally("Float16")
    misses = [(e["label"].split("[")[0], e["outcome"]) for e in events if e["event"] == "executor_miss"]
    builds = [(e["label"].split("[")[0], e["helper"].split("-")[0]) for e in events if e["event"] == "build_finish"]
    session.close()
    print("RESULT", json.dumps({
        "planned_type": type(planned).__name__, "after_planning": after_planning, "compiles": compiles,
        "same": served is again,
        "served_params": [str(p) for p in served.execution_args.original_signature.parameters.values()],
        "original_params": [str(p) for p in inspect.signature(cute_add.add).parameters.values()],
        "unplanned_loaded": type(unplanned).__name__ == type(served).__name__, "local_type": type(local).__name__,
        "ffi_type": f"{type(served_ffi).__module__}.{type(served_ffi).__name__}",
        "misses": misses, "builds": builds}))
"""


def test_the_server_loads_what_helpers_built_and_compiles_only_what_it_cannot_describe(tmp_path):
    stats = tmp_path / "stats.jsonl"
    done = run_python(SERVER, JIT_AHEAD_CUTE_CACHE_DIR=str(tmp_path / "cache"), JIT_AHEAD_HELPER_START="spawn",
                      JIT_AHEAD_STATS=str(stats))
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert out["planned_type"] == "PlannedCompile" and out["after_planning"] == []
    kernel = "tests.kernels.cute_add.add"
    # The second call of the planned variant is an in-memory hit: no miss.
    (first, disk), (ffi, ffi_disk), (second, obtained), (third, unsupported) = out["misses"]
    # The server compiled only the call it could not describe (a kernel defined in a function), and the
    # unplanned variant when it built that one in place itself (the helpers' own build, run here) rather
    # than waiting for the helper: which of the two it does depends on the helper's load at that moment.
    in_place = ["add"] if obtained == "built_here" else []
    assert out["compiles"] == in_place + ["compile_add_locally.<locals>.add_local"]
    assert out["same"] and out["served_params"] == out["original_params"]
    assert out["unplanned_loaded"] and out["local_type"] != "PlannedCompile"
    assert (first, disk) == (ffi, ffi_disk) == (kernel, "disk")
    assert out["ffi_type"] == "tvm_ffi.core.Function"  # loaded through TVM FFI, as it was compiled
    assert second == kernel and obtained in ("built_here", "ready")
    assert unsupported == "unsupported" and third.endswith("compile_add_locally.<locals>.add_local")
    # Three variants, each built exactly once: the planned ones by the helper.
    assert len(out["builds"]) == 3 and out["builds"][:2] == [[kernel, "helper"]] * 2
    # The coverage report reads the same story from the stats log.
    from jit_ahead.report import analyse, read_events

    coverage = analyse(*read_events(stats))
    row = coverage.kernels[kernel]
    assert (row.planned, row.loaded) == (2, 2) and row.built_ahead >= 2
    local = coverage.kernels[third]
    assert local.compiles["startup"][0] == 1 and local.planned == 0
    assert [u["outcome"] for u in coverage.unplanned] == [obtained, "unsupported"]


RECORDED = """
    import json, sys
    import cutlass
    import quack.rmsnorm  # imported before the session: the family gates its compile functions to record them
    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session
    from tests.kernels import cute_add

    events = []
    session = Session(families=("cute",), cute={"workers": 1})
    session.stats.subscribe(events.append)
    session.start()
    assert session.wait_ready(600, priority=Priority.REPLAY)
    add = cute_add.compile_add("Float16")
    fwd = sys.modules["quack.rmsnorm"]._compile_rmsnorm_fwd
    fwd(cutlass.BFloat16, cutlass.BFloat16, None, cutlass.BFloat16, None, None, 64, False, False, False, False, 0.0)
    session.close()
    print("RESULT", json.dumps({
        "replayed": [e["variants"] for e in events if e["event"] == "replay"],
        "helper_builds": sum(1 for e in events if e["event"] == "build_finish" and e["helper"] != "executor"),
        "misses": [e["outcome"] for e in events if e["event"] == "executor_miss"],
        "quack": fwd.cache_info()._asdict()}))
"""


def test_recorded_calls_are_replayed_to_helpers_on_the_next_start_and_nothing_compiles_in_the_server(tmp_path):
    records = tmp_path / "records"
    runs = []
    for run in ("first", "second"):  # each start with empty caches, one record folder
        done = run_python(RECORDED, JIT_AHEAD_RECORD_DIR=str(records), CUTE_DSL_ARCH="sm_90a",
                          JIT_AHEAD_CUTE_CACHE_DIR=str(tmp_path / run / "cute"), JIT_AHEAD_HELPER_START="spawn",
                          QUACK_CACHE_DIR=str(tmp_path / run / "quack"))
        assert done.returncode == 0, done.stderr[-4000:]
        runs.append(json.loads(done.stdout.split("RESULT ", 1)[1]))
    first, second = runs
    assert first["replayed"] == [0] and first["quack"]["misses"] == 1  # quack compiled in the server
    assert first["misses"][0] in ("built_here", "ready")  # the add kernel: not planned, obtained once
    assert [p.name.split("-")[0] for p in records.iterdir()] == ["cute"]
    # The second start replays both to its helper before the server asks: loads only.
    assert second["replayed"] == [2] and second["helper_builds"] == 2
    assert second["misses"] == ["disk"] and (second["quack"]["hits"], second["quack"]["misses"]) == (1, 0)


GUARDED = """
    import json
    from jit_ahead.core.building.executor import JitAfterReadyError
    from jit_ahead.session import Session
    from tests.kernels import cute_add

    session = Session(families=("cute",), cute={"workers": 0})
    session.start()
    session.mark_serving()
    raised = []
    for call in (lambda: cute_add.compile_add("BFloat16"), cute_add.compile_add_locally):
        try:
            call()
            raised.append(None)
        except JitAfterReadyError as exc:
            raised.append(str(exc))
    session.close()
    print("RESULT", json.dumps(raised))
"""


def test_after_serving_starts_a_cute_compile_in_the_server_is_refused_in_error_mode(tmp_path):
    done = run_python(GUARDED, JIT_AHEAD_MODE="error", JIT_AHEAD_CUTE_CACHE_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    unplanned, undescribed = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert "tests.kernels.cute_add.add[" in unplanned and "was not planned" in unplanned
    assert "add_local cannot be built ahead" in undescribed and "JIT_AHEAD_MODE=error" in undescribed
    assert not any(tmp_path.rglob("*.o"))  # refused before anything compiled


def test_a_closed_cute_session_puts_the_dsls_own_compile_back():
    from cutlass.base_dsl.compiler import CompileCallable

    from jit_ahead.session import Session

    own = CompileCallable._compile
    session = Session(families=("cute",), cute={"workers": 0}).start()
    assert CompileCallable._compile is not own
    session.close()
    assert CompileCallable._compile is own
