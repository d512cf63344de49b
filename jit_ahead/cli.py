"""The ``jit-ahead`` command."""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time

# the last is a model no provider knows by class (transformers' own layers calling fla's ops): the
# model-level planner plans it
MODELS = ("qwen3-liger", "gated-deltanet", "qwen35-hybrid")


def _limits(args: argparse.Namespace):
    from jit_ahead.core.planning.limits import EngineLimits

    graphs = tuple(b for b in (1, 2, 4, 8) if b <= args.max_batch_size)
    return EngineLimits(max_num_tokens=args.max_num_tokens, max_batch_size=args.max_batch_size,
                        max_seq_len=args.max_seq_len, cuda_graph_batch_sizes=graphs)


def _make_model(name: str, device: str):
    from jit_ahead import demo_models

    return demo_models.MODELS[name](device=device)


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it or its package: fla reads the GPU when
    imported, and must not do so before the driver (real or stand-in) is in place."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    path = rest.split(".")
    return any(os.path.exists(os.path.join(root, *path)) or os.path.exists(os.path.join(root, *path) + ".py")
               for root in spec.submodule_search_locations or ())


def _installed(names: list[str]) -> list[str]:
    needs = {"qwen3-liger": ("liger_kernel", "transformers"), "gated-deltanet": ("fla.layers", "transformers"),
             "qwen35-hybrid": ("liger_kernel", "fla.ops", "transformers")}
    ok = []
    for name in names:
        if all(_importable(module) for module in needs[name]):
            ok.append(name)
        else:
            print(f"skipping {name}: its library is not installed", file=sys.stderr)
    return ok


def _demo(args: argparse.Namespace) -> int:
    if args.cache_dir:
        os.environ["TRITON_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    from triton import knobs

    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session
    from jit_ahead.progress import BuildProgress, LibraryNotes
    from jit_ahead.triton.standin import ensure_driver, real_driver_available

    # first: the kernel libraries must see the target's GPU when they are imported (a real GPU wins)
    target = ensure_driver(args.target)
    names = _installed(args.models)
    if not names:
        print("no demo model can be built: pip install 'jit_ahead[liger,fla]'", file=sys.stderr)
        return 2
    on_gpu = real_driver_available()
    limits = _limits(args)
    print(f"target {target.backend}:{target.arch}{' (this GPU)' if on_gpu else ' (no GPU: stand-in driver)'}; "
          f"limits: {limits.max_num_tokens} tokens per forward, batch {limits.max_batch_size}, "
          f"sequence {limits.max_seq_len}, CUDA graphs {list(limits.cuda_graph_batch_sizes)}")
    session = Session(triton={"workers": args.workers} if args.workers is not None else {}).start()
    if importlib.util.find_spec("transformers") is not None:  # its logger's own handler, to hold back too
        importlib.import_module("transformers.utils.logging")
    notes = LibraryNotes()
    try:
        with notes:
            t0 = time.perf_counter()
            with BuildProgress(session.families["triton"].table) as progress:
                runs = {name: session.plan_model(_make_model(name, "meta"), limits) for name in names}
                notes.cover_new_handlers()  # the model libraries are imported now
                for name, run in runs.items():  # each as soon as it is known
                    run.wait()
                    progress.write(_planned_line(name, run))
                session.wait_ready(priority=Priority.BACKGROUND)
            wall = time.perf_counter() - t0
            status = _report_builds(runs, session.families["triton"].pool.workers, wall)
            print(f"cache: {os.path.abspath(knobs.cache.dir)}")
            if on_gpu and status == 0:
                status = _serve_on_gpu(session, names, limits, args.requests)
    finally:
        session.close()
        lines = notes.report()
        if lines:
            print(f"{len(lines)} notes from the kernel and model libraries (about them, not about this setup):",
                  file=sys.stderr)
            for line in lines:
                print(f"  {line}", file=sys.stderr)
    return status


def _planned_line(name: str, run) -> str:
    from jit_ahead.core.priority import Priority

    return (f"{name}: planned {sum(run.variants.values())} variants in {run.seconds:.1f}s "
            f"(WARMUP {run.variants.get(Priority.WARMUP, 0)})" + "".join(f"; {e}" for e in run.errors))


def _report_builds(runs: dict, workers: int, wall: float) -> int:
    tickets = [t for run in runs.values() for t in run.tickets]
    results = [t.result for t in tickets if t.result is not None]
    failed = [(t, t.result) for t in tickets if t.result is not None and not t.result.ok]
    per_kernel: dict[str, int] = {}
    by: dict[str, set[str]] = {}
    for run in runs.values():
        for kernel, providers in run.planned_by.items():
            by.setdefault(kernel, set()).update(providers)
    for run in runs.values():  # every planned variant, built now or found on disk
        for request in run.requests:
            name = f"{request.module}.{request.qualname}"
            per_kernel[name] = per_kernel.get(name, 0) + 1
    planned = sum(sum(run.variants.values()) for run in runs.values())
    print(f"{'kernel':<96} variants  planned by")
    for name in sorted(per_kernel):
        print(f"{name:<96} {per_kernel[name]:>8}  {','.join(sorted(by.get(name.rsplit('.', 1)[-1], ()))) or '-'}")
    serial = sum(r.seconds for r in results)
    already = planned - len(tickets)
    where = (f"with {workers} helper{'s' if workers != 1 else ''} (nice 19, no GPU)" if workers
             else "in this process (--workers 0)")
    print(f"built {len(results) - len(failed)} of {len(tickets)} variants in {wall:.1f}s wall {where}; "
          f"serial compilation would have cost {serial:.1f}s"
          + (f"; {already} were already on disk" if already else ""))
    for ticket, result in failed:
        print(f"FAILED {ticket.request.label}: {(result.error or '').strip().splitlines()[-1:]}", file=sys.stderr)
    return 1 if failed or len(results) < len(tickets) else 0


def _serve_on_gpu(session, names: list[str], limits, requests: int) -> int:
    """A short serving loop on the GPU: warmup, then random requests; counts executor compiles."""
    import torch

    from jit_ahead import demo_models

    counter = demo_models.CompileCounter().install()
    models = {name: _make_model(name, "cuda") for name in names}
    for model in models.values():
        demo_models.warmup(model, limits, "cuda")
    torch.cuda.synchronize()
    session.mark_serving()  # tune-ahead runs here, still in warmup
    torch.cuda.synchronize()
    counter.phase = "serving"
    worst = (0.0, "")  # seconds, and which request: a slow one says what it was
    for i, (batch, prompt) in enumerate(demo_models.request_shapes(limits, requests, seed=0)):
        name = names[i % len(names)]
        t0 = time.perf_counter()
        demo_models.serve(models[name], batch, prompt, 4, device="cuda", seed=i)
        torch.cuda.synchronize()
        worst = max(worst, (time.perf_counter() - t0, f"request {i + 1}, {name}, batch {batch}, prompt {prompt}"))
    counter.uninstall()
    warm, serving = (len(counter.compiled[phase]) for phase in ("warmup", "serving"))
    print(f"served {requests} requests on {torch.cuda.get_device_name(0)}: executor compiles in warmup "
          f"{warm}, after warmup {serving}; worst request {worst[0] * 1000:.0f} ms ({worst[1]})")
    return 0 if serving == 0 else 1


def _models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown model {', '.join(unknown) or repr(text)}; "
                                         f"choose from {', '.join(MODELS)} (comma-separated)")
    return names


def _target(text: str):
    from jit_ahead.triton.standin import parse_target

    try:
        return parse_target(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bounded(name: str, low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {name} from {low} to {high}")
        return value

    parse.__name__ = name  # argparse names the type in its own messages
    return parse


def _workers(text: str) -> int:
    from jit_ahead.core.knobs import MAX_PROCESSES, checked_process_count

    try:
        return checked_process_count("--workers", int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a helper count from 0 to {MAX_PROCESSES}") from None


def main(argv: list[str] | None = None) -> int:
    from jit_ahead.core.knobs import MAX_BATCH, MAX_TOKENS

    parser = argparse.ArgumentParser(prog="jit-ahead", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="plan small transformers models (Liger-Kernel, fla) within engine limits "
                                       "and build every variant in helpers",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    demo.add_argument("--target", type=_target, default=os.environ.get("JIT_AHEAD_TARGET", "cuda:90"),
                      help="GPU target to build for when there is no GPU, BACKEND:ARCH[:WARP_SIZE] "
                           "(JIT_AHEAD_TARGET)")
    demo.add_argument("--workers", type=_workers, default=None,
                      help="helpers (default: JIT_AHEAD_TRITON_WORKERS or the CPUs per local rank, minus one); "
                           "0 builds every variant in this process instead")
    demo.add_argument("--cache-dir", default=None, help="Triton cache directory (None: Triton's)")
    demo.add_argument("--models", type=_models, default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    demo.add_argument("--max-num-tokens", type=_bounded("token count", 1, MAX_TOKENS), default=256,
                      help="tokens per forward")
    demo.add_argument("--max-batch-size", type=_bounded("batch size", 1, MAX_BATCH), default=4,
                      help="sequences per forward")
    demo.add_argument("--max-seq-len", type=_bounded("sequence length", 1, MAX_TOKENS), default=256,
                      help="tokens per sequence")
    demo.add_argument("--requests", type=_bounded("request count", 0, 1 << 20), default=20,
                      help="requests in the GPU serving loop")
    report = sub.add_parser("report", help="coverage report from a stats log (JIT_AHEAD_STATS): per kernel, "
                                           "unplanned variants and what differs, an HTML timeline")
    report.add_argument("log", help="a stats log (.jsonl)")
    report.add_argument("--html", default=None, help="also write an HTML report with a timeline here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command == "report":
        return _report(args)
    return _demo(args)


def _report(args: argparse.Namespace) -> int:
    from jit_ahead.report import NotAStatsLog, report

    try:
        print(report(args.log, args.html), end="")
    except NotAStatsLog as exc:
        print(f"jit-ahead report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # names the file it is about: the input log, or the --html page
        html = args.html and os.path.abspath(args.html)
        what = "write" if html and exc.filename and os.path.abspath(exc.filename) == html else "read"
        print(f"jit-ahead report: cannot {what} {exc.filename or args.log}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.html:
        print(f"html: {os.path.abspath(args.html)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
