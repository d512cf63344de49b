"""The CuTe DSL family: helper-built objects, the exported object's bytes, races and kills, on a CPU."""
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

from jit_ahead.core.pool import FamilySpec, HelperPool
from jit_ahead.core.priority import Priority
from jit_ahead.core.stats import Stats
from jit_ahead.core.table import State
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
        from jit_ahead.cute.load import load
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
