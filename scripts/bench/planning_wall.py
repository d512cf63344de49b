#!/usr/bin/env python3
"""Wall time of planning a whole model within engine limits, by planner count, and of reading it back.

Each run is a fresh process: start a session without helpers (planning only), build the model on meta,
``plan_model`` with no saved plan, wait for every launch to be enumerated. Reports wall seconds, the part
before the first launch ran (plan key, probe forward, listing the launches), the shortest and longest
planner, the CPU seconds of the server process and of its planners, launches and variants. Then one more process with the
plan that run saved: the time ``plan_model`` takes to read it (no probe, no planner). Runs of the planner
counts are interleaved when repeated. With ``--baseline DIR`` (the root of another checkout, e.g.
``git archive`` of an older commit unpacked there), every run is made with that checkout's jit_ahead too,
the two alternating, so that a change is measured as a ratio on one machine in one run.

    python scripts/bench/planning_wall.py --out results/<date>-planning-wall [--models gated-deltanet,qwen3-liger]
        [--limits 8192,16,4096] [--planners 1,2,4,8,15] [--repeat 1] [--baseline DIR]

Models: the demo models (gated-deltanet, qwen3-liger, qwen35-hybrid) and the model planner's test models
(olmo-hybrid, plain-hybrid, qwen3-next-liger: a MoE hybrid, fla-kda, qwen3-moe-liger: a MoE model); a name
ending in ``/model-only`` plans it with the model-level planner alone (no library provider), to compare
with the providers' path.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from first_build import run_child, tree, versions  # noqa: E402


TEST_MODELS = {"olmo-hybrid": "olmo_hybrid", "plain-hybrid": "plain_hybrid", "qwen3-next-liger": "qwen3_next_liger",
               "fla-kda": "fla_kda", "qwen3-moe-liger": "qwen3_moe_liger"}


def build(name: str):
    from jit_ahead import demo_models

    if name in TEST_MODELS:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        from tests import any_models

        return getattr(any_models, TEST_MODELS[name])()
    return demo_models.MODELS[name](device="meta", layers=4)


def one_run(model: str, limits: tuple[int, int, int]) -> dict:
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.session import Session

    from jit_ahead.providers.model import ModelProvider

    name, _, path = model.partition("/")
    # in an engine's order: the session starts, then the model is built, then planned
    session = Session(triton={"workers": 0}).start()
    net = build(name)
    providers = [ModelProvider()] if path == "model-only" else None
    tokens, batch, seq = limits
    graphs = tuple(b for b in (1, 2, 4, 8, 16) if b <= batch)
    before = os.times()
    t0 = time.perf_counter()
    run = session.plan_model(net, EngineLimits(tokens, batch, seq, cuda_graph_batch_sizes=graphs), providers)
    run.wait(3600)
    wall = time.perf_counter() - t0
    after = os.times()
    session.close()
    return {"model": model, "limits": list(limits), "planners": int(os.environ.get("JIT_AHEAD_PLANNERS", "0")),
            "wall_s": round(wall, 2), "server_cpu_s": round(after.user - before.user + after.system - before.system, 2),
            "planner_cpu_s": round(after.children_user - before.children_user
                                   + after.children_system - before.children_system, 2),
            "listing_s": round(run.listing_seconds, 2),
            "planner_s": [round(min(run.planner_seconds or [0]), 2), round(max(run.planner_seconds or [0]), 2)],
            "launches": run.launches, "variants": sum(run.variants.values()), "read_saved_plan": run.read_saved,
            "errors": run.errors[:3]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--models", default="gated-deltanet,qwen3-liger")
    parser.add_argument("--limits", default="8192,16,4096")
    parser.add_argument("--planners", default="1,2,4,8,15")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline", default=None, help="another checkout's root: its jit_ahead, alternating")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    limits = tuple(int(v) for v in args.limits.split(","))
    if args.one:
        # The code to measure goes first on the path: the bench helpers imported above put this checkout's
        # root there, which would otherwise shadow a --baseline's jit_ahead (it did, until this check).
        code = os.environ.get("PLANNING_WALL_CODE")
        if code:
            assert "jit_ahead" not in sys.modules, "jit_ahead was imported before the code to measure was chosen"
            sys.path.insert(0, code)
        result = one_run(args.models, limits)
        import jit_ahead

        result["jit_ahead"] = os.path.dirname(os.path.dirname(os.path.abspath(jit_ahead.__file__)))
        print("RUN " + json.dumps(result), flush=True)
        return 0
    if not args.out:
        parser.error("--out is required")
    runs = []
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    codes = {"this": None}
    if args.baseline:
        codes["baseline"] = os.path.abspath(args.baseline)

    def launch(model: str, planners: str, plans: str, code: str) -> dict:
        env = dict(os.environ, JIT_AHEAD_PLANNERS=planners, JIT_AHEAD_PLAN_DIR=plans)
        env["PLANNING_WALL_CODE"] = codes[code] or os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        result = run_child(__file__, ["--models", model, "--limits", args.limits], env, 3600,
                           {"model": model, "planners": planners})
        return dict(result, code=code)

    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as scratch:
            for index in range(args.repeat):
                for planners in args.planners.split(","):
                    # alternate which code runs first, so that neither always meets a warmer machine
                    for code in list(codes)[::1 if index % 2 == 0 else -1]:
                        plans = tempfile.mkdtemp(dir=scratch)
                        result = dict(launch(model, planners, plans, code), run=index)
                        runs.append(result)
                        print(json.dumps(result), flush=True)
                        write_report(args.out, runs, codes, args, started)
                        if code == "this":
                            kept = plans
            read = dict(launch(model, args.planners.split(",")[-1], kept, "this"), run="saved plan read")
            runs.append(read)
            print(json.dumps(read), flush=True)
    write_report(args.out, runs, codes, args, started, show=True)
    return 0


def write_report(out: str, runs: list, codes: dict, args, started: str, show: bool = False) -> None:
    """The JSON and the table of the runs so far: written after each run, so that a run cut off by a
    time limit still leaves what it measured."""
    report = {"date": started, "tree": tree(), "versions": versions(), "command": " ".join(sys.argv), "runs": runs}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "planning_wall.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = [f"# Planning a whole model within {args.limits} (tokens, batch, sequence) ({report['date']}, "
             f"tree {report['tree']})", "",
             f"`{report['command']}`; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()), "",
             "| model | code | planners | run | wall s | to the first launch s | each planner s (min-max) | server CPU s "
             "| planners' CPU s | launches | variants |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['model']} | {r.get('code')} | {r['planners']} | {r.get('run')} | "
                         f"error: {r['error'][-120:]!r} | | | | | | |")
            continue
        each = "-".join(map(str, r["planner_s"]))
        lines.append(f"| {r['model']} | {r['code']} | {r['planners']} | {r['run']} | {r['wall_s']} | {r['listing_s']} | "
                     f"{each} | {r['server_cpu_s']} | {r['planner_cpu_s']} | {r['launches']} | {r['variants']} |")
    if "baseline" in codes:
        for model in args.models.split(","):
            for planners in args.planners.split(","):
                wall = {code: [r["wall_s"] for r in runs if r.get("code") == code and r["model"] == model
                               and r["planners"] == int(planners) and isinstance(r.get("run"), int)
                               and "error" not in r] for code in codes}
                if wall["this"] and wall["baseline"]:
                    lines.append(f"\n{model}, {planners} planners: wall this / baseline, medians of "
                                 f"{len(wall['this'])} and {len(wall['baseline'])} runs: "
                                 f"{statistics.median(wall['this']):.2f} / {statistics.median(wall['baseline']):.2f} s "
                                 f"= {statistics.median(wall['this']) / statistics.median(wall['baseline']):.3f}")
    with open(os.path.join(out, "planning_wall.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if show:
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
