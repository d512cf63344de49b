"""JIT_AHEAD=1 in any process: the start-up hook installed with the package (jit_ahead.pth)."""
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .conftest import without_jit_ahead

PTH = Path(sysconfig.get_paths()["purelib"]) / "jit_ahead.pth"


@pytest.fixture(autouse=True)
def installed_hook():
    assert PTH.exists(), (f"{PTH} is missing: the start-up hook is installed by `pip install .` (an editable "
                          "install does not place it); .ci/run and the README install that way")


def run(code: str, **env) -> dict:
    clean = without_jit_ahead(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/",
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


LOADED = ("import sys, json; print(json.dumps(sorted(m for m in sys.modules "
          "if m.split('.')[0] in ('jit_ahead', 'triton', 'torch'))))")


def test_unset_does_nothing_at_all():
    assert run(LOADED) == []
    assert run(LOADED, JIT_AHEAD="0") == []


def test_set_but_triton_never_imported_costs_three_small_modules():
    # the hook, the family registry it reads the trigger modules from, and the registry's record type;
    # they import nothing else
    assert run(LOADED, JIT_AHEAD="1") == ["jit_ahead", "jit_ahead.autostart", "jit_ahead.frozen", "jit_ahead.registry"]


def test_set_starts_a_session_once_triton_is_imported():
    code = ("import triton, jit_ahead, json; s = jit_ahead.current(); "
            "print(json.dumps([s is not None, s.phase, sorted(s.families)]))")
    assert run(code, JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0") == [True, "startup", ["triton"]]


def test_a_process_that_only_imports_triton_starts_no_helper_and_imports_no_torch(tmp_path):
    # It never plans or misses: the session must cost it nothing. It read the GPU (importing torch, about
    # a second) at start, before anything needed it.
    # Nor does it start the helper slots' threads or import what starts helpers (the fork server, the
    # helpers' messages): they come with the first request queued.
    code = ("import json, sys, threading, time, triton, psutil; time.sleep(1.0); "
            "print(json.dumps(['torch' in sys.modules, [p.pid for p in psutil.Process().children(recursive=True)], "
            "sorted(t.name for t in threading.enumerate() if 'slot' in t.name), "
            "sorted(m for m in sys.modules if m.endswith(('.forkserver', '.protocol', '.helper_starter')))]))")
    stats = tmp_path / "stats.jsonl"
    assert run(code, JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="2", JIT_AHEAD_STATS=str(stats)) == [False, [], [], []]
    events = [json.loads(line)["event"] for line in stats.read_text().splitlines()]
    assert not {"helper_ready", "forkserver_ready", "build_start"} & set(events), events


def test_serving_starts_by_time_unless_the_engine_says_so():
    wait = ("import time, triton, jit_ahead, json; time.sleep(1.5); "
            "print(json.dumps(jit_ahead.current().phase))")
    assert run(wait, JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", JIT_AHEAD_WARMUP_S="0.3") == "serving"
    assert run(wait, JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", JIT_AHEAD_WARMUP_S="0") == "startup"
    engine = ("import time, triton, jit_ahead, json; s = jit_ahead.current(); s.mark_serving(); "
              "time.sleep(1.0); print(json.dumps([s.phase, s.stats.count('phase')]))")
    assert run(engine, JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", JIT_AHEAD_WARMUP_S="0.3") == ["serving", 1]


def test_with_the_cute_family_a_cute_dsl_import_starts_the_session_with_both_families():
    code = ("import sys, json; import cutlass; import jit_ahead; s = jit_ahead.current(); "
            "print(json.dumps([s is not None, sorted(s.families), 'cutlass' in sys.modules]))")
    assert run(code, JIT_AHEAD="1", JIT_AHEAD_FAMILIES="triton,cute", JIT_AHEAD_TRITON_WORKERS="0",
               JIT_AHEAD_CUTE_WORKERS="0") == [True, ["cute", "triton"], True]
    # An unknown family name is dropped with one line; the session starts with the others.
    code = "import triton, jit_ahead, json; print(json.dumps(sorted(jit_ahead.current().families)))"
    assert run(code, JIT_AHEAD="1", JIT_AHEAD_FAMILIES="triton,flashinfr", JIT_AHEAD_TRITON_WORKERS="0") == ["triton"]


def test_a_transformers_model_from_config_is_planned_with_the_limits_of_the_knobs(tmp_path):
    # no code change: from_config returns the model and planning starts; the model planner plans its
    # transformers GatedDeltaNet layers, which call fla's ops (no provider knows them)
    code = """
import json, jit_ahead
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig
config = Qwen3_5TextConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=64,
    linear_value_head_dim=64, vocab_size=256, layer_types=["linear_attention", "full_attention"])
model = AutoModelForCausalLM.from_config(config)
session = jit_ahead.current()
(run,) = session._planning
run.wait(600)
planned = {}
for line in open(%r):
    event = json.loads(line)
    if event["event"] == "planned" and event.get("variants"):
        planned.setdefault(event["provider"], set()).update(event["kernels"])
from pathlib import Path
from jit_ahead.report import analyse, read_events
rows = analyse(read_events(Path(%r))[0]).kernels
by = sorted({p for name, row in rows.items() if name.endswith("chunk_fwd_kernel_o") for p in row.planners})
print(json.dumps([type(model).__name__, str(run._limits.max_num_tokens), {k: sorted(v) for k, v in planned.items()}, by]))
""" % (str(tmp_path / "stats.jsonl"), str(tmp_path / "stats.jsonl"))
    name, tokens, planned, report = run(code, JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", JIT_AHEAD_PLANNERS="0",
                                JIT_AHEAD_MAX_NUM_TOKENS="48", JIT_AHEAD_MAX_BATCH_SIZE="2", JIT_AHEAD_MAX_SEQ_LEN="40",
                                JIT_AHEAD_PLAN_DIR="0", JIT_AHEAD_STATS=str(tmp_path / "stats.jsonl"))
    assert (name, tokens) == ("Qwen3_5ForCausalLM", "48")
    assert "chunk_fwd_kernel_o" in planned["model"] and "fused_recurrent_gated_delta_rule_fwd_kernel" in planned["model"]
    assert report == ["model"]  # the coverage report names the planner per kernel


def test_the_model_hook_can_be_turned_off():
    code = ("import json, jit_ahead, triton\nfrom transformers import AutoModelForCausalLM, Qwen3Config\n"
            "AutoModelForCausalLM.from_config(Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1, "
            "num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=128))\n"
            "print(json.dumps(len(jit_ahead.current()._planning)))")
    assert run(code, JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", JIT_AHEAD_PLAN_MODELS="off") == 0


def run_raw(code: str, cwd: str = "/", **env) -> subprocess.CompletedProcess:
    clean = without_jit_ahead(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd,
                         env={**clean, **env})
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return out


# a server whose logger passes INFO but whose only handler shows warnings and above: the line would be lost
QUIET_HANDLER = ("handler = logging.StreamHandler()\nhandler.setLevel(logging.WARNING)\n"
                 "logging.getLogger().addHandler(handler)\nlogging.getLogger().setLevel(logging.INFO)")


@pytest.mark.parametrize("logging_setup, stats", [("", False), ("", True), ("logging.basicConfig(level=logging.INFO)", False),
                                                  ("logging.basicConfig(level=logging.INFO)", True), (QUIET_HANDLER, False)],
                         ids=["no-logging", "no-logging-stats", "logging", "logging-stats", "handler-above-info"])
def test_on_is_said_once_at_start_and_the_summary_once_at_exit(tmp_path, logging_setup, stats):
    # A person must see that JIT_AHEAD=1 took effect, and what it did, once each: through the server's
    # logging where it shows jit_ahead's lines, else on stderr.
    code = f"import logging\n{logging_setup}\nimport triton\nimport jit_ahead\nprint('{{}}')\n"
    env = {"JIT_AHEAD": "1", "JIT_AHEAD_TRITON_WORKERS": "2"}
    if stats:
        env["JIT_AHEAD_STATS"] = str(tmp_path / "stats.jsonl")
    lines = run_raw(code, **env).stderr.splitlines()
    on = [line for line in lines if "jit_ahead on (JIT_AHEAD=1): triton with 2 helpers" in line]
    assert len(on) == 1, lines
    assert ("stats log" in on[0]) is stats
    summaries = [line for line in lines if "jit_ahead: planned 0" in line]
    assert len(summaries) == 1, lines


def test_a_stats_log_on_a_full_disk_is_one_line_and_the_run_goes_on():
    # /dev/full: every write fails with ENOSPC. One line says so, the log is off, nothing else changes.
    code = ("import triton, jit_ahead\nfrom tests.scenarios import run_scenario\nrun_scenario('basic')\n"
            "print(jit_ahead.current().stats_log.failed)\n")
    out = run_raw(code, cwd=str(Path(__file__).parent.parent), JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0",
                  JIT_AHEAD_STATS="/dev/full")
    assert "No space left on device" in out.stdout
    lines = out.stderr.splitlines()
    errors = [line for line in lines if "/dev/full" in line and "cannot write" in line]
    assert len(errors) == 1 and "summary goes to the log" in errors[0], lines
    (summary,) = [line for line in lines if line.startswith("jit_ahead: planned")]
    assert "executor compiles (startup)" in summary and "off after a failed write" in summary
    assert not any("listener" in line for line in lines), lines


FIRST_COMPILE = """
import json, sys, triton
loaded = sorted(m for m in sys.modules if m.startswith("jit_ahead"))
from jit_ahead.triton.standin import ensure_driver
ensure_driver()
import torch
from tests.kernels import basic as k
before = "jit_ahead.session" in sys.modules and sys.modules["jit_ahead.session"].current() is not None
{break_start}
k.add_kernel[(1,)](torch.empty(64, device="meta"), torch.empty(64, device="meta"), torch.empty(64, device="meta"), 64, BLOCK=64)
from jit_ahead import session
s = session.current()
print(json.dumps([loaded, before, s is not None and s.stats.count("executor_miss"),
                  s is not None and s.stats.count("compile")]))
"""


def test_without_records_the_session_starts_at_the_first_compile_and_sees_it(tmp_path):
    # A process that imports Triton and never compiles pays for no session (issue 19, item 7); the first
    # launch that misses starts it, and the session sees that launch as one started at the import does.
    # With a record folder the session starts at the import, to replay the records while the model loads.
    repo = str(Path(__file__).parent.parent)
    seen = {}
    for arm, extra in (("first compile", {}), ("import", {"JIT_AHEAD_RECORD_DIR": str(tmp_path / "records")})):
        env = dict(JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", TRITON_CACHE_DIR=str(tmp_path / arm), **extra)
        out = run_raw(FIRST_COMPILE.format(break_start=""), cwd=repo, **env)
        seen[arm] = json.loads(out.stdout.strip().splitlines()[-1])
    loaded, before, misses, compiles = seen["first compile"]
    assert not before and seen["import"][1]
    assert not {"jit_ahead.session", "jit_ahead.core.building.pool", "jit_ahead.triton.family"} & set(loaded), loaded
    assert misses == 1 and seen["import"][2:] == [misses, compiles]


def test_a_session_that_cannot_start_at_the_first_compile_leaves_that_launch_to_triton(tmp_path):
    env = dict(JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    broken = ("import jit_ahead.session as _s\n"
              "def _refuse(*a, **k):\n    raise OSError('injected: no session')\n"
              "_s.start = _refuse")
    out = run_raw(FIRST_COMPILE.format(break_start=broken), cwd=str(Path(__file__).parent.parent), **env)
    assert json.loads(out.stdout.strip().splitlines()[-1])[1:] == [False, False, False]
    lines = [line for line in out.stderr.splitlines() if "jit_ahead" in line]
    assert [line for line in lines if "could not start (OSError: injected: no session)" in line], lines
    assert list(tmp_path.joinpath("cache").rglob("*.cubin")), "Triton compiled the launch itself"


def test_a_hook_put_over_the_first_compile_arrangement_that_calls_it_neither_loops_nor_loses_the_session(tmp_path):
    # Another tool put its hook in Triton's slot after import and calls the one it found (jit_ahead's
    # first-compile function): that function handed the miss back to the slot, which called it again...
    code = FIRST_COMPILE.format(break_start=(
        "import triton\nfrom triton import knobs\nbelow = knobs.runtime.jit_cache_hook\ntheirs = []\n"
        "def chained(**kwargs):\n    theirs.append(kwargs['fn'].name)\n    return below(**kwargs)\n"
        "knobs.runtime.jit_cache_hook = chained"))
    env = dict(JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    out = run_raw(code, cwd=str(Path(__file__).parent.parent), **env)
    assert json.loads(out.stdout.strip().splitlines()[-1])[2:] == [1, 2]  # the session started and saw the miss


def test_a_hook_set_over_the_first_compile_arrangement_without_calling_it_does_not_keep_jit_ahead_off(tmp_path):
    # Another tool set Triton's slot after import without calling what it replaced: the first compile
    # never reached jit_ahead, which never started, and its exit line said "no compile in this process".
    code = FIRST_COMPILE.format(break_start=(
        "from triton import knobs\ntheirs = []\n"
        "def replacing(**kwargs):\n    theirs.append(kwargs['fn'].name)\n"
        "knobs.runtime.jit_cache_hook = replacing"))
    code += "print(json.dumps(theirs))\n"
    env = dict(JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    out = run_raw(code, cwd=str(Path(__file__).parent.parent), **env)
    started, theirs = out.stdout.strip().splitlines()[-2:]
    assert json.loads(started)[2:] == [1, 2]  # the session started at the first compile and saw it
    assert json.loads(theirs) == ["add_kernel"]  # and the tool's hook was called
    assert len([line for line in out.stderr.splitlines() if "another tool set Triton's jit_cache_hook" in line]) == 1


def test_a_session_started_before_triton_is_imported_says_one_line_and_does_not_wait_on_itself(tmp_path):
    # Starting the session imports Triton, whose import watcher started (or put off) a session again from
    # inside the first: with records that waited on the first's lock for ever; without, the line came twice.
    code = ("import json\nfrom jit_ahead import autostart\ns = autostart.start_session()\n"
            "print(json.dumps(sorted(s.families)))")
    for extra in ({}, {"JIT_AHEAD_RECORD_DIR": str(tmp_path / "records")}):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/",
                             env={**without_jit_ahead(os.environ),
                                  "JIT_AHEAD": "1", "JIT_AHEAD_TRITON_WORKERS": "0", **extra})
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == ["triton"]
        assert len([line for line in out.stderr.splitlines() if "jit_ahead on (JIT_AHEAD=1)" in line]) == 1, out.stderr


def test_where_the_first_compile_cannot_be_arranged_the_session_starts_at_once_and_says_so():
    code = ("import json\nfrom jit_ahead import registry\n"
            "registry.BUILTIN = tuple(registry.FamilyInfo(i.name, i.implementation, i.triggers, i.misses_are_calls,"
            " 'jit_ahead.no_such_module:arm' if i.first_use else '') for i in registry.BUILTIN)\n"
            "import triton, sys\nprint(json.dumps('jit_ahead.session' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/",
                         env={**without_jit_ahead(os.environ),
                              "JIT_AHEAD": "1", "JIT_AHEAD_TRITON_WORKERS": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) is True
    lines = out.stderr.splitlines()
    assert any("could not put off the session" in line and "no_such_module" in line for line in lines), lines
    assert len([line for line in lines if "jit_ahead on (JIT_AHEAD=1): triton" in line]) == 1, lines


def test_a_jit_ahead_module_that_imports_triton_first_still_gets_the_triton_family(tmp_path):
    # Before: with a record folder the session started inside that import, whose module was half-made when
    # the Triton family imported it again; the session ran with no family ("not available", one error line).
    code = ("from jit_ahead.triton.standin import ensure_driver; ensure_driver(); import jit_ahead, json; "
            "s = jit_ahead.current(); print(json.dumps(sorted(s.families)))")
    env = dict(JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS="0", JIT_AHEAD_RECORD_DIR=str(tmp_path / "records"),
               TRITON_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).parent.parent), env={**without_jit_ahead(os.environ), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["triton"]
    assert "not available" not in out.stderr
