#!/usr/bin/env python3
"""On a GPU host: helpers build real third-party kernel variants, then a fresh server process launches them.

Step 1 (this process, GPU visible): plan every Liger-Kernel and flash-linear-attention workload of
tests/workloads.py on meta tensors (the real driver supplies the target), build them in CPU-only nice-19
helpers into an empty Triton cache, and record what was built.
Step 2 (a fresh process, jit_ahead not started): run every workload for real on CUDA tensors through the
libraries' own launchers, with Triton's compilation listener counting compile() calls and cache hits, and
check each output against a plain-torch reference.
Passes when every build succeeded, every compile() in step 2 was a disk hit of a planned hash, and every
output is correct. Writes helpers_roundtrip.json and .md to --out.

    python scripts/gpu/helpers_roundtrip.py --out results/<date>-h200-helpers-roundtrip
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
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
            "cpus_usable": len(os.sched_getaffinity(0))}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    for lib in ("liger_kernel", "fla"):
        try:
            from importlib.metadata import version

            info[lib] = version({"liger_kernel": "liger-kernel", "fla": "fla-core"}[lib])
        except Exception:
            info[lib] = None
    return info


def plan_and_build(workers: int | None) -> dict:
    from tests import workloads as examples  # the repository is on sys.path (REPO_ON_PATH)

    workloads = examples.available()
    examples.import_libraries(workloads)
    from jit_ahead.session import Session
    from jit_ahead.triton import capture

    t0 = time.perf_counter()
    with capture() as planned:
        for workload in workloads:
            workload.run(*workload.make_inputs("meta", 0))
    plan_s = time.perf_counter() - t0
    options = {} if workers is None else {"workers": workers}
    t0 = time.perf_counter()
    with Session(triton=options) as session:
        tickets = session.families["triton"].submit(planned)
        for ticket in tickets:
            ticket.wait(None)
        helpers = session.families["triton"].pool.workers
    wall = time.perf_counter() - t0
    results = [t.result for t in tickets]
    return {"workloads": [w.name for w in workloads], "variants": len(planned), "plan_s": plan_s,
            "helpers": helpers, "build_wall_s": wall, "helper_build_s_sum": sum(r.seconds for r in results),
            "failed": [{"key": r.key, "error": r.error[-1500:]} for r in results if not r.ok],
            "launchers": sorted({r.details.get("launcher", "?") for r in results if r.ok}),
            "planned_hashes": sorted(r.predicted_hash for r in planned.requests),
            "kernels": sorted({f"{r.module}.{r.qualname}" for r in planned.requests})}


def serve(names: list[str]) -> dict:
    """The fresh 'server': real launches on the GPU, no jit_ahead, Triton's listener counting."""
    import torch
    from triton import knobs

    from tests import workloads as examples  # the repository is on sys.path (REPO_ON_PATH)

    compiles = []

    def listener(*, src, metadata, metadata_group, times, cache_hit, **kwargs):
        compiles.append({"name": src.name, "hash": metadata["hash"], "cache_hit": cache_hit})

    workloads = examples.by_name(names)
    examples.import_libraries(workloads)  # first-call times below exclude library imports
    torch.zeros(1, device="cuda")  # and CUDA context creation
    knobs.compilation.listener = listener
    out = []
    for workload in workloads:
        inputs = workload.make_inputs("cuda", 0)
        before = len(compiles)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = workload.run(*inputs)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        workload.run(*inputs)
        torch.cuda.synchronize()
        second = time.perf_counter() - t0
        violation = workload.max_violation(result, workload.reference(*inputs))
        out.append({"workload": workload.name, "compiles": len(compiles) - before,
                    "disk_hits": sum(c["cache_hit"] for c in compiles[before:]),
                    "first_call_ms": first * 1e3, "second_call_ms": second * 1e3,
                    "max_violation": violation, "correct": violation <= 0})
    return {"workloads": out, "compiles": compiles}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # step 2, in a fresh process
    args = parser.parse_args()

    if args.serve:
        print("SERVE " + json.dumps(serve(args.serve.split(","))))
        return 0

    cache = tempfile.mkdtemp(prefix="jit_ahead_gpu_roundtrip_")
    os.environ["TRITON_CACHE_DIR"] = cache
    info = versions()
    from jit_ahead.core.device_view import DeviceView
    from jit_ahead.triton import device as triton_device  # noqa: F401 - registers the Triton part of the view

    view = DeviceView.capture()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "device_view.json"), "w") as f:  # what helpers are shown
        json.dump(view.__dict__ if view else None, f, indent=2, default=str)
    built = plan_and_build(args.workers)
    print(f"built {built['variants']} variants in {built['build_wall_s']:.1f}s with {built['helpers']} helpers; "
          f"failed {len(built['failed'])}", flush=True)
    proc = subprocess.run([sys.executable, __file__, "--out", args.out, "--serve", ",".join(built["workloads"])],
                          capture_output=True, text=True, env=dict(os.environ, TRITON_CACHE_DIR=cache))
    if proc.returncode != 0:
        print(proc.stderr[-6000:], file=sys.stderr)
        return 1
    served = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("SERVE "))[6:])
    planned = set(built["planned_hashes"])
    misses = [c for c in served["compiles"] if not c["cache_hit"]]
    unplanned = [c for c in served["compiles"] if c["hash"] not in planned]
    ok = not built["failed"] and not misses and not unplanned and all(w["correct"] for w in served["workloads"])
    report = {"versions": info, "cache_dir": cache, "build": built, "serve": served, "passed": ok,
              "server_compiles": len(served["compiles"]), "server_disk_misses": len(misses),
              "server_unplanned": len(unplanned)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "helpers_roundtrip.json"), "w") as f:
        json.dump(report, f, indent=2)
    lines = ["# GPU round trip: helpers build third-party kernels, a fresh server launches them", "",
             f"{info['date']}; {info.get('gpu')} (sm_{info.get('capability', '?').replace('.', '')}, driver "
             f"{info.get('driver')}); {info['cpus_usable']} CPUs; Python {info['python']}, torch {info['torch']}, "
             f"triton {info['triton']}, liger-kernel {info['liger_kernel']}, fla-core {info['fla']}.", "",
             f"Step 1: planned {built['variants']} variants of {len(built['kernels'])} kernels on meta tensors in "
             f"{built['plan_s']:.2f}s; {built['helpers']} CPU-only nice-19 helpers built them in "
             f"{built['build_wall_s']:.1f}s wall ({built['helper_build_s_sum']:.1f}s of compile time); "
             f"failed: {len(built['failed'])}; host launchers: {', '.join(built['launchers'])}.",
             f"Step 2 (fresh process, real CUDA launches): {len(served['compiles'])} compile() calls, "
             f"{len(misses)} disk misses, {len(unplanned)} unplanned hashes.", "",
             "| workload | compile() calls | disk hits | first call (ms) | second call (ms) | max error over tolerance | correct |",
             "|---|---|---|---|---|---|---|"]
    for w in served["workloads"]:
        lines.append(f"| {w['workload']} | {w['compiles']} | {w['disk_hits']} | {w['first_call_ms']:.1f} | "
                     f"{w['second_call_ms']:.2f} | {w['max_violation']:.3g} | {'yes' if w['correct'] else 'NO'} |")
    lines += ["", f"Result: {'PASS' if ok else 'FAIL'}. Raw data: `helpers_roundtrip.json`. Rerun: "
              "`python scripts/gpu/helpers_roundtrip.py --out <dir>`."]
    with open(os.path.join(args.out, "helpers_roundtrip.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
