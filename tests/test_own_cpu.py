"""jit_ahead's own CPU time in the server's process: its threads and the session calls, each counted once,
in the stats log, the summary line and the coverage report."""
import json
import os
import threading
import time

from jit_ahead.core.observing import own_cpu
from jit_ahead.core.observing.own_cpu import OwnThread, spent

from .test_observability import run_with_stats_log


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def test_a_thread_of_jit_aheads_counts_its_cpu_while_it_runs_and_once_it_ended():
    kind = f"test-burner-{os.getpid()}-{time.monotonic_ns()}"
    go_on = threading.Event()

    def work():
        burn(0.3)
        go_on.wait(30)

    thread = OwnThread(target=work, name=kind + "-1", kind=kind, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while own_cpu.seconds().get(kind, 0) < 0.25:  # read through its CPU clock while it is alive
        assert time.monotonic() < deadline, own_cpu.seconds()
        time.sleep(0.02)
    go_on.set()
    thread.join(30)
    assert 0.25 <= own_cpu.seconds()[kind] < 1.0  # added at its end, and not also read as a live thread
    assert 0.25 <= own_cpu.seconds()[kind] < 1.0


def test_a_block_counts_under_its_own_name_and_not_again_in_its_thread_or_enclosing_block():
    tag = f"{os.getpid()}-{time.monotonic_ns()}"

    def work():
        burn(0.2)
        with spent(f"inner-{tag}"):
            burn(0.3)

    thread = OwnThread(target=work, name=f"thread-{tag}", daemon=True)
    thread.start()
    thread.join(30)
    with spent(f"outer-{tag}"):  # on a thread that is not jit_ahead's (the server's)
        burn(0.2)
        with spent(f"inner2-{tag}", also_without=True):
            burn(0.3)
    seconds = own_cpu.seconds()
    assert 0.15 < seconds[f"thread-{tag}"] < 0.28 and 0.25 < seconds[f"inner-{tag}"] < 0.4
    assert 0.15 < seconds[f"outer-{tag}"] < 0.28 and 0.25 < seconds[f"inner2-{tag}"] < 0.4
    # what a process without jit_ahead does too is listed, not counted as jit_ahead's own
    assert own_cpu.total() <= sum(seconds.values()) - seconds[f"inner2-{tag}"] + 0.01


def test_the_stats_log_the_summary_and_the_report_say_jit_aheads_own_cpu(monkeypatch, tmp_path, capsys):
    from jit_ahead.cli import main

    path = run_with_stats_log(monkeypatch, tmp_path)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    (own,) = [e for e in events if e["event"] == "own_cpu"]
    assert own["phase"] == "startup"  # said as serving starts, of the start
    assert own["own_s"] > 0 and "session start" in own["by_where"]
    assert any(where.startswith("jit_ahead-triton-slot") for where in own["by_where"])  # the pool's slot threads
    summary = next(e for e in events if e["event"] == "summary")
    # later, so no less; the summary gives hundredths (rounding keeps the order, not the last digit)
    assert summary["own CPU seconds in this process"] >= round(own["own_s"], 2)
    with open(path, "a") as f:  # a line edited by hand: not figures, left out of the report
        f.write(json.dumps({**own, "own_s": "lots", "time": own["time"] + 1}) + "\n")
    assert main(["report", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("jit_ahead's own CPU"))
    assert f"{own['own_s']:.2f} s (" in line


def test_a_report_of_a_log_whose_own_cpu_line_is_damaged_says_nothing_of_it(monkeypatch, tmp_path, capsys):
    from jit_ahead.cli import main

    path = run_with_stats_log(monkeypatch, tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for e in lines:
        if e["event"] == "own_cpu":
            e["by_where"] = {"planning": "a while"}
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "executor compiles after serving started: 0" in out and "own CPU" not in out

