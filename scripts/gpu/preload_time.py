"""Where the helpers' start goes: the fork server's import of a kernel library, alone and beside a server.

In the cold-start runs the fork server is ready (torch, Triton, jit_ahead imported) about 10 s after
process start and finishes importing flash-linear-attention about 17 s later, while the server process
builds its own model in about 22 s. This script times, each in fresh processes on the same machine:

  import            ``import torch, triton`` then the library's modules, normal priority, GPU visible
  import-helper     the same at nice 19 with the GPU hidden (as a helper runs)
  forkserver-alone  a jit_ahead session whose fork server preloads the modules; the server process idles
  forkserver-beside the same while the server process imports the library and builds the GatedDeltaNet
                    demo model on the GPU (what a serving start does meanwhile)

Run twice in a row per arm (Python's bytecode cache is written by the first). Writes preload_time.json
and .md to --out.

    python scripts/gpu/preload_time.py --out results/<date>-h200-preload-time
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

MODULES = ("fla.ops.gated_delta_rule", "fla.modules")

IMPORT = """
import time; t0 = time.perf_counter()
import torch, triton
t1 = time.perf_counter()
import importlib
for m in {modules!r}: importlib.import_module(m)
t2 = time.perf_counter()
print("RESULT", t1 - t0, t2 - t1)
"""

SESSION = """
import time, sys; T = time.time(); P = time.perf_counter()
import torch, importlib
from jit_ahead.session import Session
events = []
session = Session(triton={{"preload": {modules!r}}})
session.stats.subscribe(lambda e: events.append((e["event"], e["time"] - T)))
session.start()
beside = {beside!r}
main_done = None
if beside:
    from jit_ahead import demo_models
    for m in {modules!r}: importlib.import_module(m)
    model = demo_models.fla_gated_deltanet(device="cuda")
    torch.cuda.synchronize()
    main_done = time.perf_counter() - P
deadline = time.time() + 120
while time.time() < deadline and not any(e == "forkserver_preloaded" for e, _ in events):
    time.sleep(0.05)
times = {{e: t for e, t in reversed(events)}}  # first occurrence of each
print("RESULT", times.get("forkserver_ready"), times.get("forkserver_preloaded"), main_done)
session.close()
"""


def run(code: str, env: dict | None = None, nice: bool = False) -> list:
    command = [sys.executable, "-c", code]
    if nice:
        command = ["nice", "-n", "19"] + command
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(proc.stderr[-2000:])
    return [None if v == "None" else float(v) for v in line.split()[1:]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="a results/<date>-<what> folder")
    args = parser.parse_args()
    hidden = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    rows = []
    for arm in ("import", "import-helper", "forkserver-alone", "forkserver-beside"):
        for attempt in (1, 2):
            t0 = time.perf_counter()
            if arm.startswith("import"):
                torch_s, library_s = run(IMPORT.format(modules=MODULES), env=hidden if arm == "import-helper" else None,
                                         nice=arm == "import-helper")
                row = {"arm": arm, "attempt": attempt, "torch_triton_s": torch_s, "library_s": library_s}
            else:
                ready, preloaded, main_done = run(SESSION.format(modules=MODULES, beside=arm == "forkserver-beside"))
                row = {"arm": arm, "attempt": attempt, "forkserver_ready_s": ready, "forkserver_preloaded_s": preloaded,
                       "preload_s": None if ready is None or preloaded is None else preloaded - ready,
                       "server_model_built_s": main_done}
            row["process_wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serving_loop import versions

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "modules": MODULES, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "preload_time.json"), "w") as f:
        json.dump(report, f, indent=1)

    def cell(value) -> str:
        return "" if value is None else f"{value:.1f}"

    lines = [f"# Fork server preload time ({report['date']})", "",
             "`python scripts/gpu/preload_time.py`; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items())
             + f"; modules {', '.join(MODULES)}.", "",
             "| arm | attempt | torch + triton import s | library import s | fork server ready s | "
             "preloaded s | preload s | server model built s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['attempt']} | {cell(r.get('torch_triton_s'))} | {cell(r.get('library_s'))} | "
                     f"{cell(r.get('forkserver_ready_s'))} | {cell(r.get('forkserver_preloaded_s'))} | "
                     f"{cell(r.get('preload_s'))} | {cell(r.get('server_model_built_s'))} |")
    with open(os.path.join(args.out, "preload_time.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
