#!/usr/bin/env python3
"""Record and replay on the GPU: a third-party Triton workload without a provider, run twice with
JIT_AHEAD=1 and one record folder, each run on an empty Triton cache.

Run 1 compiles what the workload launches (nothing is planned) and records every variant; run 2 reads
the record at start, helpers build it at REPLAY priority, and the workload should compile nothing on
its executor after warmup. Writes, under --out: record_replay.md and .json (both runs), each run's stats
log, its coverage report (text, and HTML with the timeline), and the record's header.

    python scripts/gpu/record_replay.py --out results/<date>-h200-record-replay
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def versions() -> dict:
    from importlib.metadata import version

    import torch
    import triton

    return {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
            "flash-linear-attention": version("flash-linear-attention"), "liger-kernel": version("liger-kernel"),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}


def run(n: int, out: str, record_dir: str, timeout: float) -> dict:
    stats = os.path.join(out, f"run{n}.stats.jsonl")
    if os.path.exists(stats):
        os.remove(stats)
    cache = tempfile.mkdtemp(prefix=f"jit_ahead_replay_cache{n}_")
    env = dict(os.environ, JIT_AHEAD="1", JIT_AHEAD_RECORD_DIR=record_dir, JIT_AHEAD_STATS=stats,
               TRITON_CACHE_DIR=cache)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "third_party_workload.py")], env=env,
                          capture_output=True, text=True, timeout=timeout)
    shutil.rmtree(cache, ignore_errors=True)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        return {"run": n, "error": proc.stderr[-3000:]}
    result = {"run": n, **json.loads(line[len("RESULT "):]), "stderr_tail": proc.stderr[-1500:]}
    for fmt in ("text", "html"):
        args = [sys.executable, "-m", "jit_ahead.cli", "report", stats]
        if fmt == "html":
            args += ["--html", os.path.join(out, f"run{n}.report.html")]
        report = subprocess.run(args, capture_output=True, text=True)
        if fmt == "text":
            with open(os.path.join(out, f"run{n}.report.txt"), "w") as f:
                f.write(report.stdout + report.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="a results/<date>-<what> folder")
    parser.add_argument("--timeout", type=float, default=280)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    record_dir = tempfile.mkdtemp(prefix="jit_ahead_records_")  # private (0700), as records must be
    results = [run(1, args.out, record_dir, args.timeout), run(2, args.out, record_dir, args.timeout)]
    records = sorted(os.listdir(record_dir))
    if records:
        with open(os.path.join(record_dir, records[0])) as f:
            lines = f.read().splitlines()
        with open(os.path.join(args.out, "record_header.json"), "w") as f:
            json.dump({"file": records[0], "header": json.loads(lines[0]), "entries": len(lines) - 1}, f, indent=1)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "records": records, "runs": results}
    with open(os.path.join(args.out, "record_replay.json"), "w") as f:
        json.dump(report, f, indent=1)
    rows = ["# Record and replay on the GPU (" + report["date"] + ")", "",
            f"`python scripts/gpu/record_replay.py --out {args.out}`; " +
            ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".", "",
            "Workload: `scripts/gpu/third_party_workload.py` (Liger-Kernel ops outside the Liger provider's "
            "set and fla's GatedLinearAttention; no provider plans them). Both runs: JIT_AHEAD=1, the same record folder, an empty "
            "Triton cache.", "",
            "| run | warmup end s | end s | executor compiles warmup / serving | worst request s | median request s |",
            "|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['run']} | error: {r['error'][-200:]!r} | | | | |")
            continue
        rows.append(f"| {r['run']} | {r['warmup_end_s']:.1f} | {r['end_s']:.1f} | {r['executor_compiles_warmup']} / "
                    f"{r['executor_compiles_serving']} | {r['worst_request_s']:.3f} | {r['median_request_s']:.4f} |")
    rows += ["", "Coverage reports: `run1.report.txt`/`.html`, `run2.report.txt`/`.html`; stats logs "
             "`run*.stats.jsonl`; the record's header: `record_header.json`."]
    with open(os.path.join(args.out, "record_replay.md"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
