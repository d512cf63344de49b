"""A process that uses jit_ahead ends as it would without it, while planning and builds still run: with
its own status, within a second of its own work ending, never aborting, and leaving no planner, helper
or compiler process behind."""
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from .conftest import REPO

# mode, signal sent once the work is done, status; None: the status the same process has without jit_ahead
# (a KeyboardInterrupt ends Python by SIGINT, unless a library's excepthook prints it: then with status 1)
CASES = {
    "return from main": ("return", None, 0),
    "sys.exit(3)": ("exit3", None, 3),
    "SIGTERM": ("wait", signal.SIGTERM, None),
    "SIGINT": ("wait", signal.SIGINT, None),
}


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _start(mode: str, tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO), JIT_AHEAD_PLANNERS="1")
    stderr = open(tmp_path / f"stderr-{mode}.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "tests.exit_probe", mode], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=stderr, text=True)
    return proc, stderr


@dataclasses.dataclass
class Watched:
    """One probe run as the tests see it: when its lines came, when it ended, every descendant seen."""

    work_line: str = ""
    done_at: float | None = None
    closed_at: float | None = None  # jit_ahead's exit handler had run
    ended_at: float | None = None
    seen: set[int] = dataclasses.field(default_factory=set)


def _watch(proc, sig, watched: Watched) -> Watched:
    """Follow ``proc`` to its end, sampling its descendants, sending ``sig`` once its work is done. The
    plain run is watched the same way, so that both ends are timed under the same sampling load."""
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put((time.monotonic(), line)) for line in proc.stdout],
                              daemon=True)
    reader.start()

    def note(at: float, line: str) -> None:
        if line.startswith("WORK_DONE"):
            watched.seen |= _descendants(proc.pid)
            watched.work_line, watched.done_at = line, at
            if sig is not None:
                proc.send_signal(sig)
        elif line.startswith("JIT_AHEAD_CLOSED"):
            watched.closed_at = at

    deadline = time.monotonic() + 420
    while proc.poll() is None and time.monotonic() < deadline:
        watched.seen |= _descendants(proc.pid)
        try:
            note(*lines.get(timeout=0.05))
        except queue.Empty:
            continue
    proc.wait(timeout=30)
    watched.ended_at = time.monotonic()
    reader.join(timeout=5)
    while not lines.empty():  # what came after the last poll
        note(*lines.get())
    return watched


@pytest.fixture(scope="module")
def plain_exit_s(tmp_path_factory) -> float:
    """How long the same process without jit_ahead takes to end after its work (the interpreter tearing
    down torch and the kernel libraries): the slower of two runs, as that teardown alone varies by a
    good part of a second between runs on a loaded machine."""
    took = []
    for _ in range(2):
        proc, _ = _start("plain", tmp_path_factory.mktemp("plain"))
        watched = _watch(proc, None, Watched())
        took.append(watched.ended_at - watched.done_at)
    return max(took)


@pytest.fixture(scope="module")
def plain_status(tmp_path_factory) -> dict:
    """By signal, the status the process without jit_ahead ends with when it gets it after its work."""
    statuses = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc, _ = _start("plain-wait", tmp_path_factory.mktemp("plain-wait"))
        _watch(proc, sig, Watched())
        statuses[sig] = proc.returncode
    return statuses


@pytest.mark.parametrize("case", list(CASES))
def test_a_process_ends_with_its_own_status_promptly_and_leaves_nothing_behind(case, tmp_path, plain_exit_s,
                                                                                plain_status):
    mode, sig, status = CASES[case]
    if status is None:
        status = plain_status[sig]
        assert status in (-sig, 1), f"without jit_ahead the process ended with {status}"
    proc, stderr = _start(mode, tmp_path)
    watched = Watched()
    try:
        _watch(proc, sig, watched)
        done_at, closed_at, ended_at, seen = watched.done_at, watched.closed_at, watched.ended_at, watched.seen
        stderr.seek(0)
        errors = stderr.read()
        assert done_at is not None, errors[-3000:]
        assert "planning_done=False" in watched.work_line  # planners were still enumerating
        assert proc.returncode == status, errors[-3000:]
        assert "terminate called" not in errors and proc.returncode != -signal.SIGABRT
        # planners, the fork server and at least one helper were running when the work ended
        assert len(seen) >= 3, seen
        took = ended_at - done_at
        own = None if closed_at is None else closed_at - done_at
        print(f"{case}: ended {took:.2f}s after its work ({plain_exit_s:.2f}s without jit_ahead); "
              f"jit_ahead's exit handler done after {'-' if own is None else f'{own:.2f}'}s")
        if sig != signal.SIGTERM:  # SIGTERM's default action ends the process without exit handlers
            assert own is not None, "jit_ahead's exit handler did not finish (or the probe's did not run)"
            assert own < 1.0, f"jit_ahead's exit handler took until {own:.2f}s after the work ended"
        assert took < plain_exit_s + 1.0, f"exit took {took:.2f}s after the work ended ({plain_exit_s:.2f}s without jit_ahead)"
        time.sleep(1.0)  # a child that watches its parent notices within this
        left = [pid for pid in seen if _alive(pid)]
        assert not left, [(pid, psutil.Process(pid).cmdline()) for pid in left]
    finally:  # a failed assert above must not leave the probe's forks to the tests that follow
        for pid in watched.seen | {proc.pid}:
            try:
                child = psutil.Process(pid)
                if "tests.exit_probe" in " ".join(child.cmdline()):  # not a process that reused the pid
                    child.kill()
            except psutil.Error:
                pass
