"""Issue 37's soak: starts in a row on one Triton cache and plan folder, each with random faults injected,
each expected to end with a whole plan and no executor compile after serving starts (CPU, stand-in driver).

Each start is a fresh process that plans fla's GatedDeltaNet (one layer, a model the providers plan) within
small limits, waits for every planned variant, warms up, marks serving and serves random requests on meta.
Before a start, the parent injects one of: nothing; a damaged saved plan (cut in half, not text, a FIFO in
its place); the plan lock's place taken (as a read-only folder refuses it); Triton cache entries cut short;
and while the start runs, it SIGKILLs or SIGSTOPs (for a few seconds) a random planner or helper of it.

    python scripts/bench/soak_faults.py --starts 20 --out results/<date>-cpu-soak-faults
A start whose plan is not whole or that compiled after serving started is reported; the exit code is 1 then.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

START = """
import json, random, sys
from jit_ahead.triton.standin import ensure_driver
ensure_driver()
from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core.priority import Priority
from jit_ahead.session import Session
limits = EngineLimits(max_num_tokens=512, max_batch_size=4, max_seq_len=512, cuda_graph_batch_sizes=(1, 2, 4))
session = Session().start()
model = demo_models.fla_gated_deltanet(layers=1)
run = session.plan_model(model, limits)
run.wait(600)
ready = session.wait_ready(timeout=600, priority=Priority.BACKGROUND)
counter = demo_models.CompileCounter().install()
demo_models.warmup(model, limits, "meta")
session.mark_serving(tune_ahead=False)
counter.phase = "serving"
rng = random.Random(int(sys.argv[1]))
for i in range(12):
    batch = rng.randint(1, limits.max_batch_size)
    prompt = rng.randint(1, limits.max_num_tokens // batch)
    demo_models.serve(model, batch, prompt, rng.randint(1, 3), device="meta", seed=i)
print("START " + json.dumps({"whole": run.launches_lost == 0 and not run.errors, "errors": run.errors,
                             "read_saved": run.read_saved, "variants": sum(run.variants.values()), "ready": ready,
                             "compiles_serving": len(counter.compiled["serving"])}))
session.close()
"""

FAULTS = ("none", "plan-cut", "plan-not-text", "plan-fifo", "lock-taken", "cache-cut", "kill", "stop")


def inject_before(fault: str, plans: Path, cache: Path, rng: random.Random) -> str:
    saved = sorted(p for p in plans.glob("plan-*.jsonl") if not p.name.endswith(".partial.jsonl"))
    if fault.startswith("plan-") and saved:
        plan = rng.choice(saved)
        data = plan.read_bytes() if plan.is_file() else b""
        plan.unlink()
        if fault == "plan-cut":
            plan.write_bytes(data[: len(data) // 2])
        elif fault == "plan-not-text":
            plan.write_bytes(b"\xff\xfe\x00" + data[:64])
        else:
            os.mkfifo(plan, 0o600)
        return f"{fault} {plan.name}"
    if fault == "lock-taken" and saved:
        lock = plans / ("." + saved[0].name.rsplit(".", 1)[0] + ".lock")
        if lock.is_file():
            lock.unlink()
        lock.mkdir(exist_ok=True)
        return f"{fault} {lock.name}"
    if fault == "cache-cut":
        cubins = sorted(cache.rglob("*.cubin"))
        for cubin in rng.sample(cubins, min(3, len(cubins))):
            cubin.write_bytes(cubin.read_bytes()[:100])
        return f"{fault} {min(3, len(cubins))} entries"
    if fault in ("kill", "stop"):  # planners and helpers must run for the strike to meet one
        for plan in saved:
            plan.unlink()
        entries = sorted({c.parent for c in cache.rglob("*.cubin")})
        gone = rng.sample(entries, len(entries) // 2)
        for entry in gone:
            shutil.rmtree(entry, ignore_errors=True)
        return f"{fault} (saved plan and {len(gone)} of {len(entries)} cache entries removed first)"
    return fault if fault == "none" else f"{fault} (nothing to damage yet)"


def strike(pid: int, fault: str, rng: random.Random, done: threading.Event, log: list) -> None:
    """SIGKILL or SIGSTOP (then SIGCONT) one random descendant of the start (a planner, a helper or the fork
    server), after a random delay, as soon as it has one."""
    if done.wait(rng.uniform(0.5, 3.0)):
        return
    children = []
    while not children and not done.wait(0.05):
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return
    if not children:
        log.append("no planner or helper to strike: the start ended first")
        return
    victim = rng.choice(children)
    try:
        what = " ".join(victim.cmdline())[-60:]
        victim.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        log.append(f"{fault} pid {victim.pid} ({what})")
        if fault == "stop":
            done.wait(3.0)
            victim.send_signal(signal.SIGCONT)
    except psutil.Error:
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="jit_ahead_soak_"))
    plans, cache = work / "plans", work / "cache"
    plans.mkdir(mode=0o700)
    # the soak's own tuning folder: choices its stand-in benchmarks make must not land in the user's default one
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), JIT_AHEAD_PLAN_DIR=str(plans),
               JIT_AHEAD_TUNING_DIR=str(work / "tuning"), PYTHONPATH=str(REPO))
    rows, failed = [], 0
    for index in range(args.starts):
        fault = "none" if index == 0 else rng.choice(FAULTS)
        injected = [inject_before(fault, plans, cache, rng)]
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", START, str(rng.randrange(1 << 30))], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        done = threading.Event()
        striker = None
        if fault in ("kill", "stop"):
            striker = threading.Thread(target=strike, args=(proc.pid, fault, rng, done, injected), daemon=True)
            striker.start()
        try:
            out, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done.set()
        if striker is not None:
            striker.join(10)
        line = next((l for l in out.splitlines() if l.startswith("START ")), None)
        result = json.loads(line[6:]) if line else {"whole": False, "errors": [err[-600:]], "compiles_serving": None}
        ok = proc.returncode == 0 and result["whole"] and result["compiles_serving"] == 0
        failed += not ok
        row = {"start": index, "injected": injected, "seconds": round(time.perf_counter() - t0, 1),
               "returncode": proc.returncode, "ok": ok, **result}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{args.starts - failed} of {args.starts} starts whole with no compile after serving started")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "soak_faults.json"), "w") as f:
            json.dump({"seed": seed, "starts": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
