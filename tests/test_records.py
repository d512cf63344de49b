"""Records (JIT_AHEAD_RECORD_DIR): every variant a process launched, replayed to helpers on the next start."""
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from jit_ahead.core.records import RecordFolder, rank_tag
from jit_ahead.triton import capture
from jit_ahead.triton.record import RecordedVariant, record_format

from .conftest import REPO, fill, without_jit_ahead
from .kernels import basic as k

TARGET = ("cuda", 90, 32)

SERVER = """
import json, sys
import triton  # JIT_AHEAD=1: the session starts here and reads the records
import jit_ahead
from jit_ahead.core.priority import Priority
from tests.scenarios import run_scenario

session = jit_ahead.current()
ready = session.wait_ready(timeout=600, priority=Priority.REPLAY)  # replayed builds are done
run_scenario("basic")
print("READY", json.dumps(ready))
"""


TUNING_SERVER = """
import json
import triton  # JIT_AHEAD=1: the session starts here and reads the records
import torch
import jit_ahead
from jit_ahead.triton.standin import ensure_driver
ensure_driver()
from tests.kernels import basic as k

session = jit_ahead.current()
x = torch.empty(4096, device="meta", dtype=torch.float16)
with session.families["triton"].capture() as plan:  # what planning asks helpers to build for this launch
    k.stored_tuning_kernel[(4,)](x, x, 4096)
planned = len(plan.requests)
session.wait_ready(timeout=600, priority=jit_ahead.Priority.REPLAY)  # the replayed choices' variants are built
for n in (4096, 1000):
    k.stored_tuning_kernel[(4,)](x, x, n)
chosen = sorted([list(key), str(config)] for key, config in k.stored_tuning_kernel.cache.items())
print("RESULT", json.dumps({"planned": planned, "benchmarked": len(k.BENCHMARKED), "chosen": chosen}))
"""


def serve_once(tmp_path, run: int, record_dir, script: str = SERVER) -> list[dict]:
    """One 'server' run with JIT_AHEAD=1 on an empty Triton cache; its stats log events."""
    stats = tmp_path / f"stats-{run}.jsonl"
    env = without_jit_ahead(os.environ)
    if record_dir is not None:
        env["JIT_AHEAD_RECORD_DIR"] = str(record_dir)
    env.update(JIT_AHEAD="1", JIT_AHEAD_STATS=str(stats),
               JIT_AHEAD_TRITON_WORKERS="1", TRITON_CACHE_DIR=str(tmp_path / f"cache-{run}"),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = [json.loads(line) for line in stats.read_text().splitlines()]
    if script is SERVER:
        assert "READY true" in proc.stdout
    else:
        events.append(json.loads(proc.stdout.split("RESULT ", 1)[1]))
    return events


def executor_compiles(events) -> list[str]:
    return [e["kernel"] for e in events if e["event"] == "compile" and not e["cache_hit"]]


def test_a_second_start_replays_the_first_ones_variants_and_compiles_nothing(tmp_path):
    records = tmp_path / "records"
    first = serve_once(tmp_path, 1, records)
    launched = {e["key"] for e in first if e["event"] == "executor_miss"}
    assert len(launched) >= 7  # basic_launches: 6 variants + every autotune config
    # the variants' file (the autotune choices have one of their own)
    (record,) = records.glob(f"triton-????????????????-{rank_tag()}.jsonl")
    assert oct(record.stat().st_mode & 0o777) == oct(0o600)
    header, *entries = [json.loads(line) for line in record.read_text().splitlines()]
    assert header["family"] == "triton" and header["target"] == list(TARGET) and header["triton_key"]
    assert {e["hash"] for e in entries} == launched

    second = serve_once(tmp_path, 2, records)  # an empty cache again
    (replay,) = [e for e in second if e["event"] == "replay"]
    assert replay["variants"] == len(launched) == replay["queued"]
    # the autotuner 'chose' on the stand-in, which times nothing: no config counts as only benchmarked, every
    # one is replayed as needed (with a real benchmark, see the next test, the others come last as SPARE)
    assert not [e for e in entries if e.get("benchmark_only")] and replay["benchmark_only"] == 0
    replayed_builds = [e for e in second if e["event"] == "build_start" and e["priority"] == "REPLAY"]
    assert {e["key"] for e in replayed_builds} == launched
    assert executor_compiles(second) == []
    assert {e["outcome"] for e in second if e["event"] == "executor_miss"} == {"disk"}
    assert len(record.read_text().splitlines()) == 1 + len(launched)  # nothing recorded twice


def test_a_second_start_uses_the_first_ones_autotune_choices_without_benchmarking(tmp_path):
    records = tmp_path / "records"
    *_, first = serve_once(tmp_path, 1, records, TUNING_SERVER)
    assert first["planned"] == 3  # nothing chosen yet: helpers build every config
    assert first["benchmarked"] == 6  # three configs for each of two tuning keys
    best = str(k.stored_tuning_kernel.configs[-1])
    assert first["chosen"] == [[[1000, "torch.float16", "torch.float16"], best],
                               [[4096, "torch.float16", "torch.float16"], best]]
    (tuning,) = records.glob("triton-autotune-*.jsonl")
    header, *entries = [json.loads(line) for line in tuning.read_text().splitlines()]
    assert header["family"] == "triton-autotune" and header["device"] and header["target"] == list(TARGET)
    assert sorted(e["key"][0] for e in entries) == [1000, 4096] and {e["best"] for e in entries} == {best}
    (variants,) = records.glob(f"triton-????????????????-{rank_tag()}.jsonl")
    _, *launched = [json.loads(line) for line in variants.read_text().splitlines()]
    # per tuning key, the chosen config's variant is needed again; the other two were only benchmarked
    assert len(launched) == 6 and sum(e.get("benchmark_only", False) for e in launched) == 4

    *events, second = serve_once(tmp_path, 2, records, TUNING_SERVER)  # an empty Triton cache again
    assert second["benchmarked"] == 0 and second["chosen"] == first["chosen"]
    assert second["planned"] == 1  # planning asks for the chosen config only
    (replayed,) = [e for e in events if e["event"] == "replay_autotune"]
    assert replayed["choices"] == 2
    (replay,) = [e for e in events if e["event"] == "replay"]
    assert replay["variants"] == 6 and replay["benchmark_only"] == 4
    spare = {e["key"] for e in events if e["event"] == "build_start" and e["priority"] == "SPARE"}
    assert spare <= {e["hash"] for e in launched if e.get("benchmark_only")}
    assert executor_compiles(events) == []
    assert len(tuning.read_text().splitlines()) == 3 and len(variants.read_text().splitlines()) == 7  # no repeats


# The choices are made after serving started (no tune-ahead): what a cold start's requests benchmarked.
TUNING_AFTER_READY = TUNING_SERVER.replace("for n in (4096, 1000):",
                                           "session.mark_serving(tune_ahead=False)\nfor n in (4096, 1000):")


def test_without_records_a_choice_made_after_ready_is_kept_and_the_next_start_benchmarks_nothing(
        tmp_path, monkeypatch):
    # Before, only JIT_AHEAD_RECORD_DIR kept choices: a warm start (issue 44: fla's own cache off) ran the
    # autotune benchmarks of the cold start's requests again.
    monkeypatch.delenv("JIT_AHEAD_RECORD_DIR", raising=False)
    tuning = tmp_path / "tuning"
    monkeypatch.setenv("JIT_AHEAD_TUNING_DIR", str(tuning))
    *events, first = serve_once(tmp_path, 1, None, TUNING_AFTER_READY)
    assert first["benchmarked"] == 6
    assert [e["phase"] for e in events if e["event"] == "autotune_bench"] == ["serving"] * 6
    (kept,) = tuning.glob("triton-autotune-*.jsonl")
    assert oct(kept.stat().st_mode & 0o777) == oct(0o600)
    assert not list(tuning.glob(f"triton-????????????????-{rank_tag()}.jsonl"))  # variants: only with records
    *events, second = serve_once(tmp_path, 2, None, TUNING_AFTER_READY)  # an empty Triton cache again
    assert second["benchmarked"] == 0 and second["chosen"] == first["chosen"]
    assert not [e for e in events if e["event"] == "autotune_bench"]
    # JIT_AHEAD_TUNING_DIR=0 keeps none: the next start benchmarks again
    monkeypatch.setenv("JIT_AHEAD_TUNING_DIR", "0")
    *_, third = serve_once(tmp_path, 3, None, TUNING_AFTER_READY)
    assert third["benchmarked"] == 6


# An autotuner with Triton's own benchmarker, launched while serving on the stand-in driver (no GPU), then
# planned again in the same process.
BLIND_SERVER = """
import json, os, pathlib
import triton
import torch
import jit_ahead
from jit_ahead.triton.standin import ensure_driver
ensure_driver()
from tests.kernels import basic as k

session = jit_ahead.current()
session.mark_serving(tune_ahead=False)
x = torch.empty(4096, device="meta", dtype=torch.float16)
k.tuned_copy_kernel[(4,)](x, x, 4096)  # 'benchmarks' its three configs on the stand-in
with session.families["triton"].capture() as plan:
    k.tuned_copy_kernel[(4,)](x, x, 4096)
timings = list(pathlib.Path(os.environ["TRITON_CACHE_DIR"]).rglob("*.autotune.json"))
print("RESULT", json.dumps({"planned": len(plan.requests), "timings_files": len(timings)}))
"""


def test_a_choice_made_on_the_stand_in_driver_is_neither_kept_nor_planned_from(tmp_path, monkeypatch):
    # Before, the stand-in's equal timings made the first config "the choice": it was kept as a real GPU's
    # (the tuning folder and Triton's timings file), and every later plan on this machine asked for that
    # config only (the demo planned 128 GatedDeltaNet variants instead of 400).
    monkeypatch.delenv("JIT_AHEAD_RECORD_DIR", raising=False)
    tuning = tmp_path / "tuning"
    monkeypatch.setenv("JIT_AHEAD_TUNING_DIR", str(tuning))
    for run in (1, 2):
        *events, result = serve_once(tmp_path, run, None, BLIND_SERVER)
        assert result == {"planned": 3, "timings_files": 0}
        assert not [e for e in events if e["event"] == "replay_autotune"]
    kept = [line for f in tuning.glob("triton-autotune-*.jsonl") for line in f.read_text().splitlines()[1:]]
    assert kept == []


def test_without_a_session_triton_stores_no_timings_from_the_stand_in(triton_cache):
    tuner = k.tuned_copy_kernel
    x = torch.empty(4096, device="meta", dtype=torch.float16)
    tuner.cache.clear()
    tuner.cache_results = True  # as a library that stores its choices in Triton's cache
    try:
        tuner[(4,)](x, x, 2048)
    finally:
        tuner.cache_results = False
        tuner.cache.clear()
    assert triton_cache.is_dir() and not list(triton_cache.rglob("*.autotune.json"))


def test_a_recorded_choice_for_changed_source_or_configs_is_not_used():
    from jit_ahead.triton.autotune import KnownChoices, TuningChoice, choice_of

    tuner = k.stored_tuning_kernel
    key, configs = (64, "torch.float32", "torch.float32"), tuner.configs
    tuner.cache[key] = configs[1]
    try:
        choice = choice_of(tuner, key, configs)
    finally:
        del tuner.cache[key]
    assert choice is not None and choice.best == str(configs[1])
    for variant, expected in ((choice, configs[1]),
                              (TuningChoice(**{**choice.__dict__, "source_key": "0" * 64}), None),
                              (TuningChoice(**{**choice.__dict__, "configs": choice.configs[:2]}), None)):
        known = KnownChoices()
        known.add([variant])
        assert known.config_for(tuner, key, configs) is expected
        assert known.config_for(tuner, (65, *key[1:]), configs) is None  # another tuning key


def planned_requests(blocks=(16, 32, 64)) -> list[RecordedVariant]:
    x = torch.empty(4096, device="meta", dtype=torch.float32)
    with capture() as planned:
        for block in blocks:
            k.add_kernel[(1,)](x, x, x, 4096, BLOCK=block)
    return [RecordedVariant(r) for r in planned.requests]


def test_records_of_all_ranks_merge_and_a_torn_line_is_skipped(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    fmt = record_format(TARGET)
    a, b, c = planned_requests()
    rank0, rank1 = RecordFolder(tmp_path, fmt, rank="rank0"), RecordFolder(tmp_path, fmt, rank="rank1")
    assert rank0.add([a, b]) == 2 and rank1.add([b, c]) == 2 and rank0.add([a]) == 0
    rank0.close()
    rank1.close()
    with open(rank1.path, "a") as f:
        f.write('{"module": "tests.kernels.basic", "qualname"')  # a crash mid-line
    merged = RecordFolder(tmp_path, fmt, rank="rank2").read()
    assert sorted(r.request.predicted_hash for r in merged) == sorted(r.request.predicted_hash for r in (a, b, c))
    assert merged[0] == next(r for r in (a, b, c) if r.request.predicted_hash == merged[0].request.predicted_hash)
    assert any("1 unusable line(s) skipped" in r.getMessage() for r in caplog.records)


def test_a_record_with_another_header_is_ignored_with_one_line(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    fmt = record_format(TARGET)
    old = RecordFolder(tmp_path, fmt.__class__(**{**fmt.__dict__, "header": {**fmt.header, "triton": "3.5.0"}}),
                       rank="rank0")
    old.add(planned_requests())
    other_target = RecordFolder(tmp_path, record_format(("cuda", 100, 32)), rank="rank0")
    other_target.add(planned_requests())
    assert RecordFolder(tmp_path, fmt).read() == []
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert any("does not match" in m and "triton: '3.5.0' here" in m for m in messages)
    assert any("does not match" in m and "target: ['cuda', 100, 32] here ['cuda', 90, 32]" in m for m in messages)


def one_record_and_another_ranks_path(folder, block: int):
    """A record of one variant written by rank0 in ``folder``: its format, the variant, and the path rank1's
    record would have there (for a fault to put in its place)."""
    fmt = record_format(TARGET)
    (good,) = planned_requests([block])
    RecordFolder(folder, fmt, rank="rank0").add([good])
    (written,) = list(folder.glob("triton-*.jsonl"))
    other = written.with_name(written.name.replace("rank0", "rank1"))
    assert other != written
    return fmt, good, other


def test_a_fifo_among_the_records_is_one_line_and_the_others_are_read(tmp_path, caplog):
    # opening a FIFO for reading waits for a writer: a start reading its records blocked on it forever
    import threading

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    fmt, good, fifo = one_record_and_another_ranks_path(tmp_path, 48)
    os.mkfifo(fifo, 0o600)
    found = []
    reader = threading.Thread(target=lambda: found.append(RecordFolder(tmp_path, fmt).read()), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "reading the records blocked on the FIFO"
    assert found == [[good]]
    assert [r for r in caplog.records if str(fifo) in r.getMessage() and "FIFO" in r.getMessage()]


def test_a_record_that_is_not_text_is_one_line_and_the_others_are_read(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    fmt, good, damaged = one_record_and_another_ranks_path(tmp_path, 80)
    damaged.write_bytes(b"\xff\xfe\x00 not text\n")
    assert RecordFolder(tmp_path, fmt).read() == [good]
    assert [r for r in caplog.records if str(damaged) in r.getMessage() and "not UTF-8" in r.getMessage()]


def test_a_record_larger_than_any_record_is_one_line_and_not_read(tmp_path, caplog):
    from jit_ahead.core import records

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    fmt, good, huge = one_record_and_another_ranks_path(tmp_path, 96)
    with open(huge, "wb") as f:  # a header line, then a hole the size of the cap: sparse, no disk used
        f.write(json.dumps({"jit_ahead_record": 1}).encode() + b"\n")
        f.truncate(records.MAX_RECORD_BYTES + 1)
    assert RecordFolder(tmp_path, fmt).read() == [good]
    assert [r for r in caplog.records if str(huge) in r.getMessage() and "more than any record" in r.getMessage()]


def test_autotune_choices_made_on_another_gpu_model_are_not_read(tmp_path, caplog):
    # timings from one GPU model say nothing about another: the header names the GPU
    from jit_ahead.triton import autotune

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    choice = autotune.TuningChoice("tests.kernels.basic", "stored_tuning_kernel", "source", (4096, "torch.float32"),
                                   ("BLOCK: 128", "BLOCK: 256"), "BLOCK: 256")
    RecordFolder(tmp_path, autotune.record_format(TARGET, "NVIDIA H200"), rank="rank0").add([choice])
    assert RecordFolder(tmp_path, autotune.record_format(TARGET, "NVIDIA A100-SXM4-80GB")).read() == []
    assert "does not match" in caplog.text and "NVIDIA A100-SXM4-80GB" in caplog.text
    assert RecordFolder(tmp_path, autotune.record_format(TARGET, "NVIDIA H200")).read() == [choice]


def test_entries_naming_no_importable_kernel_are_refused(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    fmt = record_format(TARGET)
    folder = RecordFolder(tmp_path, fmt, rank="rank0")
    (good,) = planned_requests([32])
    folder.add([good])
    folder.close()
    entry = fmt.encode(good)
    with open(folder.path, "a") as f:
        for bad in ({"module": "os; import evil"}, {"qualname": "../../x"}, {"hash": "zz"}):
            f.write(json.dumps({**entry, **bad}) + "\n")
    assert [r.request.predicted_hash for r in RecordFolder(tmp_path, fmt).read()] == [good.request.predicted_hash]
    assert any("3 unusable line(s)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("what", ["folder", "file"])
def test_records_other_users_can_write_are_refused(tmp_path, caplog, what):
    caplog.set_level(logging.ERROR, logger="jit_ahead")
    fmt = record_format(TARGET)
    folder = RecordFolder(tmp_path / "records", fmt, rank="rank0")
    folder.add(planned_requests([32]))
    folder.close()
    target = folder.folder if what == "folder" else folder.path
    target.chmod(0o777 if what == "folder" else 0o666)
    again = RecordFolder(tmp_path / "records", fmt, rank="rank1")
    assert again.read() == []
    (message,) = [r.getMessage() for r in caplog.records]
    assert "writable by group or others" in message and str(target) in message
    if what == "folder":
        assert not again.usable and again.add(planned_requests([64])) == 0
        assert not again.path.exists()


def test_variant_and_autotune_records_share_a_folder_without_reading_each_other(tmp_path, caplog):
    from jit_ahead.triton.autotune import TuningChoice
    from jit_ahead.triton.autotune import record_format as tuning_format

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    variants = RecordFolder(tmp_path, record_format(TARGET), rank="rank0")
    variants.add(planned_requests([32]))
    choice = TuningChoice("tests.kernels.basic", "stored_tuning_kernel", "0" * 64, (64, "torch.float32"),
                          ("BLOCK: 128",), "BLOCK: 128")
    tuning = RecordFolder(tmp_path, tuning_format(TARGET, "NVIDIA H200"), rank="rank0")
    tuning.add([choice])
    for folder in (variants, tuning):
        folder.close()
    assert len(RecordFolder(tmp_path, record_format(TARGET)).read()) == 1
    assert RecordFolder(tmp_path, tuning_format(TARGET, "NVIDIA H200")).read() == [choice]
    assert RecordFolder(tmp_path, tuning_format(TARGET, "NVIDIA H100")).read() == []  # timings of another GPU
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "device: 'NVIDIA H200' here 'NVIDIA H100'" in messages[0]


@pytest.fixture
def full_disk(small_tmpfs):
    """A small tmpfs, filled up: every write in it fails with ENOSPC."""
    (small_tmpfs / "records").mkdir(mode=0o700)
    fill(small_tmpfs)
    return small_tmpfs


def test_records_on_a_full_disk_are_one_line_and_recording_stops(full_disk, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    folder = RecordFolder(full_disk / "records", record_format(TARGET), rank="rank0")
    a, b, c = planned_requests()
    assert folder.add([a]) == 0 and folder.add([b, c]) == 0  # nothing raises
    folder.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "recording stops" in lines[0] and "No space left" in lines[0], lines


def test_recorded_choices_are_forgotten_when_their_session_closes(tmp_path, monkeypatch, session_factory):
    # They answered every later session's autotuners in this process, records or not.
    from jit_ahead.core.device_view import current
    from jit_ahead.triton import autotune
    from jit_ahead.triton.device import target_of

    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    monkeypatch.setenv("JIT_AHEAD_RECORD_DIR", str(records))
    view = current()
    folder = RecordFolder(records, autotune.record_format(target_of(view), view.name))
    folder.add([autotune.TuningChoice("tests.kernels.basic", "k", "source", (1,), ("a", "b"), "a")])
    folder.close()
    session = session_factory(workers=0)
    assert session.families["triton"].wait_replay(60) and autotune.KNOWN
    session.close()
    assert not autotune.KNOWN


def test_an_unusable_tuning_folder_is_one_line_naming_its_knob_and_autotuners_benchmark(
        tmp_path, monkeypatch, caplog, session_factory):
    monkeypatch.delenv("JIT_AHEAD_RECORD_DIR", raising=False)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the folder should be")
    monkeypatch.setenv("JIT_AHEAD_TUNING_DIR", str(blocked / "tuning"))
    session = session_factory(workers=1)
    assert session.families["triton"].wait_replay(60)
    lines = [r for r in caplog.records if "JIT_AHEAD_TUNING_DIR" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR and "cannot be used" in lines[0].getMessage()
    k.BENCHMARKED.clear()
    x = torch.empty(4096, device="meta", dtype=torch.float16)
    k.stored_tuning_kernel[(4,)](x, x, 4096)  # benchmarks as it would without jit_ahead, and runs
    assert len(k.BENCHMARKED) == 3


def test_a_planner_forked_while_the_stored_choices_are_read_does_not_wait_for_them():
    # A planner is forked from the server while its replay thread may still be reading the stored choices.
    # The fork has no such thread: a lookup there waited READ_WAIT_S for a read that never ends, at every
    # autotuned launch it planned.
    import time

    from jit_ahead.triton import autotune

    owner = object()
    autotune.KNOWN.expect(owner)
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the planner
            t0 = time.monotonic()
            autotune.KNOWN.config_for(k.stored_tuning_kernel, (4096, "torch.float16", "torch.float16"),
                                      k.stored_tuning_kernel.configs)
            os.write(write, f"{time.monotonic() - t0:.3f}".encode())
            os._exit(0)
        os.close(write)
        waited = float(os.read(read, 64).decode())
        os.waitpid(pid, 0)
    finally:
        autotune.KNOWN.forget(owner)
    assert waited < autotune.READ_WAIT_S / 4, waited
