#!/usr/bin/env python3
"""Planning cost: seconds to enumerate a layer type's launch space through its real launcher on meta.

For each planned site of the built-in providers on the demo models (jit_ahead.demo_models), runs every
launch the provider enumerates within the limits, in one capture, and reports launches, variants,
seconds and microseconds per launch. The row-wise Liger layers are enumerated over tokens 1..--tokens
(default 16384, the issue's yardstick: about a second or less per layer type). fla's padded batches (an
attention mask: fla unpads on the host and runs varlen kernels) get rows of their own, "(padded)", and with
``--continued`` so do its continued prefills (a prompt onto a cache holding a state).

With ``--device cuda`` the models hold real weights on the GPU, as a server's do when it plans after
building them: planning then calls meta replicas of their layers (``MetaCaller``).

    python scripts/bench/planning_cost.py --out results/<folder> [--tokens 16384] [--device meta|cuda] [--continued]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_throughput import versions  # noqa: E402


def measure(provider, model, limits) -> list[dict]:
    from jit_ahead.triton import capture

    rows = []
    t0 = time.perf_counter()
    sites = provider.find_layers(model)
    rows.append({"provider": provider.name, "site": "find_layers (probe forward)", "launches": 0, "variants": 0,
                 "seconds": time.perf_counter() - t0})
    for site in sites:
        # padded batches (fla's attention-mask path: unpadding on the host, varlen kernels) timed apart
        groups: dict[str, list] = {}
        for launch in provider.launches([site], limits):
            kind = " ".join(word for word in ("padded", "continued") if f" {word} " in launch.label)
            groups.setdefault(kind, []).append(launch)
        label = getattr(site, "label", None) or type(site).__name__
        for kind, launches in groups.items():
            with capture() as plan:
                t0 = time.perf_counter()
                for launch in launches:
                    launch.run()
                seconds = time.perf_counter() - t0
            rows.append({"provider": provider.name, "site": label + (f" ({kind})" if kind else ""),
                         "launches": len(launches), "variants": len(plan), "seconds": seconds,
                         "us_per_launch": 1e6 * seconds / len(launches)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="a results/<date>-<what> folder")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--device", default="meta", help="where the models' weights are (meta or cuda)")
    parser.add_argument("--continued", action="store_true",
                        help="also fla's continued prefills (extra fla_continued_prefill), in rows of their own")
    args = parser.parse_args()
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()  # before fla is imported: it reads the device at import
    from jit_ahead import demo_models
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.providers.fla import FlaGatedDeltaNetProvider
    from jit_ahead.providers.liger import LigerProvider

    liger_limits = EngineLimits(max_num_tokens=args.tokens, max_batch_size=64, max_seq_len=args.tokens)
    fla_limits = EngineLimits(max_num_tokens=1024, max_batch_size=4, max_seq_len=1024,
                              extra={"fla_continued_prefill": True} if args.continued else {})
    rows = measure(LigerProvider(), demo_models.liger_qwen3(device=args.device), liger_limits)
    rows += measure(FlaGatedDeltaNetProvider(), demo_models.fla_gated_deltanet(device=args.device), fla_limits)
    info = versions()
    report = {**info, "weights": args.device, "liger_limits": repr(liger_limits), "fla_limits": repr(fla_limits),
              "rows": rows}
    name = "planning_cost" + ("" if args.device == "meta" else f"_{args.device}") + ("_continued" * args.continued)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = [f"# Planning cost per layer type, weights on {args.device} ({info['date']})", "",
             f"`python scripts/bench/planning_cost.py --tokens {args.tokens} --device {args.device}"
             f"{' --continued' * args.continued}`; Python "
             f"{info['python']}, torch {info['torch']}, Triton {info['triton']}, {info['cpu']}, "
             f"{info['cpus_usable']} CPUs.",
             f"Liger limits: {liger_limits.max_num_tokens} tokens, batch {liger_limits.max_batch_size}; "
             f"fla limits: {fla_limits.max_num_tokens} tokens, batch {fla_limits.max_batch_size}, "
             f"seq {fla_limits.max_seq_len}.", "",
             "| provider | site | launches | variants | seconds | us per launch |", "|---|---|---|---|---|---|"]
    for r in rows:
        per = f"{r['us_per_launch']:.0f}" if "us_per_launch" in r else ""
        lines.append(f"| {r['provider']} | {r['site']} | {r['launches']} | {r['variants']} | {r['seconds']:.2f} | {per} |")
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
