"""``jit-ahead build`` as an image build or a CI job runs it, and the server started afterwards: a transformers
model folder (a Qwen3 with Liger's kernels patched in, by ``--setup`` in the build and by the server's own code
in the server) is planned and built on this CPU-only machine; a ``JIT_AHEAD=1`` process that loads the model
with ``from_pretrained`` then plans nothing and builds nothing, from the same folders or, with empty folders of
its own, from the store."""
import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO, without_jit_ahead

pytest.importorskip("liger_kernel", reason="the model runs Liger's kernels ([liger] extra)")

LIGER = "liger_kernel.transformers:apply_liger_kernel_to_qwen3"

LIMITS = {"JIT_AHEAD_MAX_NUM_TOKENS": "24", "JIT_AHEAD_MAX_BATCH_SIZE": "2", "JIT_AHEAD_MAX_SEQ_LEN": "24",
          "JIT_AHEAD_CUDA_GRAPH_SIZES": "1,2"}

WRITE_MODEL = """
import sys, torch
from transformers import AutoModelForCausalLM, Qwen3Config
config = Qwen3Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=64, vocab_size=256, dtype="bfloat16")
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[1])
"""

SERVER = """
import json, os, sys
import jit_ahead
from jit_ahead.core import device_view
from jit_ahead.triton.standin import ensure_driver
if os.environ.get("SERVER_GPU"):  # a server on that GPU model: what DeviceView.capture() reads there
    with open(os.environ["SERVER_GPU"]) as f:
        device_view.install(device_view.DeviceView.from_json(json.load(f)))
ensure_driver()
from liger_kernel.transformers import apply_liger_kernel_to_qwen3
apply_liger_kernel_to_qwen3()  # the server's own code, before it builds its model
from transformers import AutoModelForCausalLM
events = []
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
session = jit_ahead.current()
session.stats.subscribe(events.append)
(run,) = session._planning
assert run.wait(300) and session.wait_ready(300)
names = [e["event"] for e in events]
print("SERVER " + json.dumps({"plan": [n for n in names if n.startswith("plan")], "queued": len(run.tickets),
                              "built": names.count("build_finish"), "compiled": names.count("compile")}))
"""


def environ(folders, **env) -> dict:
    return {**without_jit_ahead(os.environ), "PYTHONPATH": str(REPO), **LIMITS,
            "TRITON_CACHE_DIR": str(folders / "triton"), "JIT_AHEAD_PLAN_DIR": str(folders / "plans"), **env}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The model folder, and the folders and store ``jit-ahead build`` filled."""
    root = tmp_path_factory.mktemp("prebuild")
    model = root / "model"
    subprocess.run([sys.executable, "-c", WRITE_MODEL, str(model)], check=True, capture_output=True, timeout=300)
    env = environ(root / "image", JIT_AHEAD_STORE=str(root / "store"))
    proc = subprocess.run([sys.executable, "-m", "jit_ahead.cli", "build", str(model), "--workers", "1",
                           "--setup", LIGER], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return root, model, proc.stdout


def serve(model, env) -> dict:
    proc = subprocess.run([sys.executable, "-c", SERVER, str(model)], cwd=REPO, env={**env, "JIT_AHEAD": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("SERVER "))[7:])


def test_build_says_what_it_built_where_and_how_to_serve_within_the_same_limits(built):
    root, _, out = built
    lines = out.splitlines()
    (summary,) = [line for line in lines if line.startswith("built ")]
    done, total = summary.split()[1], summary.split()[3]
    assert done == total and int(total) > 0, out
    assert f"cache: {root / 'image' / 'triton'}" in lines and f"store: {root / 'store'}" in lines
    assert any(line.startswith(f"plan: {root / 'image' / 'plans'}") for line in lines), out
    assert ("serve with: JIT_AHEAD=1 JIT_AHEAD_MAX_NUM_TOKENS=24 JIT_AHEAD_MAX_BATCH_SIZE=2 JIT_AHEAD_MAX_SEQ_LEN=24 "
            "JIT_AHEAD_CUDA_GRAPH_SIZES=1,2") in lines


@pytest.mark.parametrize("where", ["the image's folders", "the store"])
def test_a_server_on_what_build_made_plans_builds_and_compiles_nothing(built, where):
    root, model, _ = built
    if where == "the store":  # a new node: empty folders of its own
        env = environ(root / "node", JIT_AHEAD_STORE=str(root / "store"))
    else:
        env = environ(root / "image")
    assert serve(model, env) == {"plan": ["plan_loaded"], "queued": 0, "built": 0, "compiled": 0}
    if where == "the store":  # within other limits than the build's, the server plans what they add itself
        other = serve(model, {**env, "JIT_AHEAD_MAX_NUM_TOKENS": "40", "JIT_AHEAD_TRITON_WORKERS": "0"})
        assert other["plan"][-1] == "plan_saved" and "plan_loaded" not in other["plan"]


def another_gpu_model(path, slot: int) -> None:
    """An sm_90 GPU other than the embedded H200, in the GPU slot ``slot``, as a file of its view."""
    import dataclasses

    from triton.backends.compiler import GPUTarget

    from jit_ahead.triton.device import view_for_target

    view = view_for_target(GPUTarget("cuda", 90, 32))
    properties = {**view.torch_properties, "name": "NVIDIA H100 80GB HBM3", "total_memory": 85045346304,
                  "L2_cache_size": 52428800, "pci_bus_id": slot}
    view = dataclasses.replace(view, name="NVIDIA H100 80GB HBM3", torch_properties=properties)
    path.write_text(json.dumps(view.to_json()))


def test_a_build_for_the_servers_gpu_model_is_found_by_every_server_of_that_model(built):
    root, model, _ = built
    another_gpu_model(root / "h100-slot0.json", 0)
    another_gpu_model(root / "h100-slot3.json", 3)
    env = environ(root / "image", JIT_AHEAD_PLAN_DIR=str(root / "h100-plans"))
    proc = run_build(str(model), "--device-view", str(root / "h100-slot0.json"), "--workers", "0", "--setup", LIGER,
                     env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a server of that model in another slot (another rank's GPU): the plan is its own, every kernel built
    on_h100 = serve(model, {**env, "SERVER_GPU": str(root / "h100-slot3.json")})
    assert on_h100 == {"plan": ["plan_loaded"], "queued": 0, "built": 0, "compiled": 0}
    # the H200 a server without a GPU view shows is another GPU model: not that plan
    on_h200 = serve(model, {**env, "JIT_AHEAD_TRITON_WORKERS": "0"})
    assert on_h200["plan"][-1] == "plan_saved" and "plan_loaded" not in on_h200["plan"]


def test_a_device_view_file_that_is_not_one_is_one_line(tmp_path):
    for content, says in [("not json", "is not a device view"), ('{"name": "x"}', "needs 'capability'"),
                          ('{"name": "x", "capability": [9, 0], "colour": 1}', "no field colour")]:
        (tmp_path / "view.json").write_text(content)
        proc = run_build("os:getcwd", "--device-view", str(tmp_path / "view.json"), env=environ(tmp_path))
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "jit_ahead.cli", "device-view"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=environ(tmp_path))
    assert proc.returncode == 2 and "has no GPU" in proc.stderr and "Traceback" not in proc.stderr


def run_build(*args, env=None):
    return subprocess.run([sys.executable, "-m", "jit_ahead.cli", "build", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env or environ(REPO / "unused"))


@pytest.mark.parametrize("args, says", [
    (["/nonexistent/model"], "is neither a folder nor module:function"),
    (["tests"], "is a folder without a config.json"),
    (["os:getcwd"], "returned a str, not a torch.nn.Module"),
    (["no_such_module_here:make"], "no_such_module_here cannot be imported"),
    (["os:no_such_function"], "os has no no_such_function"),
    (["os:getcwd", "--setup", "os"], "--setup 'os' is not module:function"),
    (["json:loads", "--setup", "os:getcwd"], "could not be made (TypeError"),
])
def test_what_build_cannot_use_is_one_line_and_exit_2(args, says, tmp_path):
    proc = run_build(*args, env=environ(tmp_path))
    lines = [line for line in proc.stderr.splitlines() if line.startswith("jit-ahead build:")]
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr
