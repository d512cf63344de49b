"""The FlashInfer family against the real flashinfer-python (0.6.13, the release vLLM 0.25 pins, in CI's
Triton 3.6 environment; 0.7.4, the newest, in its Triton 3.9 one), its own module specs and its own build,
with nvcc for sm_90a on this CPU machine: modules found by capture from FlashInfer's ops on meta tensors,
built by real helpers, loaded by a fresh process with no build; a helper killed mid-build, a stamp that does
not match and a helper whose FlashInfer builds elsewhere are never loaded.

FlashInfer fixes its JIT folder at import (workspace, version, archs): every test of this module shares one
workspace and takes a module of its own (``act_module``), removed first."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

if "FLASHINFER_WORKSPACE_BASE" not in os.environ:
    os.environ["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp(prefix="jit-ahead-flashinfer-")
    atexit.register(shutil.rmtree, os.environ["FLASHINFER_WORKSPACE_BASE"], True)
WORKSPACE = os.environ["FLASHINFER_WORKSPACE_BASE"]
os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")  # the H200's; without a GPU FlashInfer knows none

flashinfer = pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")

from jit_ahead.core.priority import Priority  # noqa: E402
from jit_ahead.flashinfer import build, toolchain  # noqa: E402
from jit_ahead.flashinfer.plan import capture, planned_call  # noqa: E402
from jit_ahead.flashinfer.request import STAMP  # noqa: E402
from jit_ahead.session import Session  # noqa: E402

from .conftest import REPO, helper_running, without_jit_ahead  # noqa: E402

if shutil.which("nvcc") is None and toolchain.cuda_home() is None:
    pytest.skip("no nvcc: FlashInfer's modules cannot be built here", allow_module_level=True)


@pytest.fixture(autouse=True, scope="module")
def toolkit():
    """What a server with a working toolkit has, for builds in place in this process and the fresh servers
    (helpers get it from the family), for this module's tests only."""
    saved = dict(os.environ)
    os.environ.update(toolchain.helper_environment((9, 0), Path(WORKSPACE)))
    yield
    os.environ.clear()
    os.environ.update(saved)

OPS = {"silu": flashinfer.activation.silu_and_mul, "gelu": flashinfer.activation.gelu_and_mul,
       "gelu_tanh": flashinfer.activation.gelu_tanh_and_mul}


def act_module(act: str):
    """The module FlashInfer's ``<act>_and_mul`` op asks for, captured on meta tensors, its folder emptied."""
    x = torch.empty(8, 256, dtype=torch.float16, device="meta")
    with capture() as plan:
        planned_call(OPS[act], x)
    (request,) = plan.requests
    shutil.rmtree(request.folder, ignore_errors=True)
    return request


def session(workers: int) -> Session:
    return Session(families=("flashinfer",), flashinfer={"workers": workers}).start()


def built_by_a_helper(request, timeout: float) -> None:
    """``request`` submitted at WARMUP to a session of one helper, which builds it within ``timeout``."""
    s = session(workers=1)
    try:
        s.families["flashinfer"].submit([request], Priority.WARMUP)
        assert s.wait_ready(timeout, priority=Priority.WARMUP)
    finally:
        s.close()
    assert request.is_built()


def wait_built(request, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not request.is_built() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert request.is_built(), f"{request.label} was not built within {timeout}s"


FRESH_SERVER = """
import json, sys
import flashinfer.jit.core as core
builds = []
nvcc_spec = getattr(core, "JitSpecNvcc", core.JitSpec)  # FlashInfer 0.7's nvcc modules; 0.6's one spec class
original = nvcc_spec.build
nvcc_spec.build = lambda self, *a, **k: (builds.append(self.name), original(self, *a, **k))[1]
from jit_ahead.session import Session
session = Session(families=("flashinfer",), flashinfer={"workers": 0}).start()
events = []
session.stats.subscribe(events.append)
import flashinfer.activation as activation
module = activation.get_act_and_mul_module(sys.argv[1])  # what the op asks for, as it asks
session.close()
print(json.dumps({"builds": builds, "outcomes": [e["outcome"] for e in events if e["event"] == "executor_miss"],
                  "loaded": hasattr(module, sys.argv[1] + "_and_mul")}))
"""


def fresh_server(act: str, **knobs) -> dict:
    env = {**without_jit_ahead(os.environ), **knobs}
    out = subprocess.run([sys.executable, "-c", FRESH_SERVER, act], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_module_an_op_asks_for_on_meta_is_built_by_a_helper_and_a_fresh_server_loads_it_without_building():
    request = act_module("silu")
    assert request.name == "silu_and_mul" and not request.is_built()
    built_by_a_helper(request, 300)
    stamp = json.loads(open(os.path.join(request.folder, STAMP)).read())
    assert stamp["key"] == request.key and stamp["version"] == flashinfer.__version__
    assert fresh_server("silu") == {"builds": [], "outcomes": ["disk"], "loaded": True}


def test_a_module_nothing_built_is_built_in_place_once_and_loaded():
    request = act_module("gelu_tanh")
    result = fresh_server("gelu_tanh")
    assert result == {"builds": ["gelu_tanh_and_mul"], "outcomes": ["built_here"], "loaded": True}
    assert request.is_built()
    assert fresh_server("gelu_tanh") == {"builds": [], "outcomes": ["disk"], "loaded": True}


def test_a_helper_killed_mid_build_leaves_nothing_loadable_and_the_module_is_built_again():
    request = act_module("gelu")
    s = session(workers=1)
    try:
        (ticket,) = s.families["flashinfer"].submit([request], Priority.WARMUP)
        os.kill(helper_running(s.families["flashinfer"].pool, "nvcc"), signal.SIGKILL)
        assert not request.is_built()  # whatever ninja leaves, no stamp vouches for it
        wait_built(request)
    finally:
        s.close()
    assert fresh_server("gelu")["outcomes"] == ["disk"]


def test_a_module_a_server_built_is_recorded_and_built_by_helpers_at_the_next_start(tmp_path, monkeypatch):
    records = str(tmp_path / "records")
    request = act_module("gelu_tanh")
    assert fresh_server("gelu_tanh", JIT_AHEAD_RECORD_DIR=records)["outcomes"] == ["built_here"]  # and recorded
    monkeypatch.setenv("JIT_AHEAD_RECORD_DIR", records)
    shutil.rmtree(request.folder)
    s = session(workers=1)
    try:
        assert s.families["flashinfer"].wait_replay(60)
        assert s.wait_ready(timeout=300, priority=Priority.REPLAY)
    finally:
        s.close()
    assert request.is_built()
    assert fresh_server("gelu_tanh") == {"builds": [], "outcomes": ["disk"], "loaded": True}


def test_a_module_whose_folder_is_read_only_once_built_loads_with_no_build(tmp_path):
    # An image's modules, built ahead by helpers and then mounted read-only (a real read-only tmpfs: root
    # cannot write there either): the server loads them, with no build and nothing written.
    request = act_module("gelu")
    os.makedirs(request.folder)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", request.folder], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        built_by_a_helper(request, 300)
        subprocess.run(["mount", "-o", "remount,ro", request.folder], check=True)
        with pytest.raises(OSError, match="Read-only file system"):
            open(os.path.join(request.folder, "probe"), "w")
        assert fresh_server("gelu") == {"builds": [], "outcomes": ["disk"], "loaded": True}
    finally:
        subprocess.run(["umount", "-l", request.folder], check=False)


def test_a_stamp_of_another_build_or_a_damaged_one_is_not_taken_as_built():
    request = act_module("silu")
    build.build(request)
    assert request.is_built()
    path = os.path.join(request.folder, STAMP)
    with open(path, "w") as f:
        json.dump({"key": "0" * 64}, f)  # another version's or spec's build
    assert not request.is_built()
    with open(path, "w") as f:
        f.write('{"key": ')  # cut short
    assert not request.is_built()
    with open(path, "w") as f:
        json.dump({"key": request.key, "pad": "x" * 8192}, f)  # the right key in a file far larger than a stamp
    assert not request.is_built()
    build.build(request)  # built again: the stamp is written anew
    assert request.is_built()


def test_a_helper_whose_flashinfer_builds_elsewhere_refuses_the_build_with_the_reason():
    import dataclasses

    request = dataclasses.replace(act_module("silu"), jit_dir="/elsewhere/cached_ops")
    with pytest.raises(build.JitDirMismatch, match="the server loads from /elsewhere/cached_ops"):
        build.build(request)
    assert not os.path.exists(os.path.join(request.folder, STAMP))


def test_without_nvcc_the_family_is_left_out_with_one_line_and_the_server_runs_without_it(tmp_path):
    code = ("import jit_ahead.session as s; x = s.Session(families=('flashinfer',), skip_unavailable=True).start(); "
            "print(sorted(x.families)); x.close()")
    env = {**without_jit_ahead(os.environ), "PATH": os.path.dirname(sys.executable), "CUDA_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    lines = [line for line in out.stderr.splitlines() if "flashinfer family is not available" in line]
    assert len(lines) == 1 and "nvcc" in lines[0], out.stderr[-2000:]


PLANNER = """
import flashinfer.activation as activation
from jit_ahead.flashinfer import hook
from jit_ahead.flashinfer.plan import capture
from jit_ahead.session import Session
session = Session(families=("flashinfer",), flashinfer={"workers": 0}).start()
session.families["flashinfer"].enter_planner()  # as a planner forked from the server
with capture() as plan:  # its own capture: recorded
    try:
        activation.get_act_and_mul_module("silu")
    except hook.Captured:
        pass
try:  # outside it (another family's planning met the op): refused, nothing built
    activation.get_act_and_mul_module("silu")
    print("BUILT")
except RuntimeError as exc:
    print("REFUSED", [r.name for r in plan.requests], "not built here" in str(exc))
"""


def test_a_planner_builds_no_module_outside_a_flashinfer_capture():
    act_module("silu")
    out = subprocess.run([sys.executable, "-c", PLANNER], cwd=REPO, env=without_jit_ahead(os.environ),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "REFUSED ['silu_and_mul'] True"


def test_a_spec_jit_ahead_cannot_carry_is_left_to_flashinfer_with_one_line_and_never_planned(caplog):
    import dataclasses

    from flashinfer.jit.activation import gen_act_and_mul_module

    from jit_ahead.flashinfer import hook

    spec = dataclasses.replace(gen_act_and_mul_module("silu"), extra_ldflags=[object()])  # not a plain field
    with caplog.at_level("INFO", logger="jit_ahead.flashinfer"):
        assert hook._module_of(spec)[0] is None and hook._module_of(spec)[0] is None
    lines = [r.getMessage() for r in caplog.records if "left to FlashInfer" in r.getMessage()]
    assert len(lines) == 1 and "silu_and_mul" in lines[0] and "object" in lines[0], lines
    with capture() as plan, pytest.raises(RuntimeError, match="silu_and_mul is not planned: a field of type object"):
        spec.build_and_load()
    assert plan.requests == []


def test_a_damaged_stand_in_libcuda_is_made_again_and_modules_link_against_it(caplog):
    if "FLASHINFER_EXTRA_LDFLAGS" not in os.environ:
        pytest.skip("this machine has a libcuda: no stand-in is made")
    folder = Path(WORKSPACE) / "libcuda-stand-in"
    library = folder / "libcuda.so"
    good = library.read_bytes()
    library.write_bytes(good[: len(good) // 2])  # cut short, as a crash or a full disk leaves a file
    request = act_module("silu")
    with pytest.raises(Exception, match="ninja|build|link"):  # what every helper's link met before
        build.build(request)
    with caplog.at_level("WARNING", logger="jit_ahead.flashinfer"):
        env = toolchain.helper_environment((9, 0), Path(WORKSPACE))  # the family's next start
    assert env["FLASHINFER_EXTRA_LDFLAGS"].endswith(f"-L{folder}")
    assert [r.getMessage() for r in caplog.records if "made again" in r.getMessage()]
    build.build(request)
    assert request.is_built()
    assert toolchain.helper_environment((9, 0), Path(WORKSPACE)) == env  # kept once it is whole


def test_the_sampling_module_builds_in_a_helper_with_curand_headers_from_their_package():
    # FlashInfer's sampling module (what vLLM's top-k/top-p sampler loads) includes curand.h; a toolkit without
    # cuRAND (this machine's nvcc) lacks it, and nvidia-curand's package has it: helpers get its folder
    toolkit = os.environ.get("CUDA_HOME") or toolchain.cuda_home()
    if toolkit and os.path.isfile(os.path.join(toolkit, "include", "curand.h")):
        pytest.skip("this toolkit has cuRAND's headers itself")
    assert toolchain.library_header_folders(toolkit), "CI installs nvidia-curand beside FlashInfer"
    from flashinfer.jit.sampling import gen_sampling_module

    from jit_ahead.flashinfer.request import FlashInferModule

    request = FlashInferModule.of(gen_sampling_module())
    shutil.rmtree(request.folder, ignore_errors=True)
    built_by_a_helper(request, 900)
