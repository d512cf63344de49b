"""The ``jit-ahead`` command."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    if args.cache_dir:
        os.environ["TRITON_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    from jit_ahead import examples

    workloads = examples.by_name(args.workloads.split(",")) if args.workloads else examples.available()
    if not workloads:
        print("no workload library is installed: pip install 'jit_ahead[liger,fla]'", file=sys.stderr)
        return 2
    from triton import knobs

    from jit_ahead.core.session import Session
    from jit_ahead.triton import capture
    from jit_ahead.triton.standin import ensure_driver, parse_target

    target = ensure_driver(parse_target(args.target))  # a real GPU wins over --target
    examples.import_libraries(workloads)  # after the driver: fla reads the device at import
    t0 = time.perf_counter()
    with capture(target) as planned:
        for workload in workloads:
            workload.run(*workload.make_inputs("meta", 0))
    plan_s = time.perf_counter() - t0
    kernels = sorted({f"{r.module}.{r.qualname}" for r in planned.requests})
    print(f"planned {len(planned)} variants of {len(kernels)} kernels from {len(workloads)} workloads "
          f"({planned.launches} captured launches, {plan_s:.2f}s, target {target.backend}:{target.arch})")

    session = Session(triton={"workers": args.workers} if args.workers is not None else {})
    t0 = time.perf_counter()
    with session:
        workers = session.triton.pool.workers
        tickets = session.triton.submit(planned)
        for ticket in tickets:
            ticket.wait(None)
    wall = time.perf_counter() - t0
    results = [t.result for t in tickets if t.result is not None]
    failed = [r for r in results if not r.ok]
    serial = sum(r.seconds for r in results)
    per_kernel: dict[str, int] = {}
    for request in planned.requests:
        name = f"{request.module}.{request.qualname}"
        per_kernel[name] = per_kernel.get(name, 0) + 1
    print(f"{'kernel':<90} variants")
    for name in kernels:
        print(f"{name:<90} {per_kernel[name]:>8}")
    already = len(planned) - len(tickets)
    print(f"built {len(results) - len(failed)} variants in {wall:.1f}s wall with {workers} helpers "
          f"(nice 19, no GPU); serial compilation would have cost {serial:.1f}s of compile time"
          + (f"; {already} were already on disk" if already else ""))
    print(f"cache: {os.path.abspath(knobs.cache.dir)}")
    for result in failed:
        print(f"FAILED {result.key[:12]}: {result.error.splitlines()[-1]}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jit-ahead", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="plan third-party kernels on meta tensors and build them in helpers")
    demo.add_argument("--target", default=os.environ.get("JIT_AHEAD_TARGET", "cuda:90"),
                      help="GPU target to build for when there is no GPU (default cuda:90)")
    demo.add_argument("--workers", type=int, default=None,
                      help="helpers (default: JIT_AHEAD_TRITON_WORKERS or the CPUs per local rank)")
    demo.add_argument("--cache-dir", default=None, help="Triton cache directory (default: Triton's)")
    demo.add_argument("--workloads", default="", help="comma-separated workload names (default: all installed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
