"""Packaging and the main job."""
import re
import subprocess
import sys

import pytest

from .conftest import REPO


def test_the_core_never_imports_triton():
    code = ("import sys, jit_ahead, jit_ahead.core.building.pool, jit_ahead.core.building.executor, jit_ahead.session, "
            "jit_ahead.core.device_view, jit_ahead_helpers.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


def test_helpers_install_under_their_own_name():
    import jit_ahead_helpers.worker

    assert jit_ahead_helpers.worker.__file__.endswith("helpers/worker.py")
    assert subprocess.run([sys.executable, "-c", "import helpers"], capture_output=True, cwd="/").returncode != 0


def test_every_package_of_the_source_tree_is_installed():
    # pyproject lists its packages by name: a new one left out is missing from every non-editable install
    # (a GPU host's, CI's), where the family that imports it fails to start.
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "jit_ahead").rglob("__init__.py")}
    assert found - listed == set()


def run_demo(tmp_path, workers: str, **env):
    """The demo on the small Qwen3 + Liger model; (seconds since start, line) for each stdout line, as a
    person watching sees them, and the stderr lines."""
    import os
    import threading
    import time

    proc = subprocess.Popen([sys.executable, "-m", "jit_ahead.cli", "demo", "--workers", workers, "--cache-dir",
                             str(tmp_path), "--models", "qwen3-liger", "--max-num-tokens", "24", "--max-batch-size",
                             "2", "--max-seq-len", "24"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, **env})
    stderr = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    arrived = []
    t0 = time.monotonic()
    for line in proc.stdout:
        arrived.append((time.monotonic() - t0, line.rstrip("\n")))
    assert proc.wait(600) == 0, "".join(stderr)[-3000:]
    reader.join(60)
    return arrived, "".join(stderr).splitlines()


@pytest.mark.parametrize("start", ["server", "spawn"])
def test_demo_plans_a_liger_model_and_builds_everything_in_helpers(tmp_path, start):
    # spawned helpers are fresh interpreters: what they import must not print around jit_ahead's lines either
    arrived, lines = run_demo(tmp_path, "1", JIT_AHEAD_HELPER_START=start)
    out = "\n".join(line for _, line in arrived)
    planned = re.search(r"qwen3-liger: planned (\d+) variants", out)
    assert planned and int(planned.group(1)) > 0, out
    count = int(planned.group(1))
    assert f"built {count} of {count} variants" in out and f"cache: {tmp_path}" in out
    assert "liger_kernel.ops.rope._triton_rope" in out
    assert len(list(tmp_path.glob("*/__grp__*.json"))) == count
    # the libraries' own warnings come after jit_ahead's output, one line each, marked as theirs
    assert not any("Warning:" in line for line in lines if not line.startswith("  ")), lines
    notes = [i for i, line in enumerate(lines) if "notes from the kernel and model libraries" in line]
    assert len(notes) <= 1 and all(line.startswith("  ") for line in lines[notes[0] + 1:] if notes), lines


def test_demo_with_no_helpers_builds_every_variant_in_this_process(tmp_path):
    # --workers 0, as the README documents it: no helper, every variant built here after planning
    arrived, _ = run_demo(tmp_path, "0")
    out = "\n".join(line for _, line in arrived)
    count = int(re.search(r"qwen3-liger: planned (\d+) variants", out).group(1))
    assert f"built {count} of {count} variants" in out and "in this process (--workers 0)" in out
    assert len(list(tmp_path.glob("*/__grp__*.json"))) == count
    lines = [line for _, line in arrived]
    assert lines.index(next(l for l in lines if l.startswith("qwen3-liger: planned"))) < lines.index(
        next(l for l in lines if l.startswith("built ")))
    # again on the same cache: everything is on disk, and the table still lists every planned kernel (it
    # listed none, only what this run built)
    again = "\n".join(line for _, line in run_demo(tmp_path, "0")[0])
    assert "built 0 of 0 variants" in again and f"{count} were already on disk" in again
    row = next(line for line in again.splitlines() if line.startswith("liger_kernel.ops.rope._triton_rope"))
    assert int(row.split()[1]) > 0


def test_demo_checks_libraries_without_importing_them():
    # fla picks kernel source from the GPU it sees at import: imported before the driver, it planned other
    # variants than the helpers built (hash mismatches in the demo on a CPU-only machine)
    code = ("import sys, jit_ahead.cli as cli; "
            "print(cli._installed(['qwen3-liger', 'gated-deltanet']), 'fla' in sys.modules, 'liger_kernel' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split() == ["['qwen3-liger',", "'gated-deltanet']", "False", "False"]
