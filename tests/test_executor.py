"""The executor side: a launch that misses in memory loads, waits or builds in place, never twice."""
import logging
import threading
import time

import psutil
import pytest
import torch
from triton import knobs

from jit_ahead.core.priority import Priority
from jit_ahead.core.building.table import State
from jit_ahead.triton import capture

from .kernels import basic as k


def meta(n=4096, dtype=torch.float32):
    return torch.empty(n, device="meta", dtype=dtype)


class CompileEvents:
    """Triton's own compilation listener: what compile() did in this process."""

    def __init__(self):
        self.events = []

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit, **kwargs):
        self.events.append((src.name, metadata["hash"], cache_hit))

    def __enter__(self):
        self.previous, knobs.compilation.listener = knobs.compilation.listener, self
        return self

    def __exit__(self, *exc):
        knobs.compilation.listener = self.previous


def slow_request(steps: int):
    with capture() as planned:
        k.slow_kernel.warmup(meta(1024), STEPS=steps, BLOCK=1024, grid=(1,))
    (request,) = planned.requests
    return request


def wait_state(ticket, predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate(ticket):
        assert time.monotonic() < deadline, f"ticket stuck in {ticket.state} ({ticket.owner})"
        time.sleep(0.01)


def test_a_real_launch_is_never_skipped_and_a_jit_function_argument_works(session_factory):
    session = session_factory(workers=1)
    x = meta(4096, torch.float16)
    with CompileEvents() as compiles:
        kernel = k.apply_kernel[(4,)](x, x, 4096, ACT=k.relu, BLOCK=512)
    assert kernel is not None and kernel.hash  # the launch went through (the stand-in runs it as a no-op)
    # The miss was built once (by a helper, or in place while the helper was still starting) and
    # Triton's own compile() then loaded it from disk.
    assert [hit for _, _, hit in compiles.events] in ([True], [False, True])
    assert session.stats.count("build_finish") == 1


def test_two_threads_racing_on_one_variant_cause_one_build(session_factory):
    session = session_factory(workers=1)
    barrier = threading.Barrier(2)
    kernels = []

    def launch():
        barrier.wait()
        kernels.append(k.slow_kernel[(1,)](meta(1024), STEPS=3, BLOCK=256))

    with CompileEvents() as compiles:
        threads = [threading.Thread(target=launch) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert len(kernels) == 2 and all(kernel is not None for kernel in kernels)
    assert session.stats.count("build_finish") == 1
    assert sum(not hit for _, _, hit in compiles.events) <= 1  # at most the one in-place build
    assert len({h for _, h, _ in compiles.events}) == 1


def test_kill_9_of_a_helper_mid_build_releases_the_waiting_launch_at_once(session_factory):
    session = session_factory(workers=1)
    pool = session.families["triton"].pool
    request = slow_request(steps=14)  # several seconds of compile on these CPUs
    (ticket,) = session.families["triton"].submit([request], Priority.BACKGROUND)
    wait_state(ticket, lambda t: t.state is State.RUNNING and t.owner == "helper-0")
    done = []
    launcher = threading.Thread(target=lambda: done.append(
        k.slow_kernel[(1,)](meta(1024), STEPS=14, BLOCK=1024)))
    launcher.start()
    time.sleep(0.3)
    assert ticket.state is State.RUNNING and ticket.owner == "helper-0"  # the launch is waiting on it
    psutil.Process(pool.helper_pids()["helper-0"]).kill()
    killed_at = time.monotonic()
    wait_state(ticket, lambda t: t.owner == "executor" or t.state is not State.RUNNING, timeout=10)
    assert time.monotonic() - killed_at < 1.0  # not after JIT_AHEAD_WAIT_TIMEOUT_S
    launcher.join(300)
    assert done and done[0] is not None
    assert ticket.state is State.DONE and ticket.result.builder == "executor" and ticket.crashes == 1
    assert session.stats.count("helper_crash") == 1


def test_an_unplanned_miss_builds_in_place_and_helpers_get_its_library_for_later_builds(session_factory):
    session = session_factory(workers=1)
    pool = session.families["triton"].pool
    events = []
    session.stats.subscribe(events.append)
    # Nothing is queued, so no helper runs: the miss builds in place at once (a helper would first have
    # to start and import the kernel's library, seconds, where this process has it imported).
    first = k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=32)
    assert pool.table.get(first.hash).result.builder == "executor"
    assert not [e for e in events if e["event"].endswith("_ready")]
    # The miss named the kernel's module: the fork server that later work starts imports it once, before
    # it forks the helper that builds that work.
    with capture() as plan:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=64)
    (ticket,) = session.families["triton"].submit(plan, Priority.BACKGROUND)
    assert ticket.wait(120) is State.DONE and ticket.result.builder == "helper-0"
    assert [e["modules"] for e in events if e["event"] == "forkserver_preloaded"] == [1]


def test_no_helpers_means_misses_build_in_place(session_factory):
    session = session_factory(workers=0)
    kernel = k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=128)
    assert kernel is not None
    (ticket,) = [session.families["triton"].pool.table.get(kernel.hash)]
    assert ticket.state is State.DONE and ticket.result.builder == "executor"


def test_a_miss_inside_an_autotuner_raises_the_other_configs_of_its_tuning_key(session_factory):
    session = session_factory(workers=0)  # only the executor builds: what it does not take stays queued
    events = []
    session.stats.subscribe(events.append)
    n = 5555  # a tuning key no other test chose a config for
    with capture() as plan:
        k.stored_tuning_kernel[(1,)](meta(n), meta(n), n)
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=64)
    (group,) = plan.autotune_groups
    assert len(group) == 3 and set(group) < {r.predicted_hash for r in plan.requests}
    (other,) = [r.predicted_hash for r in plan.requests if r.predicted_hash not in group]
    session.families["triton"].submit(plan, Priority.BACKGROUND)
    table = session.families["triton"].pool.table

    k.stored_tuning_kernel[(1,)](meta(n), meta(n), n)  # its autotuner launches each config in turn
    misses = [e for e in events if e["event"] == "executor_miss" and e["key"] in group]
    assert [e["key"] for e in misses] == list(group)
    assert misses[0]["siblings_raised"] == 3  # the missed config and the two the benchmark launches next
    assert all(table.get(key).priority is Priority.URGENT and table.get(key).state is State.DONE for key in group)
    assert table.get(other).priority is Priority.BACKGROUND and table.get(other).state is State.QUEUED


def test_an_autotuned_launch_whose_configs_were_captured_before_still_names_them_as_its_group():
    # two tuning keys of one argument specialization request the same three variants: the second launch
    # finds them in the capture's in-memory cache and must still list them as the configs it benchmarks
    with capture() as plan:
        k.stored_tuning_kernel[(1,)](meta(6001), meta(6001), 6001)
        first = plan.autotune_groups
        k.stored_tuning_kernel[(1,)](meta(6003), meta(6003), 6003)
    assert len(plan.requests) == 3 and len(first) == 1 and len(first[0]) == 3
    assert plan.autotune_groups == first


def test_a_wait_longer_than_the_timeout_falls_back_to_triton(session_factory, caplog):
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    session = session_factory(workers=1, wait_timeout=0.3)
    request = slow_request(steps=10)
    (ticket,) = session.families["triton"].submit([request], Priority.BACKGROUND)
    wait_state(ticket, lambda t: t.state is State.RUNNING and t.owner == "helper-0")
    kernel = k.slow_kernel[(1,)](meta(1024), STEPS=10, BLOCK=1024)
    assert kernel is not None
    assert any("JIT_AHEAD_WAIT_TIMEOUT_S" in r.getMessage() for r in caplog.records)


def test_a_disk_hit_needs_no_build(session_factory):
    session = session_factory(workers=1)
    with capture() as planned:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=64)
    for ticket in session.families["triton"].submit(planned):
        ticket.wait(120)
    builds = session.stats.count("build_finish")
    with CompileEvents() as compiles:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=64)
    assert [hit for _, _, hit in compiles.events] == [True]
    assert session.stats.count("build_finish") == builds


def test_a_hook_installed_before_ours_is_chained_and_its_veto_respected(session_factory):
    from jit_ahead.triton import hook

    session = session_factory(workers=0)
    seen = []

    def other_hook(*, key, fn, compile, **kwargs):
        seen.append(fn.name)
        return fn.name == "tuned_copy_kernel"  # another tool's own capture of this kernel

    knobs.runtime.jit_cache_hook = other_hook  # someone replaced the slot after we installed
    hook.install()  # ours again, chaining theirs
    try:
        assert k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=32) is not None
        assert k.tuned_copy_kernel.fn.run(meta(), meta(), 4096, BLOCK=64, grid=(1,), warmup=False) is None
    finally:
        hook.release()
        knobs.runtime.jit_cache_hook = None
        hook.install()  # back to ours alone (the session still holds it)
        hook.release()
    assert seen == ["add_kernel", "tuned_copy_kernel"]
    assert session.stats.count("build_finish") == 1  # the vetoed launch caused no build


HOLD_THE_LOCK = """
import sys, time
from jit_ahead.core.building.build_lock import variant_lock
with variant_lock(sys.argv[1], "held by the test", timeout=30) as held:
    print("HELD" if held else "NOT HELD", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("builder", ["in place", "helper"])
def test_a_stopped_process_holding_a_variants_build_lock_holds_no_launch_past_the_wait_timeout(
        session_factory, monkeypatch, caplog, builder):
    # Another process (a rank's helper) took the variant's build lock and was stopped (SIGSTOP) while
    # building: the lock is never released. A launch here waited in the lock with no bound.
    import os
    import signal
    import subprocess
    import sys

    from .conftest import REPO

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_WAIT_TIMEOUT_S", "2")
    with capture() as planned:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=2048)
    (request,) = planned.requests
    lock = os.path.join(knobs.cache.dir, "jit_ahead_locks", f"{request.predicted_hash}.lock")
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, lock], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "HELD"
        holder.send_signal(signal.SIGSTOP)
        session = session_factory(workers=0 if builder == "in place" else 1)
        events = []
        session.stats.subscribe(events.append)
        if builder == "helper":
            (ticket,) = session.families["triton"].submit([request], Priority.WARMUP)
            assert ticket.wait(60) is State.DONE, ticket.result and ticket.result.error
            assert ticket.result.builder == "helper-0"
        else:
            done = threading.Event()

            def launch():
                k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=2048)
                done.set()

            threading.Thread(target=launch, daemon=True).start()
            assert done.wait(60), "the launch is still waiting for the stopped process's lock"
            assert [e["outcome"] for e in events if e["event"] == "executor_miss"] == ["built_here"]
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    if builder == "in place":  # a helper's line goes to its own stderr
        (line,) = [r.getMessage() for r in caplog.records if "build lock" in r.getMessage()]
        assert f"held by pid {holder.pid} (stopped" in line and "after 2s" in line


def _corrupt(folder, how: str) -> None:
    import json
    import os

    cubin, metadata, ptx, group = (os.path.join(folder, n) for n in ("add_kernel.cubin", "add_kernel.json",
                                                                      "add_kernel.ptx", "__grp__add_kernel.json"))
    if how == "truncated cubin":
        data = open(cubin, "rb").read()
        open(cubin, "wb").write(data[: len(data) // 2])
    elif how == "empty cubin":
        open(cubin, "wb").close()
    elif how == "flipped byte in cubin":
        data = bytearray(open(cubin, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(cubin, "wb").write(bytes(data))
    elif how == "not an ELF":
        data = bytearray(open(cubin, "rb").read())
        data[:4] = b"\0\0\0\0"
        open(cubin, "wb").write(bytes(data))
    elif how == "truncated metadata":
        text = open(metadata).read()
        open(metadata, "w").write(text[: len(text) // 2])
    elif how == "other num_warps":
        data = json.load(open(metadata))
        data["num_warps"] = 8 if data["num_warps"] != 8 else 4
        json.dump(data, open(metadata, "w"))
    elif how == "damaged group file":
        open(group, "w").write("{\"child_paths\": ")
    elif how == "a file of the group deleted":
        os.remove(ptx)
    else:
        raise AssertionError(how)


DAMAGE = ["truncated cubin", "empty cubin", "flipped byte in cubin", "not an ELF", "truncated metadata",
          "other num_warps", "damaged group file", "a file of the group deleted"]


def test_damaged_cache_entries_are_removed_and_rebuilt_once_and_never_load(session_factory, caplog):
    # Built by helpers, then damaged on disk as a full disk, a crash or a stray write would: each must be
    # found before Triton loads it, removed and built again, never counted as a disk hit.
    import os

    from jit_ahead.triton import cache_check

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    blocks = [2 ** (4 + i) for i in range(len(DAMAGE))]
    with capture() as planned:
        for block in blocks:
            k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=block)
    session = session_factory(workers=1)
    events = []
    session.stats.subscribe(events.append)
    assert all(t.wait(120) is State.DONE for t in session.families["triton"].submit(planned.requests, Priority.WARMUP))
    originals = {}
    for request, how in zip(planned.requests, DAMAGE):
        folder = cache_check.folder_of(request.predicted_hash)
        originals[request.predicted_hash] = {n: open(os.path.join(folder, n), "rb").read()
                                             for n in ("add_kernel.json", "add_kernel.cubin")}
        _corrupt(folder, how)
    with CompileEvents() as compiles:
        for block in blocks:
            k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=block)  # none raises
    damaged = [e for e in events if e["event"] == "cache_damaged"]
    assert sorted(e["key"] for e in damaged) == sorted(originals) and all(e["rebuilt"] for e in damaged)
    assert not [e for e in events if e["event"] == "executor_miss" and e["outcome"] == "disk"]
    lines = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(lines) == len(DAMAGE), lines
    for request in planned.requests:  # rebuilt as it was, and what Triton loaded is that rebuild
        folder = cache_check.folder_of(request.predicted_hash)
        assert cache_check.check(request.predicted_hash, request.name, 90)[0] is cache_check.Entry.OK
        for name, data in originals[request.predicted_hash].items():
            assert open(os.path.join(folder, name), "rb").read() == data, name
    assert {h for _, h, _ in compiles.events} == set(originals)
    # Damaged again after its rebuild: removed once more, and Triton's own compile makes it; no third build.
    first = planned.requests[0]
    _corrupt(cache_check.folder_of(first.predicted_hash), "truncated metadata")
    k.add_kernel.device_caches.clear()
    k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=blocks[0])
    again = [e for e in events if e["event"] == "cache_damaged"][len(DAMAGE):]
    assert [(e["key"], e["rebuilt"]) for e in again] == [(first.predicted_hash, False)]
    assert any("damaged again after a rebuild" in r.getMessage() for r in caplog.records)


def test_an_entry_found_sound_is_not_read_again_until_one_of_its_files_changes(session_factory, monkeypatch):
    # A warm start checks each entry when the saved plan is read, when the records are replayed and at the
    # first launch; reading and hashing every file each time is most of what a warm start costs beyond
    # a plain one. Once sound, an entry is answered from its files' identities until one of them changes.
    import os
    import shutil
    import time

    from jit_ahead.triton import cache_check

    with capture() as planned:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=256)
    (request,) = planned.requests
    session = session_factory(workers=1)
    assert all(t.wait(120) is State.DONE for t in session.families["triton"].submit(planned.requests, Priority.WARMUP))
    digests = []
    original = cache_check._digest
    monkeypatch.setattr(cache_check, "_digest", lambda path: digests.append(path) or original(path))

    def check(thorough=True):
        digests.clear()
        return cache_check.check(request.predicted_hash, request.name, 90, thorough)[0]

    folder = cache_check.folder_of(request.predicted_hash)
    cubin = os.path.join(folder, "add_kernel.cubin")
    data = open(cubin, "rb").read()
    def stamp(when):
        for name in os.listdir(folder):
            os.utime(os.path.join(folder, name), (when, when))

    stamp(time.time() + 30)  # as if just written (time ahead: no wait can make it settled)
    assert check() is cache_check.Entry.OK and digests  # too fresh to be remembered
    assert check() is cache_check.Entry.OK and digests
    aged = time.time() - 60
    stamp(aged)
    assert check() is cache_check.Entry.OK and digests
    assert check() is cache_check.Entry.OK and digests == []  # nothing read again
    shutil.copyfile(cubin, cubin + ".copy")
    os.replace(cubin + ".copy", cubin)  # the same bytes in a new file: read and hashed again, still sound
    assert check() is cache_check.Entry.OK and digests
    os.utime(cubin, (aged, aged))
    assert check() is cache_check.Entry.OK and digests
    assert check() is cache_check.Entry.OK and digests == []
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    with open(cubin, "r+b") as f:  # in place, the size kept: its modification time changes
        f.write(bytes(flipped))
    # the quick pass (replayed records) reads no contents: it misses this; the full check does not
    assert check(thorough=False) is cache_check.Entry.OK and digests == []
    assert check() is cache_check.Entry.DAMAGED
    with open(cubin, "ab") as f:  # a size other than the manifest's: the quick pass sees it
        f.write(b"\0")
    assert check(thorough=False) is cache_check.Entry.DAMAGED and digests == []
    os.remove(os.path.join(folder, "add_kernel.ptx"))
    assert check(thorough=False) is cache_check.Entry.DAMAGED
    assert check() is cache_check.Entry.DAMAGED


CHECK_IN_NEW_PROCESS = """
import json, sys
from jit_ahead.triton import cache_check
read = []
original = cache_check._digest
cache_check._digest = lambda path: read.append(path) or original(path)
entry, why = cache_check.check(sys.argv[1], sys.argv[2], 90)
cache_check.save_checked()
print("CHECKED", json.dumps([entry.value, why, len(read)]))
"""


def check_in_new_process(request) -> tuple[str, str, int]:
    """The entry's full check in a fresh process on this cache: (outcome, why, files hashed); it then
    keeps what it found sound, as a session does."""
    import json
    import os
    import subprocess
    import sys

    from .conftest import REPO

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-c", CHECK_IN_NEW_PROCESS, request.predicted_hash, request.name],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("CHECKED "))
    return tuple(json.loads(line[8:])), proc.stderr


def test_what_one_process_found_sound_the_next_checks_without_reading_it(session_factory, triton_cache):
    # A warm start at the large limits read and hashed every file of its 1,172 planned entries when it read
    # the saved plan (0.49 s on an H100 host), though the start before had found each of them sound.
    import json
    import os
    import time

    from jit_ahead.triton import cache_check

    with capture() as planned:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=256)
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=512)
    first, second = planned.requests
    session = session_factory(workers=1)
    assert all(t.wait(120) is State.DONE for t in session.families["triton"].submit(planned.requests, Priority.WARMUP))
    folders = [cache_check.folder_of(r.predicted_hash) for r in planned.requests]
    aged = time.time() - 60  # settled: file times advance in coarse steps
    for folder in folders:
        for name in os.listdir(folder):
            os.utime(os.path.join(folder, name), (aged, aged))
    session.families["triton"].submit(planned.requests, Priority.WARMUP)  # as a warm start reads its saved plan
    kept = triton_cache / cache_check.CHECKED
    assert len(json.loads(kept.read_text())["entries"]) == 2
    (outcome, _, hashed), _ = check_in_new_process(first)
    assert (outcome, hashed) == ("ok", 0)  # a few stat calls, no file read
    # a file that changed since (its size, time or inode) is checked in full, and damage is found
    cubin = os.path.join(folders[0], "add_kernel.cubin")
    data = bytearray(open(cubin, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(cubin, "r+b") as f:
        f.write(bytes(data))
    (outcome, why, hashed), _ = check_in_new_process(first)
    assert outcome == "damaged" and "SHA-256" in why and hashed
    # an entry removed (here by hand) is dropped from the kept list at the next save
    import shutil

    shutil.rmtree(folders[0])
    (outcome, _, hashed), _ = check_in_new_process(second)
    assert (outcome, hashed) == ("ok", 0)
    session.families["triton"].submit([second], Priority.WARMUP)  # nothing new found sound: the file is as it was
    cache_check._unsaved.add(str(triton_cache))
    cache_check.save_checked()
    assert [e[0] for e in json.loads(kept.read_text())["entries"]] == [os.path.basename(folders[1])]


@pytest.mark.parametrize("damage", ["garbage", "other shape", "no files", "a path outside", "Infinity", "deep",
                                    "huge", "a folder", "a FIFO"])
def test_a_damaged_list_of_checked_entries_is_named_once_ignored_and_written_again(session_factory, triton_cache,
                                                                                  damage):
    import json
    import os
    import time

    from jit_ahead.triton import cache_check

    with capture() as planned:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=256)
    (request,) = planned.requests
    session = session_factory(workers=1)
    assert all(t.wait(120) is State.DONE for t in session.families["triton"].submit(planned.requests, Priority.WARMUP))
    folder = cache_check.folder_of(request.predicted_hash)
    aged = time.time() - 60
    for name in os.listdir(folder):
        os.utime(os.path.join(folder, name), (aged, aged))
    kept = triton_cache / cache_check.CHECKED
    if damage == "garbage":
        kept.write_bytes(b"\xff\xfe not json")
    elif damage == "other shape":
        kept.write_text(json.dumps({"jit_ahead_checked": 1, "entries": [["../x", 1, 2, 3]]}))
    elif damage in ("no files", "a path outside", "Infinity"):  # an entry that would answer without a look
        files = {"no files": [], "a path outside": [["../../outside", 1, 2, 3]],
                 "Infinity": [["add_kernel.cubin", float("inf"), 2, 3]]}[damage]
        kept.write_text(json.dumps({"jit_ahead_checked": 1,
                                    "entries": [[os.path.basename(folder), request.name, 90, files]]}))
    elif damage == "deep":
        kept.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "huge":
        with open(kept, "wb") as f:  # sparse: no disk used
            f.truncate(cache_check.MAX_CHECKED_BYTES + 1)
    elif damage == "a FIFO":  # reading it would block the check for ever
        os.mkfifo(kept)
    else:  # neither read nor replaced: the save fails, quietly, and the start goes on
        kept.mkdir()
    (outcome, _, hashed), stderr = check_in_new_process(request)
    assert outcome == "ok" and hashed  # checked in full
    lines = [l for l in stderr.splitlines() if str(kept) in l]
    unreadable = damage in ("a folder", "a FIFO")
    assert len(lines) == 1 and ("cannot be read" if unreadable else "damaged") in lines[0], stderr[-2000:]
    if damage == "a folder":
        assert kept.is_dir() and not [p for p in triton_cache.iterdir() if p.name.startswith(f".{kept.name}")]
    else:
        assert len(json.loads(kept.read_text())["entries"]) == 1  # written again, whole



def test_a_damaged_planned_entry_is_no_planning_gap_and_planning_again_rebuilds_it(session_factory, monkeypatch,
                                                                                    caplog):
    # Found damaged at a launch after serving started, it was reported (and, with JIT_AHEAD_MODE=error,
    # refused) as "not planned"; planning the same variants again took the damaged entry for a built one.
    import os

    from jit_ahead.core.building.executor import JitAfterReadyError
    from jit_ahead.triton import cache_check

    caplog.set_level(logging.WARNING, logger="jit_ahead")
    monkeypatch.setenv("JIT_AHEAD_MODE", "error")
    with capture() as planned:
        for block in (64, 128):
            k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=block)
    first, second = planned.requests
    session = session_factory(workers=1)
    assert all(t.wait(120) is State.DONE for t in session.families["triton"].submit(planned.requests, Priority.WARMUP))
    session.mark_serving()
    for request in planned.requests:
        _corrupt(cache_check.folder_of(request.predicted_hash), "truncated metadata")
    try:
        k.add_kernel[(1,)](meta(), meta(), meta(), 4096, BLOCK=64)  # planned: rebuilt, not refused
    except JitAfterReadyError as exc:
        raise AssertionError(f"a damaged planned entry was refused as unplanned: {exc}") from None
    assert not [r for r in caplog.records if "was not planned" in r.getMessage()]
    # planning the same variants again finds the other one damaged, and helpers build it again
    (ticket,) = session.families["triton"].submit([second], Priority.WARMUP)
    assert ticket.wait(120) is State.DONE
    assert cache_check.check(second.predicted_hash, second.name, 90)[0] is cache_check.Entry.OK
    assert any("queued to be built again" in r.getMessage() for r in caplog.records)
    assert os.path.exists(cache_check.folder_of(first.predicted_hash))


def test_a_launch_blocked_while_helpers_build_background_work_gets_the_urgent_helper_at_once(session_factory):
    # Before: the launch's request went to the front of the queue and waited for helper-0 to finish the
    # long BACKGROUND build it was on (issue 44: 5-10 s waits after ready). Now the urgent slot forks a
    # helper for it at once, and helper-0 is paused (SIGSTOP) while that builds.
    from jit_ahead.report import analyse, text

    session = session_factory(workers=1)
    pool = session.families["triton"].pool
    events = []
    session.stats.subscribe(events.append)
    background = session.families["triton"].submit([slow_request(steps) for steps in (40, 41, 42)], Priority.BACKGROUND)
    wait_state(background[0], lambda t: t.state is State.RUNNING and t.owner == "helper-0")
    busy = psutil.Process(pool.helper_pids()["helper-0"])
    seen, watching = set(), threading.Event()

    def watch():
        while not watching.is_set():
            try:
                seen.add(busy.status())
            except psutil.NoSuchProcess:
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        t0 = time.monotonic()
        kernel = k.slow_kernel[(1,)](meta(1024), STEPS=10, BLOCK=1024)
        waited = time.monotonic() - t0
    finally:
        watching.set()
        watcher.join()
    ticket = pool.table.get(kernel.hash)
    assert ticket.state is State.DONE and ticket.result.builder == "helper-urgent"
    assert background[0].state is State.RUNNING  # not waited for: still building
    assert psutil.STATUS_STOPPED in seen  # paused while the urgent build ran...
    assert busy.status() != psutil.STATUS_STOPPED  # ...and resumed after
    # Bounded: the build itself, a fork and a few messages.
    assert waited < ticket.result.seconds + 3.0, (waited, ticket.result.seconds)
    (wait,) = [e for e in events if e["event"] == "wait"]
    assert wait["key"] == kernel.hash and wait["outcome"] == "ready"
    assert wait["cause"] == "queued behind 0 other requests, 1 of 2 helpers busy"
    assert "launches that waited over 0.5s for a build: 1" in text(analyse(events))
    assert all(t.wait(300) is State.DONE for t in background)  # the paused work finishes afterwards


def test_kill_9_of_the_urgent_helper_mid_build_frees_the_launch_and_resumes_the_paused_helpers(session_factory):
    session = session_factory(workers=1)
    pool = session.families["triton"].pool
    background = session.families["triton"].submit([slow_request(steps) for steps in (40, 41)], Priority.BACKGROUND)
    wait_state(background[0], lambda t: t.state is State.RUNNING and t.owner == "helper-0")
    busy = psutil.Process(pool.helper_pids()["helper-0"])
    done = []
    launcher = threading.Thread(target=lambda: done.append(k.slow_kernel[(1,)](meta(1024), STEPS=14, BLOCK=1024)))
    launcher.start()
    deadline = time.monotonic() + 120
    while "helper-urgent" not in pool.helper_pids() or busy.status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "the urgent helper never started, or helper-0 was never paused"
        time.sleep(0.01)
    urgent = psutil.Process(pool.helper_pids()["helper-urgent"])
    # helper-0 is paused before the job is sent: kill only once the urgent helper is compiling it (an
    # idle helper blocks on its pipe, so CPU time it spends from here on is the build), else the kill
    # lands before it took the job, which is the other path (back to the queue, no crash charged)
    spent = sum(urgent.cpu_times()[:2])
    while sum(urgent.cpu_times()[:2]) - spent < 0.3:
        assert time.monotonic() < deadline, "the urgent helper never started building"
        time.sleep(0.01)
    urgent.kill()
    launcher.join(300)
    assert done and done[0] is not None  # the launch got its variant (built in place after the crash)
    assert pool.table.get(done[0].hash).state is State.DONE
    assert busy.status() != psutil.STATUS_STOPPED  # resumed although the urgent build died
    assert session.stats.count("helper_crash") == 1
    assert all(t.wait(300) is State.DONE for t in background)
