import logging
import os
import subprocess
import sys
import json
import time
from pathlib import Path

import pytest

from . import scenarios  # noqa: F401  (imports fla before any stand-in driver exists)
from .kernels import basic

from jit_ahead.session import Session
from jit_ahead.triton.standin import ensure_driver

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def triton_cache(tmp_path, monkeypatch):
    """Each test gets an empty Triton cache, no saved plans or autotune choices, and kernels with empty
    in-memory caches."""
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.setenv("JIT_AHEAD_PLAN_DIR", str(tmp_path / "plans"))
    monkeypatch.setenv("JIT_AHEAD_TUNING_DIR", str(tmp_path / "tuning"))  # choices kept per test only
    ensure_driver()
    for value in vars(basic).values():
        jit_fn = getattr(value, "fn", None) if not hasattr(value, "device_caches") else value
        while jit_fn is not None and not hasattr(jit_fn, "device_caches"):
            jit_fn = getattr(jit_fn, "fn", None)
        if jit_fn is not None:
            jit_fn.device_caches.clear()
    return cache


@pytest.fixture
def session_factory():
    """Sessions started by a test are closed after it, whatever happens."""
    sessions = []

    def make(**triton_options) -> Session:
        session = Session(triton=triton_options).start()
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.close()


@pytest.fixture(scope="module")
def planning_session(tmp_path_factory):
    """One session for a test module's plans, planning only (no helper builds anything), with two
    planner processes and its own plan folder."""
    saved = {k: os.environ.get(k) for k in ("JIT_AHEAD_PLAN_DIR", "JIT_AHEAD_PLANNERS")}
    os.environ["JIT_AHEAD_PLAN_DIR"] = str(tmp_path_factory.mktemp("plans"))
    os.environ["JIT_AHEAD_PLANNERS"] = "2"
    session = Session(triton={"workers": 0}).start()
    yield session
    session.close()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def run_consumer(scenario: str, cache_dir: Path) -> list[dict]:
    """Run tests/consumer.py in a fresh interpreter on ``cache_dir``; return Triton's compile() events."""
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache_dir), PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, "-m", "tests.consumer", scenario], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("CONSUMER "))
    return json.loads(line[len("CONSUMER "):])


def without_jit_ahead(environ) -> dict:
    """``environ`` without jit_ahead's knobs, for a child process that sets its own; the test's folder
    for autotune choices stays, so that no test reads another's (or an earlier run's) choices."""
    return {k: v for k, v in environ.items() if not k.startswith("JIT_AHEAD") or k == "JIT_AHEAD_TUNING_DIR"}


def helper_running(pool, program: str, timeout: float = 120.0) -> int:
    """The pid of the pool's helper once a child process of it runs ``program`` (a build in progress)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in pool.helper_pids().values():
            try:
                if any(program in " ".join(c.cmdline()) for c in psutil.Process(pid).children(recursive=True)):
                    return pid
            except psutil.Error:  # a child gone between listing and reading it
                continue
        time.sleep(0.01)
    raise AssertionError(f"no helper ran {program} within {timeout}s")


def wait_all(tickets, timeout=600.0):
    for ticket in tickets:
        ticket.wait(timeout)
    return [t.result for t in tickets]


@pytest.fixture
def caplog_info(caplog):
    caplog.set_level(logging.INFO, logger="jit_ahead")
    return caplog


def import_probe(tmp_path, monkeypatch) -> tuple[str, object]:
    """A module that appends the pid of every process importing it to a file."""
    marker = tmp_path / "imported-by"
    module_dir = tmp_path / "mods"
    (module_dir / "tests_import_probe").mkdir(parents=True)
    (module_dir / "tests_import_probe" / "__init__.py").write_text(
        f"import os\nopen({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\n")
    monkeypatch.syspath_prepend(str(module_dir))  # helpers get the pool's sys.path
    return "tests_import_probe", marker


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs of the test's own (a real file system to fill up or make read-only; root cannot
    write past either); skipped where nothing can be mounted."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder) -> None:
    """Write into ``folder`` until its file system is full: every later write there fails with ENOSPC."""
    with open(os.path.join(folder, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass

