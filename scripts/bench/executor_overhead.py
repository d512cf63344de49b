#!/usr/bin/env python3
"""Executor overhead: what jit_ahead costs a launching thread, side by side in one process.

  hit        launch latency of a variant already in Triton's in-memory cache, with no session, with a
             session (its hook installed), and with no session again (drift); the hook is only called on
             in-memory misses, so the target is no measurable difference
  disk hit   the first launch in a process of a variant already on disk, with and without the session
             (the hook's disk check on top of Triton's own load)
  wait       a launch that finds its variant being built by a helper: seconds from the helper's finish to
             the launch returning (the notification and Triton's load), over the build itself
  planning   capture of launches on meta tensors: microseconds per enumerated launch

On a machine without a GPU the stand-in driver runs launches as no-ops: the figures are the host-side
launch path, which is where jit_ahead could add cost. Writes executor_overhead.json and .md to --out.

    python scripts/bench/executor_overhead.py --out results/<date>-<host>-executor-overhead
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_kernels, for helpers too


def versions() -> dict:
    import torch
    import triton

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (stand-in driver)",
            "cpus": len(os.sched_getaffinity(0))}


def tensors(n: int):
    import torch

    device = "cuda" if torch.cuda.is_available() else "meta"
    return [torch.empty(n, device=device, dtype=torch.float32) for _ in range(3)]


def launch_us(launches: int, block: int = 256) -> float:
    """Per-launch microseconds of a hot variant over ``launches`` launches."""
    import bench_kernels as bk

    x, y, out = tensors(4096)
    bk.axpy_kernel[(16,)](x, y, out, 4096, 2.0, BLOCK=block)  # in memory from here on
    t0 = time.perf_counter()
    for _ in range(launches):
        bk.axpy_kernel[(16,)](x, y, out, 4096, 2.0, BLOCK=block)
    return (time.perf_counter() - t0) / launches * 1e6


def alternate(measure, rounds: int) -> dict:
    """``measure()`` without and with a session (no helpers: its hook and listener only), alternating so
    that drift of a shared machine falls on both arms alike."""
    from jit_ahead.session import Session

    out = {"off": [], "on": []}
    for _ in range(rounds):
        out["off"].append(measure())
        session = Session(triton={"workers": 0}).start()
        try:
            out["on"].append(measure())
        finally:
            session.close()
    return out


def forget_in_memory() -> None:
    import bench_kernels as bk

    for kernel in (bk.axpy_kernel, bk.unrolled_kernel):
        kernel.device_caches.clear()


def first_launch_s(blocks) -> list[float]:
    import bench_kernels as bk

    x, y, out = tensors(4096)
    times = []
    for block in blocks:
        t0 = time.perf_counter()
        bk.axpy_kernel[(1,)](x, y, out, 4096, 2.0, BLOCK=block)
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--launches", type=int, default=20000)
    args = parser.parse_args()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="jit_ahead_overhead_")

    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session
    from jit_ahead.triton import capture
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()
    import bench_kernels as bk

    result = {"versions": versions()}
    # -- hit path ---------------------------------------------------------------------------------------
    result["hit_us"] = alternate(lambda: launch_us(args.launches // 20), 20)

    # -- disk hits: variants built once, then loaded by fresh in-memory caches ---------------------------
    blocks = [2 ** i for i in range(4, 14)]  # ten variants
    forget_in_memory()
    first_launch_s(blocks)  # compiles them to disk (no session)

    def disk_hits() -> float:
        forget_in_memory()
        return statistics.median(first_launch_s(blocks))

    result["disk_hit_s"] = alternate(disk_hits, 10)
    session = Session(triton={"workers": 1}).start()

    # -- a wait on an in-flight build ---------------------------------------------------------------------
    events = []
    session.stats.subscribe(events.append)
    x, _, _ = tensors(1024)
    waits = []
    for steps in (12, 13, 14):  # a few seconds of compile each
        with capture() as planned:
            bk.unrolled_kernel[(1,)](x, 1024, STEPS=steps, BLOCK=1024)
        (ticket,) = session.families["triton"].submit(planned, Priority.BACKGROUND)
        while ticket.state.value == "queued":
            time.sleep(0.001)
        bk.unrolled_kernel[(1,)](x, 1024, STEPS=steps, BLOCK=1024)
        returned = time.time()
        finish = [e for e in events if e["event"] == "build_finish" and e["key"] == ticket.key]
        miss = [e for e in events if e["event"] == "executor_miss" and e["key"] == ticket.key]
        waits.append({"build_s": ticket.result.seconds, "builder": ticket.result.builder,
                      "outcome": miss[0]["outcome"] if miss else None,
                      "after_finish_s": returned - finish[0]["time"] if finish else None})
    session.close()
    result["wait"] = waits

    # -- planning per enumerated launch -------------------------------------------------------------------
    import torch

    xs = [torch.empty(n, device="meta", dtype=torch.float32) for n in range(1, 4097)]
    t0 = time.perf_counter()
    with capture() as planned:
        for t in xs:
            bk.axpy_kernel[(1,)](t, t, t, t.numel(), 2.0, BLOCK=256)
    result["planning"] = {"launches": len(xs), "variants": len(planned.requests),
                          "us_per_launch": (time.perf_counter() - t0) / len(xs) * 1e6}
    print(write_report(args.out, result))
    return 0


def write_report(out: str, r: dict) -> str:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "executor_overhead.json"), "w") as f:
        json.dump(r, f, indent=1)
    med = statistics.median
    v = r["versions"]
    hit, disk = r["hit_us"], r["disk_hit_s"]
    lines = [f"# Executor overhead ({v['date']})", "",
             f"`python scripts/bench/executor_overhead.py --out <dir>`; Python {v['python']}, torch {v['torch']}, "
             f"Triton {v['triton']}, GPU: {v['gpu']}, {v['cpus']} CPUs.", "",
             "| what | without jit_ahead | with jit_ahead | |", "|---|---|---|---|",
             f"| in-memory hit, us per launch (median of {len(hit['off'])} alternating blocks) | {med(hit['off']):.2f} | "
             f"{med(hit['on']):.2f} | quartiles off {_q(hit['off'])}, on {_q(hit['on'])} |",
             f"| first launch of a variant on disk, ms (median of {len(disk['off'])} alternating rounds of 10 variants) | "
             f"{med(disk['off']) * 1e3:.2f} | {med(disk['on']) * 1e3:.2f} | the hook's hash prediction and disk check "
             "on top of Triton's own lookup and load |"]
    for w in r["wait"]:
        lines.append(f"| wait on an in-flight build ({w['outcome']}, built by {w['builder']} in {w['build_s']:.2f} s) | | "
                     f"{(w['after_finish_s'] or 0) * 1e3:.1f} ms after the build finished | |")
    p = r["planning"]
    lines += [f"| planning: capture of {p['launches']} launches ({p['variants']} variants) | | "
              f"{p['us_per_launch']:.1f} us per launch | |", "",
              "Raw samples: `executor_overhead.json` beside this file."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "executor_overhead.md"), "w") as f:
        f.write(text)
    return text


def _q(samples) -> str:
    q = statistics.quantiles(samples, n=4)
    return f"{q[0]:.2f}-{q[2]:.2f}"


if __name__ == "__main__":
    sys.exit(main())
