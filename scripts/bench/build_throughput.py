#!/usr/bin/env python3
"""Build throughput: N helpers against in-process serial compilation of the same variant set.

Plans ~250 real Liger-Kernel and flash-linear-attention variants on meta tensors (workloads.sweep_launches),
then, each arm into its own empty Triton cache and side by side in one run:
  serial   the variants compiled one after another in this process (what an executor would pay);
  N        a fresh pool of N helpers (N = 1, 2, 4, ... up to the usable CPUs): the time from submitting
           to the last finished build, once helpers are ready and have preloaded the kernel modules;
           plus the time from pool start to the first finished build.
The serial arm runs first and again last, to show drift. Writes build_throughput.json and .md to --out.

    python scripts/bench/build_throughput.py --out results/<date>-<host>-build-throughput [--max-workers N] [--every K]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # REPO_ON_PATH: tests/workloads.py


def versions() -> dict:
    import torch
    import triton

    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "cpus_usable": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def serial_arm(requests) -> float:
    from jit_ahead.triton.build import compile_request

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="jit_ahead_bench_serial_")
    t0 = time.perf_counter()
    for request in requests:
        compile_request(request)  # the kernel and whether it was found on disk: timed either way
    return time.perf_counter() - t0


def ready_pool(requests, workers: int, start: str):
    """A fresh pool of ``workers`` helpers writing to an empty cache, started, its helpers up and holding
    the kernel modules; returns the pool, its stats events and the start and ready times."""
    from jit_ahead.core import device_view
    from jit_ahead.core.building.pool import HelperPool
    from jit_ahead.core.observing.stats import Stats
    from jit_ahead.triton.family import SPEC

    cache = tempfile.mkdtemp(prefix=f"jit_ahead_bench_{workers}_")
    stats = Stats()
    events: list[dict] = []
    stats.subscribe(events.append)
    pool = HelperPool(SPEC, workers=workers, stats=stats, env_overrides={"TRITON_CACHE_DIR": cache},
                      device_view=device_view.current(), start_mode=start)
    pool.preload(sorted({r.module for r in requests}))
    started, started_wall = time.perf_counter(), time.time()
    pool.start()
    # Throughput is measured from helpers that are up and have imported the kernel modules. Forked helpers
    # come from a fork server that imported them first (the preload list is set before the start).
    ready_event = "helper_ready" if start == "fork" else "helper_preloaded"
    while sum(e["event"] == ready_event for e in events) < workers:
        time.sleep(0.01)
    return pool, events, (started, started_wall), time.perf_counter()


def build_all(pool, requests) -> list:
    """Submit every request and wait for all of them; the finished tickets."""
    from jit_ahead.core.priority import Priority

    tickets = [pool.submit(r.build_request(), Priority.BACKGROUND) for r in requests]
    for ticket in tickets:
        ticket.wait(None)
    return tickets


def pool_arm(requests, workers: int, start: str) -> dict:
    pool, events, (started, started_wall), ready = ready_pool(requests, workers, start)
    tickets = build_all(pool, requests)
    done = time.perf_counter()
    first_finish = min(e["time"] for e in events if e["event"] == "build_finish")
    pool.close()
    failed = [t.result.error for t in tickets if not t.result.ok]
    return {"workers": workers, "start": start, "build_wall_s": done - ready, "ready_s": ready - started,
            "first_build_after_start_s": first_finish - started_wall,
            "helper_build_s_sum": sum(t.result.seconds for t in tickets), "failed": len(failed),
            "first_error": failed[0][-500:] if failed else None}


def planned_variants(every: int = 1) -> list:
    """Every ``every``-th of the ~260 Liger-Kernel and fla variants of workloads.sweep_launches."""
    from tests import workloads as examples  # the repository is on sys.path (REPO_ON_PATH)
    from jit_ahead.triton import capture
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()  # the GPU, or an H200's view without one; before fla reads the device at import
    examples.import_libraries()
    with capture() as planned:
        for launch in examples.sweep_launches():
            launch()
    return planned.requests[::every]


def worker_counts(limit: int) -> list[int]:
    counts, n = [], 1
    while n < limit:
        counts.append(n)
        n *= 2
    return counts + [limit]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--workers", default="", help="comma-separated N to run (default 1, 2, 4, ... max)")
    parser.add_argument("--no-second-serial", action="store_true", help="skip the closing serial arm")
    parser.add_argument("--every", type=int, default=1, help="use every K-th planned variant (a spread sample)")
    parser.add_argument("--start", default="fork", help="helper start modes to run, comma-separated: fork,spawn")
    args = parser.parse_args()

    requests = planned_variants(args.every)
    print(f"variants: {len(requests)}", flush=True)

    info = versions()
    serial_first = serial_arm(requests)
    print(f"serial: {serial_first:.1f}s", flush=True)
    arms: list[dict] = []
    counts = [int(n) for n in args.workers.split(",")] if args.workers else worker_counts(args.max_workers)
    for workers in counts:
        for start in args.start.split(","):
            arm = pool_arm(requests, workers, start)
            arm["speedup"] = serial_first / arm["build_wall_s"]
            arm["efficiency"] = arm["speedup"] / workers
            arms.append(arm)
            print(f"N={workers} {start}: {arm['build_wall_s']:.1f}s (ready {arm['ready_s']:.1f}s, "
                  f"failed {arm['failed']})", flush=True)
            write_report(args.out, info, len(requests), [serial_first], arms)  # partial results survive a timeout
    serials = [serial_first]
    if not args.no_second_serial:
        serials.append(serial_arm(requests))
        print(f"serial again: {serials[-1]:.1f}s", flush=True)
    serial = sum(serials) / len(serials)
    for arm in arms:
        arm["speedup"] = serial / arm["build_wall_s"]
        arm["efficiency"] = arm["speedup"] / arm["workers"]
    print(write_report(args.out, info, len(requests), serials, arms))
    return 1 if any(a["failed"] for a in arms) else 0


def write_report(out: str, info: dict, variants: int, serials: list[float], arms: list[dict]) -> str:
    serial = sum(serials) / len(serials)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "build_throughput.json"), "w") as f:
        json.dump({"versions": info, "variants": variants, "serial_s": serials, "arms": arms}, f, indent=2)
    lines = ["# Build throughput: N helpers vs serial in-process compilation", "",
             f"{info['date']}; {info.get('gpu', 'no GPU')}; {info['cpu']}, {info['cpus_usable']} usable CPUs; "
             f"Python {info['python']}, torch {info['torch']}, triton {info['triton']}.", "",
             f"{variants} Liger-Kernel and flash-linear-attention variants for sm_90, each arm into an empty "
             f"cache. Serial in-process compile: {', '.join(f'{s:.1f}s' for s in serials)} (first and last arm; "
             f"speed-ups use the mean {serial:.1f}s).", "",
             "| helpers N | start | build wall (s) | speed-up vs serial | speed-up / N | helpers ready + preloaded (s) "
             "| first build after start (s) | failed |", "|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        lines.append(f"| {arm['workers']} | {arm.get('start', 'spawn')} | {arm['build_wall_s']:.2f} | {arm['speedup']:.2f} | "
                     f"{arm['efficiency']:.2f} | {arm['ready_s']:.2f} | {arm['first_build_after_start_s']:.2f} | "
                     f"{arm['failed']} |")
    lines += ["", "Raw numbers: `build_throughput.json` beside this file. Rerun: "
              "`python scripts/bench/build_throughput.py --out <dir> [--every K]`."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "build_throughput.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
