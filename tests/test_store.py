"""jit_ahead's store (``JIT_AHEAD_STORE``, a folder) and Triton's kernels shared through it: "nodes" are fresh
processes with Triton caches of their own on one store. Faults are real: entries damaged or cut short on
disk, a full and a read-only file system (tmpfs), concurrent writers, a FIFO in an entry's place."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jit_ahead.core.store import StoreError
from jit_ahead.core.store.base import frame, unframe
from jit_ahead.core.store.directory import MAX_ENTRY_BYTES, DirectoryStore

from .conftest import REPO, fill, without_jit_ahead

NODE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import torch
from triton import knobs
loads = []
knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit, **kw: loads.append(cache_hit)
from jit_ahead.session import Session
from jit_ahead.triton.standin import ensure_driver
from tests.kernels.basic import add_kernel
ensure_driver()
session = Session(triton={"workers": int(sys.argv[1])}).start()
x = torch.empty(1024, device="meta")
if int(sys.argv[1]):  # built ahead by a helper, which publishes it from its own process
    from jit_ahead.core.priority import Priority
    from jit_ahead.triton.plan import plan_launch
    session.families["triton"].submit(plan_launch(add_kernel, x, x, x, 1024, BLOCK=256, grid=(4,)), Priority.WARMUP)
    assert session.wait_ready(300, priority=Priority.WARMUP)
add_kernel[(4,)](x, x, x, 1024, BLOCK=256)
session.close()
print("NODE " + json.dumps({"compiled_here": loads.count(False)}))
"""


def node(tmp_path, name: str, store, workers: int = 0, **env) -> tuple[dict, list[str]]:
    """One node: a fresh process with a Triton cache of its own, launching one kernel; what it compiled
    itself, and its jit_ahead store lines."""
    environ = {**without_jit_ahead(os.environ), "PYTHONPATH": str(REPO), "TRITON_CACHE_DIR": str(tmp_path / name),
               "JIT_AHEAD_STORE": str(store), **env}
    proc = subprocess.run([sys.executable, "-c", NODE, str(workers)], cwd=REPO, env=environ, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("NODE "))[5:])
    return result, [line for line in proc.stderr.splitlines() if "store" in line and "jit_ahead" in line]


def entries(store) -> list:
    return sorted(p for p in (store / "entries").rglob("*") if p.is_file())


@pytest.mark.parametrize("workers", [0, 1])
def test_a_second_node_on_the_store_compiles_nothing_the_first_published(tmp_path, workers):
    # The first node builds the kernel (in place, or in a helper, which publishes from its own process); the
    # second, with an empty Triton cache of its own, fetches it: no compile.
    store = tmp_path / "store"
    first, said = node(tmp_path, "node1", store, workers)
    assert first["compiled_here"] == (1 - workers) and len(entries(store)) == 1 and said == []
    second, said = node(tmp_path, "node2", store)
    assert second == {"compiled_here": 0} and said == []


@pytest.mark.parametrize("fault", ["damaged", "cut short"])
def test_an_entry_damaged_or_cut_short_is_skipped_with_one_line_and_the_kernel_is_compiled_here(tmp_path, fault):
    store = tmp_path / "store"
    node(tmp_path, "node1", store)
    (entry,) = entries(store)
    data = bytearray(entry.read_bytes())
    if fault == "damaged":
        data[-10] ^= 0xFF  # one byte of the kernel's files
    else:
        del data[len(data) // 2:]
    entry.write_bytes(bytes(data))
    second, said = node(tmp_path, "node2", store)
    assert second["compiled_here"] == 1
    assert len(said) == 1 and fault in said[0] and "compiled here" in said[0], said


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_store_that_cannot_be_written_costs_one_line_and_the_node_serves_on(tmp_path, small_tmpfs, fault):
    store = small_tmpfs / "store"
    DirectoryStore(store)
    if fault == "full":
        fill(small_tmpfs)
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    first, said = node(tmp_path, "node1", store)
    assert first["compiled_here"] == 1 and entries(store) == []
    assert len(said) == 1 and "could not publish" in said[0] and "serves on" in said[0], said


def test_a_cache_manager_the_user_set_is_kept_with_one_line(tmp_path):
    result, said = node(tmp_path, "node1", tmp_path / "store",
                        TRITON_CACHE_MANAGER="triton.runtime.cache:FileCacheManager")
    assert result["compiled_here"] == 1 and entries(tmp_path / "store") == []
    assert len(said) == 1 and "TRITON_CACHE_MANAGER=triton.runtime.cache:FileCacheManager" in said[0], said


def test_frames_refuse_what_this_jit_ahead_did_not_write_whole():
    payload = b"kernel bytes" * 100
    assert unframe("e", frame(payload)) == payload
    for bad, why in [(frame(payload)[:-1], "cut short"), (frame(payload)[:-1] + b"X", "damaged"),
                     (b"another format\n" + payload, "format"), (payload, "format")]:
        with pytest.raises(StoreError, match=why):
            unframe("e", bad)


def test_a_directory_store_refuses_names_outside_it_a_fifo_and_a_huge_file_in_an_entrys_place(tmp_path):
    store = DirectoryStore(tmp_path / "store")
    for name in ["../out", "/abs", "a//b", "a/./b", ""]:
        with pytest.raises(ValueError):
            store.put(name, b"x")
    os.makedirs(tmp_path / "store" / "entries" / "triton")
    os.mkfifo(tmp_path / "store" / "entries" / "triton" / "fifo")
    with pytest.raises(StoreError, match="not a regular file"):
        store.get("triton/fifo")  # a blocking open would hang here
    assert store.get("triton/none") is None
    huge = tmp_path / "store" / "entries" / "triton" / "huge"
    with open(huge, "wb") as f:
        f.truncate(MAX_ENTRY_BYTES + 1)  # sparse: larger than an entry may be, nothing read
    with pytest.raises(StoreError, match="more than an entry may hold"):
        store.get("triton/huge")


PUBLISH = """
import sys
from jit_ahead.core.store.directory import DirectoryStore
store, seed = DirectoryStore(sys.argv[1]), int(sys.argv[2])
for i in range(300):
    store.put("triton/k/x.json", bytes([seed]) * (4096 * (1 + (i + seed) % 64)))
"""


def test_concurrent_writers_never_leave_a_reader_part_of_an_entry(tmp_path):
    # Four processes publish one name over and over with contents of different sizes while this one reads
    # it: every read is one writer's whole entry. (Plain processes: multiprocessing would leave its resource
    # tracker behind as a child of the test run.)
    root = str(tmp_path / "store")
    store = DirectoryStore(root)
    writers = [subprocess.Popen([sys.executable, "-c", PUBLISH, root, str(seed)], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)}) for seed in range(1, 5)]
    reads = 0
    while any(w.poll() is None for w in writers):
        data = store.get("triton/k/x.json")
        if data is not None:
            assert len(set(data)) == 1 and len(data) % 4096 == 0
            reads += 1
    for w in writers:
        assert w.wait() == 0
    assert reads > 0 and os.listdir(tmp_path / "store" / "tmp") == []


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server of the test's own, on a free port, persisting nothing."""
    import shutil
    import socket
    import time

    pytest.importorskip("redis", reason="the [redis] extra is installed with [test]")
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server on this machine (.ci/run installs Debian's)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield server, f"redis://127.0.0.1:{port}/0"
    if server.poll() is None:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
    server.wait()


def redis_entries(url: str) -> list:
    import redis

    return sorted(redis.Redis.from_url(url).keys("jit_ahead:*"))


def test_a_second_node_on_a_redis_store_compiles_nothing_the_first_published(tmp_path, redis_server):
    _, url = redis_server
    first, said = node(tmp_path, "node1", url)
    assert first["compiled_here"] == 1 and len(redis_entries(url)) == 1 and said == []
    second, said = node(tmp_path, "node2", url)
    assert second == {"compiled_here": 0} and said == []


@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_a_redis_store_killed_or_stopped_costs_one_bounded_wait_and_one_line(tmp_path, redis_server, fault):
    # The first node publishes; then the server is SIGKILLed, or SIGSTOPped (it accepts connections and never
    # answers): the second node waits at most JIT_AHEAD_STORE_TIMEOUT_S once, says so in one line, compiles the
    # kernel itself and publishes nothing.
    server, url = redis_server
    node(tmp_path, "node1", url)
    os.kill(server.pid, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
    t0 = time.monotonic()
    second, said = node(tmp_path, "node2", url, JIT_AHEAD_STORE_TIMEOUT_S="1")
    assert second["compiled_here"] == 1
    assert len(said) == 1 and "did not answer" in said[0] and "goes on without it" in said[0], said
    assert time.monotonic() - t0 < 120  # a process's start and one compile, not a wait without end


STOP_BEFORE_PUBLISHING = """
import os, signal
from jit_ahead.triton import store_cache
publish = store_cache.StoreCacheManager.put_group
def stop_then_publish(self, *args):
    os.kill(int(os.environ["STORE_SERVER_PID"]), signal.SIGSTOP)
    return publish(self, *args)
store_cache.StoreCacheManager.put_group = stop_then_publish
"""


def test_a_redis_store_that_stops_mid_publish_costs_the_publisher_one_line(tmp_path, redis_server):
    # Stopped after the first node's lookup missed and before it publishes what it compiled.
    server, url = redis_server
    environ = {**without_jit_ahead(os.environ), "PYTHONPATH": str(REPO), "TRITON_CACHE_DIR": str(tmp_path / "n"),
               "JIT_AHEAD_STORE": url, "JIT_AHEAD_STORE_TIMEOUT_S": "1", "STORE_SERVER_PID": str(server.pid)}
    code = NODE.replace("session = Session(", STOP_BEFORE_PUBLISHING + "session = Session(", 1)
    proc = subprocess.run([sys.executable, "-c", code, "0"], cwd=REPO, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "store" in line and "jit_ahead" in line]
    assert len(said) == 1 and "did not answer" in said[0], said
    os.kill(server.pid, signal.SIGCONT)  # the command sent before the stop may still land: whole, or not at all
    third, said = node(tmp_path, "node3", url)
    assert said == [] and third["compiled_here"] == (0 if redis_entries(url) else 1)


# -- a model's start: plan, records and autotune choices through the store --------------------------------------
MODEL_NODE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import torch
from triton import knobs
loads = []
knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit, **kw: loads.append(cache_hit)
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session
from jit_ahead.triton.standin import ensure_driver
from tests.kernels import basic as k
from tests.layers import ScaleProvider, model
ensure_driver()

class Counting(ScaleProvider):
    passes = 0

    def find_layers(self, net):
        Counting.passes += 1
        return super().find_layers(net)

events = []
session = Session(triton={"workers": 1})
session.stats.subscribe(events.append)
session.start()
net = model()
run = session.plan_model(net, EngineLimits(max_num_tokens=24, max_batch_size=4, cuda_graph_batch_sizes=(1, 4)),
                         [Counting()])
assert run.wait(300) and session.wait_ready(300, priority=Priority.BACKGROUND)
for tokens in (1, 5, 24):  # served: planned variants
    net(torch.empty(tokens, 1024, device="meta"))
x = torch.empty(4096, device="meta")
k.stored_tuning_kernel[(1,)](x, x, 4096)  # served: an autotuned kernel no plan names
session.close()
names = [e["event"] for e in events]
print("NODE " + json.dumps({"planning_passes": Counting.passes, "built_by_helpers": names.count("build_finish"),
                            "compiled_here": loads.count(False), "benchmarked": len(k.BENCHMARKED),
                            "plan": [n for n in names if n.startswith("plan")]}))
"""


def model_node(tmp_path, name: str, store, said: list | None = None, **env) -> dict:
    """A node starting a model server: planning, helpers, records and autotune choices in folders of its own
    (``said`` gets its jit_ahead store lines)."""
    local = tmp_path / name
    environ = {**without_jit_ahead(os.environ), "PYTHONPATH": str(REPO), "TRITON_CACHE_DIR": str(local / "triton"),
               "JIT_AHEAD_PLAN_DIR": str(local / "plans"), "JIT_AHEAD_RECORD_DIR": str(local / "records"),
               "JIT_AHEAD_STORE": str(store), **env}
    proc = subprocess.run([sys.executable, "-c", MODEL_NODE], cwd=REPO, env=environ, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if said is not None:
        said += [line for line in proc.stderr.splitlines() if "store" in line and "jit_ahead" in line]
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("NODE "))[5:])


@pytest.mark.parametrize("kind", ["folder", "redis"])
def test_a_second_node_plans_builds_compiles_and_benchmarks_nothing_the_first_published(tmp_path, kind, request):
    # The first node plans the model, its helper builds the plan, and serving meets an autotuned kernel no plan
    # names (it benchmarks its three configs). Its plan, kernels, records and choice go to the store. The second,
    # with empty folders of its own, fetches them: no planning pass, no helper build, no compile, no benchmark.
    store = request.getfixturevalue("redis_server")[1] if kind == "redis" else tmp_path / "store"
    first = model_node(tmp_path, "node1", store)
    assert first["planning_passes"] >= 1 and first["built_by_helpers"] > 0 and first["benchmarked"] == 3
    assert first["plan"][-1] == "plan_saved" and "plan_loaded" not in first["plan"], first
    second = model_node(tmp_path, "node2", store)
    assert second == {"planning_passes": 0, "built_by_helpers": 0, "compiled_here": 0, "benchmarked": 0,
                      "plan": ["plan_loaded"]}, second
    # the same start on an empty store does all of it again: what the second node was spared came from the store
    third = model_node(tmp_path, "node3", tmp_path / "empty-store")
    assert third["planning_passes"] >= 1 and third["built_by_helpers"] > 0 and third["benchmarked"] == 3


@pytest.mark.parametrize("damaged", ["plan", "records"])
def test_a_damaged_plan_or_record_in_the_store_is_one_line_and_the_node_does_that_part_itself(tmp_path, damaged):
    store = tmp_path / "store"
    model_node(tmp_path, "node1", store)
    folder = {"plan": "plans"}.get(damaged, damaged)
    hit = [p for p in entries(store) if p.relative_to(store / "entries").parts[0] == folder]
    assert hit
    for path in hit:
        data = bytearray(path.read_bytes())
        data[-3] ^= 0xFF
        path.write_bytes(bytes(data))
    said = []
    second = model_node(tmp_path, "node2", store, said)
    assert second["compiled_here"] == 0 and second["built_by_helpers"] == 0  # the kernels still came from the store
    if damaged == "plan":
        assert second["planning_passes"] == 1 and second["benchmarked"] == 0
    else:  # the autotune choice was in a record
        assert second["planning_passes"] == 0 and second["benchmarked"] == 3
    assert len(said) == 1 and "SHA-256" in said[0] and "skipped" in said[0], said


def test_a_redis_store_killed_before_a_model_node_starts_costs_one_line_and_the_node_does_it_all_itself(
        tmp_path, redis_server):
    server, url = redis_server
    model_node(tmp_path, "node1", url)
    server.kill()
    server.wait()
    said = []
    second = model_node(tmp_path, "node2", url, said, JIT_AHEAD_STORE_TIMEOUT_S="1")
    assert second["planning_passes"] >= 1 and second["built_by_helpers"] > 0 and second["benchmarked"] == 3
    assert len(said) == 1 and "did not answer" in said[0] and "goes on without it" in said[0], said


# -- claims: nodes starting together build each kernel once between them ------------------------------------------
def claim_cases(store, pause):
    """The claim rules, the same on every store: taken, held, renewed, let go, lapsed."""
    assert store.claim("c/one", "a", 30) is None
    assert store.claim("c/one", "b", 30) == "a"  # held by a
    assert store.claim("c/one", "a", 30) is None  # renewed by a
    store.release("c/one", "b")  # not b's: nothing
    assert store.claim("c/one", "b", 30) == "a"
    store.release("c/one", "a")
    assert store.claim("c/one", "b", 30) is None
    assert store.claim("c/two", "a", 0.3) is None
    pause(0.6)
    assert store.claim("c/two", "b", 30) is None  # a's lapsed
    assert store.names("c") == []  # claims are not entries


def test_claims_on_a_directory_store(tmp_path):
    store = DirectoryStore(tmp_path / "store")
    claim_cases(store, time.sleep)
    # a holder that is a process of this machine and is gone: its claim is taken over at once
    holder = subprocess.run([sys.executable, "-c", "import sys; from jit_ahead.core.store.directory import "
                             "DirectoryStore; DirectoryStore(sys.argv[1]).claim('c/three', 'gone', 3600)",
                             str(tmp_path / "store")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert holder.returncode == 0
    assert store.claim("c/three", "b", 30) is None
    # a claim file that is not one (damaged, cut short) is a lapsed claim
    (tmp_path / "store" / "claims" / "c" / "four").write_bytes(b"\x00garbage")
    assert store.claim("c/four", "b", 30) is None


def test_claims_on_a_redis_store(redis_server):
    from jit_ahead.core.store.redis_store import RedisStore

    claim_cases(RedisStore(redis_server[1], 2.0), time.sleep)


TOGETHER = """
import json, logging, os, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import torch
from triton import knobs
loads = []
knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit, **kw: loads.append(cache_hit)
from jit_ahead.session import Session
from jit_ahead.triton.standin import ensure_driver
from tests.kernels.basic import slow_kernel
ensure_driver()
session = Session(triton={"workers": 0}).start()
x = torch.empty(64, device="meta")
print("READY", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
slow_kernel[(1,)](x, STEPS=int(sys.argv[2]), BLOCK=64)
session.close()
print("NODE " + json.dumps({"compiled_here": loads.count(False)}), flush=True)
"""


def start_nodes(tmp_path, store, names, steps, **env):
    gate = tmp_path / "go"
    procs = []
    for name in names:
        environ = {**without_jit_ahead(os.environ), "PYTHONPATH": str(REPO), "TRITON_CACHE_DIR": str(tmp_path / name),
                   "JIT_AHEAD_STORE": str(store), **env}
        procs.append(subprocess.Popen([sys.executable, "-c", TOGETHER, str(gate), str(steps)], cwd=REPO,
                                      env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        assert proc.stdout.readline().strip() == "READY"
    gate.touch()
    return procs


def finish(proc) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(next(l for l in out.splitlines() if l.startswith("NODE "))[5:]), err


def test_nodes_starting_together_compile_a_kernel_once_between_them(tmp_path):
    # (Redis's claims: the same rules in test_claims_on_a_redis_store, and its lapse below.)
    store = tmp_path / "store"
    results = [finish(proc) for proc in start_nodes(tmp_path, store, ["n1", "n2", "n3"], steps=400)]
    assert sum(r["compiled_here"] for r, _ in results) == 1, [r for r, _ in results]
    assert sum("was built by" in err for _, err in results) == 2  # the others waited for its entry


@pytest.mark.parametrize("kind", ["folder", "redis"])
def test_a_node_waiting_on_a_claimant_that_dies_takes_the_claim_over_and_compiles(tmp_path, kind, request):
    # The claimant is SIGKILLed mid-compile. On a folder its claim names a process of this machine that is gone:
    # taken over at once. On Redis its claim lapses once nobody renews it (JIT_AHEAD_STORE_CLAIM_S).
    if kind == "redis":
        import redis

        store = request.getfixturevalue("redis_server")[1]
        client = redis.Redis.from_url(store)
        claimed = lambda: bool(client.keys("jit_ahead-claim:*"))  # noqa: E731
    else:
        store = tmp_path / "store"
        claimed = lambda: any((store / "claims").rglob("*.json"))  # noqa: E731
    # a claim lifetime longer than the waiter's own start, so that it finds the claim still held
    env = {"JIT_AHEAD_STORE_CLAIM_S": "25", "JIT_AHEAD_WAIT_TIMEOUT_S": "300"}
    (holder,) = start_nodes(tmp_path, store, ["n1"], steps=600, **env)
    deadline = time.monotonic() + 120
    while not claimed():  # it claimed the kernel, and compiles it
        assert time.monotonic() < deadline and holder.poll() is None
        time.sleep(0.05)
    holder.kill()
    holder.wait()
    (tmp_path / "go").unlink()
    t0 = time.monotonic()
    (waiter,) = start_nodes(tmp_path, store, ["n2"], steps=600, **env)
    result, err = finish(waiter)
    assert result["compiled_here"] == 1
    assert time.monotonic() - t0 < 200  # not the whole JIT_AHEAD_WAIT_TIMEOUT_S: the claim was taken over
    assert "waited" not in err, err[-2000:]
    if kind == "redis":  # it found the claim held, then lapsed
        assert "did not come; compiled here" in err, err[-2000:]
    else:  # taken over at once
        assert "did not come" not in err, err[-2000:]
