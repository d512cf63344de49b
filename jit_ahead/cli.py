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
    from jit_ahead.session import Session
    from jit_ahead.triton.standin import ensure_driver, real_driver_available

    # first: the kernel libraries must see the target's GPU when they are imported (a real GPU wins)
    target = ensure_driver(args.target)
    names = _installed(args.models)
    if not names:
        print("no demo model can be built: pip install 'jit_ahead[liger,fla]'", file=sys.stderr)
        return 2
    on_gpu = real_driver_available()
    limits = _limits(args)
    _say_target_and_limits(target, on_gpu, limits)
    session = Session(triton={"workers": args.workers} if args.workers is not None else {}).start()
    notes = _library_notes()
    try:
        with notes:
            models = ((name, _make_model(name, "meta")) for name in names)
            runs, status = _plan_and_build(session, models, limits, notes)
            if on_gpu and status == 0:
                status = _serve_on_gpu(session, names, limits, args.requests)
    finally:
        session.close()
        _show_notes(notes)
    return status


def _say_target_and_limits(target, on_gpu: bool, limits) -> None:
    print(f"target {target.backend}:{target.arch}{' (this GPU)' if on_gpu else ' (no GPU: stand-in driver)'}; "
          f"limits: {limits.max_num_tokens} tokens per forward, batch {limits.max_batch_size}, "
          f"sequence {limits.max_seq_len}, CUDA graphs {list(limits.cuda_graph_batch_sizes)}")


def _library_notes():
    from jit_ahead.progress import LibraryNotes

    if importlib.util.find_spec("transformers") is not None:  # its logger's own handler, to hold back too
        importlib.import_module("transformers.utils.logging")
    return LibraryNotes()


def _plan_and_build(session, models, limits, notes) -> tuple[dict, int]:
    """Plan each (name, model) as soon as it is made, build every variant with a progress display, and
    print what was built; returns the planning runs by name and the exit status."""
    from triton import knobs

    from jit_ahead.core.priority import Priority
    from jit_ahead.progress import BuildProgress

    t0 = time.perf_counter()
    with BuildProgress(session.families["triton"].table) as progress:
        runs = {name: session.plan_model(model, limits) for name, model in models}
        notes.cover_new_handlers()  # the model libraries are imported now
        for name, run in runs.items():  # each as soon as it is known
            run.wait()
            progress.write(_planned_line(name, run))
        session.wait_ready(priority=Priority.BACKGROUND)
    wall = time.perf_counter() - t0
    status = _report_builds(runs, session.families["triton"].pool.workers, wall)
    print(f"cache: {os.path.abspath(knobs.cache.dir)}")
    return runs, status


def _show_notes(notes) -> None:
    lines = notes.report()
    if lines:
        print(f"{len(lines)} notes from the kernel and model libraries (about them, not about this setup):",
              file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)


def _build(args: argparse.Namespace) -> int:
    if args.cache_dir:
        os.environ["TRITON_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    from jit_ahead.core import knobs
    from jit_ahead.core.store import configured
    from jit_ahead.prebuild import BuildInputError, make_model, run_setups
    from jit_ahead.session import Session
    from jit_ahead.triton.standin import ensure_driver, real_driver_available

    target = args.target
    if args.device_view is not None and real_driver_available():
        print(f"jit-ahead build: this machine's GPU is built for; --device-view ({args.device_view.name}) is not used",
              file=sys.stderr)
    elif args.device_view is not None:  # the server's GPU model, as `jit-ahead device-view` wrote it there
        from triton.backends.compiler import GPUTarget

        from jit_ahead.core import device_view
        from jit_ahead.triton.device import target_of

        device_view.install(args.device_view)
        target = GPUTarget(*target_of(args.device_view))
    target = ensure_driver(target)  # before any kernel library is imported: some read the GPU then
    limits = _build_limits(knobs.engine_limits(), args)
    _say_target_and_limits(target, real_driver_available(), limits)
    session = Session(triton={"workers": args.workers} if args.workers is not None else {}).start()
    notes = _library_notes()
    try:
        with notes:
            try:
                run_setups(args.setup)
                model = make_model(args.model)
            except BuildInputError as exc:
                print(f"jit-ahead build: {exc}", file=sys.stderr)
                return 2
            except Exception as exc:  # noqa: BLE001 - the user's code or config: said in one line, not a trace
                print(f"jit-ahead build: {args.model} could not be made ({type(exc).__name__}: {exc})", file=sys.stderr)
                return 2
            runs, status = _plan_and_build(session, [(type(model).__name__, model)], limits, notes)
            (run,) = runs.values()
            print(f"plan: {run.saved_plan or 'not saved (JIT_AHEAD_PLAN_DIR=0): a server plans again'}")
            store = configured()
            if store is not None:
                print(f"store: {store.describe()}")
            graphs = ",".join(map(str, limits.cuda_graph_batch_sizes))
            print(f"serve with: JIT_AHEAD=1 JIT_AHEAD_MAX_NUM_TOKENS={limits.max_num_tokens} "
                  f"JIT_AHEAD_MAX_BATCH_SIZE={limits.max_batch_size} JIT_AHEAD_MAX_SEQ_LEN={limits.max_seq_len} "
                  f"JIT_AHEAD_CUDA_GRAPH_SIZES={graphs}")
    finally:
        session.close()
        _show_notes(notes)
    return status


def _build_limits(knob_limits, args: argparse.Namespace):
    """The limits ``JIT_AHEAD=1`` serving plans within (the knobs), with what the command line sets instead."""
    from jit_ahead.core.planning.limits import EngineLimits

    tokens = args.max_num_tokens or knob_limits.max_num_tokens
    batch = args.max_batch_size or knob_limits.max_batch_size
    seq = args.max_seq_len or knob_limits.max_seq_len
    graphs = tuple(b for b in knob_limits.cuda_graph_batch_sizes if b <= batch)
    return EngineLimits(tokens, batch, seq, cuda_graph_batch_sizes=graphs)


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


def _device_view(path: str):
    import json

    from jit_ahead.core.device_view import DeviceView

    try:
        with open(path, encoding="utf-8") as f:
            return DeviceView.from_json(json.load(f))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # not JSON, or not a view
        raise argparse.ArgumentTypeError(f"{path} is not a device view ({exc})") from None


def _device_view_command(args: argparse.Namespace) -> int:
    import json

    from jit_ahead.core.device_view import DeviceView
    from jit_ahead.triton import device  # noqa: F401 - registers the Triton family's part of the view

    view = DeviceView.capture()
    if view is None:
        print("jit-ahead device-view: this machine has no GPU; run it on one of the servers' GPU model",
              file=sys.stderr)
        return 2
    text = json.dumps(view.to_json(), indent=1, sort_keys=True) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        print(f"jit-ahead device-view: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"device view of {view.name}: {os.path.abspath(args.output)}")
    return 0


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
    build = sub.add_parser("build", help="plan a model and build every variant within the limits, without a GPU "
                                         "(for an image or a CI job): a server started on them compiles nothing",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    build.add_argument("model", help="a local transformers model folder (its config.json; no weight is read) or "
                                     "module:function returning the model")
    build.add_argument("--setup", action="append", default=[], metavar="MODULE:FUNCTION",
                       help="called first, as the server does before building its model (a kernel library's "
                            "patches); repeatable")
    shown = build.add_mutually_exclusive_group()
    shown.add_argument("--target", type=_target, default=os.environ.get("JIT_AHEAD_TARGET", "cuda:90"),
                       help="GPU target to build for when there is no GPU, BACKEND:ARCH[:WARP_SIZE] "
                            "(JIT_AHEAD_TARGET); for sm_90 the GPU model shown is an H200")
    shown.add_argument("--device-view", type=_device_view, default=None, metavar="FILE",
                       help="the servers' GPU model, as `jit-ahead device-view` writes it on one of them: a server "
                            "of that model then finds the plan this build saved")
    build.add_argument("--workers", type=_workers, default=None,
                       help="helpers (default: JIT_AHEAD_TRITON_WORKERS or the CPUs, minus one); 0 builds here")
    build.add_argument("--cache-dir", default=None, help="Triton cache directory (None: Triton's)")
    build.add_argument("--max-num-tokens", type=_bounded("token count", 1, MAX_TOKENS), default=None,
                       help="tokens per forward (None: JIT_AHEAD_MAX_NUM_TOKENS, as a JIT_AHEAD=1 server)")
    build.add_argument("--max-batch-size", type=_bounded("batch size", 1, MAX_BATCH), default=None,
                       help="sequences per forward (None: JIT_AHEAD_MAX_BATCH_SIZE)")
    build.add_argument("--max-seq-len", type=_bounded("sequence length", 1, MAX_TOKENS), default=None,
                       help="tokens per sequence (None: JIT_AHEAD_MAX_SEQ_LEN)")
    view = sub.add_parser("device-view", help="write this machine's GPU as kernel libraries see it (JSON), for "
                                              "`jit-ahead build --device-view` on a machine without one")
    view.add_argument("-o", "--output", default=None, help="file to write (default: standard output)")
    report = sub.add_parser("report", help="coverage report from a stats log (JIT_AHEAD_STATS): per kernel, "
                                           "unplanned variants and what differs, an HTML timeline")
    report.add_argument("log", help="a stats log (.jsonl)")
    report.add_argument("--html", default=None, help="also write an HTML report with a timeline here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command == "report":
        return _report(args)
    if args.command == "build":
        return _build(args)
    if args.command == "device-view":
        return _device_view_command(args)
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
