#!/usr/bin/env python3
"""Time to the first finished build after the first queued request, by helper start mode.

Each run is a fresh process that does what a server does before planning: imports the kernel library and
builds its model (so the library is imported in the server), then starts jit_ahead on an empty Triton
cache and plans the model within the limits. From the stats events it reports: when the first request
was queued, when the fork server was ready, when its preloads were done, and when the first build by a
helper finished, all against the first queued request; plus planning (all launches enumerated) and the
time until every variant was built. Modes (``JIT_AHEAD_HELPER_START``): ``server`` (the fork server is a
fork of the server), ``fork`` (a fresh interpreter imports what helpers need), ``spawn``. Runs of the
modes are interleaved, each with its own empty cache and plan folder.

    python scripts/bench/first_build.py --out results/<date>-first-build [--model gated-deltanet]
        [--limits 8192,16,4096] [--modes server,fork,spawn] [--repeat 3]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_throughput import versions as machine_versions  # noqa: E402


def one_run(model: str, limits: tuple[int, int, int]) -> dict:
    t_start = time.time()
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()  # a real GPU wins; the stand-in (sm_90) otherwise, before fla reads the device
    from jit_ahead import demo_models
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session

    net = (demo_models.fla_gated_deltanet if model == "gated-deltanet" else demo_models.liger_qwen3)(device="meta")
    events: list[dict] = []
    session = Session()
    session.stats.subscribe(events.append)
    session.start()
    t_session = time.time()
    tokens, batch, seq = limits
    graphs = tuple(b for b in (1, 2, 4, 8, 16) if b <= batch)
    run = session.plan_model(net, EngineLimits(tokens, batch, seq, cuda_graph_batch_sizes=graphs))
    run.wait(1800)
    t_planned = time.time()
    session.wait_ready(timeout=1800, priority=Priority.BACKGROUND)
    t_built = time.time()
    session.close()

    def first(name: str, **match) -> float | None:
        found = [e["time"] for e in events if e["event"] == name and all(e.get(k) == v for k, v in match.items())]
        return min(found) if found else None

    queued = first("queued")
    helper_builds = [e["time"] for e in events if e["event"] == "build_finish" and e.get("helper") != "executor"]
    rel = (lambda t: None if t is None or queued is None else round(t - queued, 3))
    return {"model": model, "limits": list(limits), "mode": os.environ.get("JIT_AHEAD_HELPER_START", "server"),
            "planners": os.environ.get("JIT_AHEAD_PLANNERS"), "helpers": session.families["triton"].pool.workers,
            "process_to_session_s": round(t_session - t_start, 3),
            "first_queued_after_session_s": None if queued is None else round(queued - t_session, 3),
            "forkserver_ready_s": rel(first("forkserver_ready")),
            "forkserver_preloaded_s": rel(first("forkserver_preloaded")),
            "first_helper_build_s": rel(min(helper_builds) if helper_builds else None),
            "planning_s": round(t_planned - t_session, 3), "all_built_s": round(t_built - t_session, 3),
            "variants": sum(run.variants.values()), "launches": run.launches, "errors": run.errors[:3]}


def run_child(script: str, arguments: list[str], env: dict, timeout: float, about: dict) -> dict:
    """``script --one ARGUMENTS`` in a fresh interpreter: the result it printed on its ``RUN`` line, else
    ``about`` with the end of its stderr as the error."""
    proc = subprocess.run([sys.executable, script, "--one", *arguments], env=env, capture_output=True, text=True,
                          timeout=timeout)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RUN ")), None)
    return json.loads(line[4:]) if line else {**about, "error": proc.stderr[-1500:]}


def versions() -> dict:
    """The machine's (build_throughput.versions) and the kernel libraries' versions."""
    from importlib.metadata import PackageNotFoundError, version

    info = machine_versions()
    for dist in ("liger-kernel", "fla-core"):
        try:
            info[dist] = version(dist)
        except PackageNotFoundError:
            info[dist] = None
    return info


def tree() -> str:
    """The checkout's commit, marked when its files differ from it (a copy sent to a GPU machine may carry
    an older .git than its files: the results folder's README names the real tree)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               cwd=here).stdout.strip()
    except OSError:
        return "?"
    return f"{head} with changes" if dirty else head


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--model", default="gated-deltanet", choices=("gated-deltanet", "qwen3-liger"))
    parser.add_argument("--limits", default="8192,16,4096", help="max_num_tokens,max_batch_size,max_seq_len")
    parser.add_argument("--modes", default="server,fork,spawn")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    limits = tuple(int(v) for v in args.limits.split(","))
    if not args.one and not args.out:
        parser.error("--out is required")
    if args.one:
        print("RUN " + json.dumps(one_run(args.model, limits)), flush=True)
        return 0
    runs = []
    for index in range(args.repeat):
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory() as scratch:
                env = dict(os.environ, JIT_AHEAD_HELPER_START=mode, TRITON_CACHE_DIR=os.path.join(scratch, "cache"),
                           JIT_AHEAD_PLAN_DIR=os.path.join(scratch, "plans"))
                result = run_child(__file__, ["--model", args.model, "--limits", args.limits], env, args.timeout,
                                   {"mode": mode})
            result["run"] = index
            runs.append(result)
            print(json.dumps(result), flush=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "tree": tree(),
              "versions": versions(), "command": " ".join(sys.argv), "runs": runs}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "first_build.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = [f"# First finished build after the first queued request ({report['date']}, tree {report['tree']})", "",
             f"`{report['command']}`; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()), "",
             "First queued, planning done and all built: seconds after the session started; fork server ready, "
             "preloaded and first helper build: seconds after the first queued request.", "",
             "| mode | run | first queued | planning done | fork server ready | preloaded | first helper build "
             "| all built | variants | helpers |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['run']} | error: {r['error'][-120:]!r} | | | | | | | |")
            continue
        lines.append(f"| {r['mode']} | {r['run']} | {r['first_queued_after_session_s']} | {r['planning_s']} | "
                     f"{r['forkserver_ready_s']} | {r['forkserver_preloaded_s']} | {r['first_helper_build_s']} | "
                     f"{r['all_built_s']} | {r['variants']} | {r['helpers']} |")
    with open(os.path.join(args.out, "first_build.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
