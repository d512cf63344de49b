"""The ``jit-ahead`` command as a person meets it: bad input is one line on stderr and a non-zero exit."""
import os
import subprocess
import sys

import pytest

from jit_ahead.cli import main

from .conftest import REPO


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "jit_ahead.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("content", [bytes(range(256)) * 8, b"hello\nthis is a text file\n", b"",
                                     b'{"event": "x"}\n[1, 2]\n'],
                         ids=["binary", "text", "empty", "json-but-no-event"])
def test_report_refuses_what_is_not_a_stats_log(tmp_path, capsys, content):
    path = tmp_path / "input.jsonl"
    path.write_bytes(content)
    assert main(["report", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert one_line(err).startswith(f"jit-ahead report: {path} is not a jit_ahead stats log")


def test_report_names_the_file_it_cannot_read_or_write(tmp_path, capsys):
    log = tmp_path / "stats.jsonl"
    log.write_text('{"event": "phase", "time": 1.0, "phase": "serving"}\n')
    missing = tmp_path / "missing.jsonl"
    assert main(["report", str(missing)]) == 2
    assert one_line(capsys.readouterr().err) == f"jit-ahead report: cannot read {missing}: No such file or directory"
    page = tmp_path / "no-such-folder" / "report.html"
    assert main(["report", str(log), "--html", str(page)]) == 2
    assert one_line(capsys.readouterr().err) == f"jit-ahead report: cannot write {page}: No such file or directory"
    assert main(["report", str(log)]) == 0  # the same log is fine: the output was the problem


@pytest.mark.parametrize("args, names", [
    (["--models", "llama"], "unknown model llama; choose from qwen3-liger, gated-deltanet, qwen35-hybrid"),
    (["--models", "qwen3-liger,llama"], "unknown model llama"),
    (["--target", "foo"], "bad target 'foo'"),
    (["--target", "rocm:90"], "bad target 'rocm:90'"),
    (["--target", "cuda:9000"], "bad target 'cuda:9000'"),
    (["--workers", "-3"], "'-3' is not a helper count"),
    (["--max-batch-size", "0"], "'0' is not a batch size from 1"),
    (["--max-num-tokens", "lots"], "'lots' is not a token count"),
])
def test_demo_arguments_are_checked_before_anything_runs(args, names):
    done = run_cli("demo", *args)
    assert done.returncode == 2 and done.stdout == ""
    # argparse's usage line, then one line naming the problem and the valid values
    assert "Traceback" not in done.stderr and names in done.stderr.splitlines()[-1], done.stderr


def test_a_bad_target_in_the_environment_is_the_same_one_line():
    env = {**os.environ, "JIT_AHEAD_TARGET": "sm90"}
    done = subprocess.run([sys.executable, "-m", "jit_ahead.cli", "demo"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env=env)
    assert done.returncode == 2 and "bad target 'sm90'" in done.stderr.splitlines()[-1], done.stderr


def test_demo_help_shows_the_defaults():
    done = run_cli("demo", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "(default: cuda:90)" in text and "(default: 256)" in text and "(default: 4)" in text


def _requests(n):
    from jit_ahead.core.requests import BuildRequest

    return [BuildRequest(family="test", key=f"{i:064x}", payload=None, label=f"variant {i}", modules=())
            for i in range(n)]


def test_build_progress_prints_counts_and_an_eta_in_plain_lines_and_as_a_bar():
    import io
    import time

    from jit_ahead.core.priority import Priority
    from jit_ahead.core.requests import BuildResult
    from jit_ahead.core.building.table import RequestTable
    from jit_ahead.progress import BuildProgress

    for bar in (False, True):
        table = RequestTable()
        tickets = [table.submit(r, Priority.BACKGROUND) for r in _requests(4)]
        stream = io.StringIO()
        with BuildProgress(table, stream=stream, every=0.05, bar=bar) as progress:
            first = table.take_next("helper-0", 1.0)
            table.finish(first, BuildResult(first.key, True, 0.1, "helper-0"))
            table.take_next("helper-0", 1.0)  # building
            time.sleep(0.3)
            assert progress.status().startswith("built 1 of 4, 2 queued, 1 building, 0 failed")
            assert "ETA" in progress.status()
            for ticket in tickets:
                if ticket.state.value != "done":
                    table.claim(ticket, "helper-0")
                    table.finish(ticket, BuildResult(ticket.key, True, 0.1, "helper-0"))
        text = stream.getvalue()
        if bar:
            assert "4/4" in text, text
        else:
            assert "jit_ahead: built 1 of 4, 2 queued, 1 building, 0 failed" in text, text
