#!/usr/bin/env python3
"""Starts of an engine-style server at the limits engines use, with and without jit_ahead, cold and warm.

For each model and limit set, arms in fresh processes, in this order:
  jit-cold     empty Triton cache, no saved plan, an empty record folder: jit_ahead plans the model within the
               limits (planners forked from the server), builds every variant in helpers, records
  jit-warm     the cache, plan folder and records jit-cold left: what a restart costs with jit_ahead
  plain-warm   the same cache, no jit_ahead: the lower bound
  jit-replay   an empty Triton cache, with the plan folder and records of jit-cold (a second node of the
               same deployment: the plan is read, autotune choices come from the records)
  plain-cold   (only with --plain-cold) empty cache, no jit_ahead: what users get without it
  prime        (first, unless --no-prime) an untimed plain-cold process of the first model: the first process
               that runs a model on a freshly started machine serves its first requests at each new shape
               several times slower than any later process (results/2026-12-04-h200-first-process/); this
               one pays that, so that no arm does
  ARM-norecords  (listed in --arms) that arm with JIT_AHEAD_RECORD_DIR unset: no record read or written;
               jit-cold-norecords starts from an empty cache and plan folder of its own
  busy-plain, busy-jit (with --busy N, after the other arms, N pairs, each pair's order the other way round
               from the last's, as are --warm-pairs): serving on the
               warm cache while jit_ahead plans and builds another model in the background (BUSY_MODEL at
               the large limits, no saved plan, none of its variants built: each busy arm gets a fresh copy
               of the warm cache and an empty tuning folder), against the same serving without jit_ahead:
               what background planning and builds cost a serving request. busy-jit serves right after
               warmup (no tune-ahead, which would wait for the other model's builds); per arm, the
               jit_ahead events emitted during its slowest request and each full collection while serving
With --engine-style (issue 35: a cold start ready sooner than without jit_ahead), each arm starts as an
engine does, with weights from disk: the model is built on the GPU without initializing its weights
(transformers' no_init_weights, as an engine skips what it overwrites next), its weights are read from a safetensors
checkpoint written once with random values (its pages dropped from the page cache before every arm, so
that each arm reads the disk), and jit_ahead plans the model at construction, before the weights load, so
that planning and building overlap the load; jit arms then wait as JIT_AHEAD_READY says (default: the
whole plan listed, its WARMUP variants built; the ready line's figures are kept), and the BACKGROUND builds go on while the engine warms up and serves (a request whose variant is not built yet
waits for it, raised to the front of the queue, or builds it in place). Cold arms named jit-cold-N or
plain-cold-N each get empty folders of their own (Triton cache, plans, records).
Without it, each arm does what an engine does: build the model on the GPU, (jit_ahead: start, plan_model,
wait_ready for every planned variant), warm up (decode at the CUDA-graph batch sizes, one full-length prefill),
mark serving, then serve REQUESTS requests drawn at random across the whole limits: batch 1..max, prompt
up to the longest the batch allows (half of them long), 1..4 decode steps; every third request padded
(prompts of random lengths with an attention mask). The shapes come from one seed drawn anew for each
invocation (printed; --seed repeats a run) and are the same in every arm. Counted per phase: Triton
compile() calls that compiled (executor compiles) and autotuner benchmark runs.

    python scripts/gpu/engine_starts.py --out results/<date>-engine-starts [--sets engine,large]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving_loop import versions  # noqa: E402

T0 = time.perf_counter()

SETS = {"engine": dict(max_num_tokens=8192, max_batch_size=16, max_seq_len=4096),
        "large": dict(max_num_tokens=16384, max_batch_size=32, max_seq_len=8192),
        # the two limit sets of issue 35
        "mid": dict(max_num_tokens=16384, max_batch_size=64, max_seq_len=8192),
        "limits": dict(max_num_tokens=32768, max_batch_size=256, max_seq_len=32768)}
# the demo models (4 layers, as a user tried them) and configurations no test uses
MODELS = {"qwen3-liger": dict(hidden=512, heads=8, kv_heads=4, head_dim=64),
          "gated-deltanet": dict(hidden=512, heads=4, head_dim=64, expand_v=2.0),
          "qwen3-liger-2048": dict(hidden=2048, heads=16, kv_heads=4, head_dim=128),
          "gated-deltanet-1024": dict(hidden=1024, heads=8, head_dim=128, expand_v=1.0),
          # no provider knows its layers (transformers' own, calling fla's ops): the model-level planner
          "qwen35-hybrid": dict(hidden=1024),
          # real-sized for a checkpoint on disk (--engine-style): about 0.8 B parameters, 1.6 GB in bf16
          "qwen3-liger-1b": dict(hidden=2048, heads=16, kv_heads=4, head_dim=128, layers=16),
          "gated-deltanet-1b": dict(hidden=2048, heads=8, head_dim=128, expand_v=1.0, layers=16),
          # models no test uses (issue 44): Llama with Liger's kernels, fla's gated linear attention (GLA)
          "llama-liger-1b": dict(hidden=2048, heads=16, kv_heads=4, head_dim=128, layers=16),
          "gla-1b": dict(hidden=2048, heads=4, layers=16)}
REQUESTS = 40
BUSY_MODEL = ("gated-deltanet-1024", "large")


def _no_init():
    """Construction without the random initialization of the weights, as an engine builds a model whose
    weights it loads next (transformers' own switch; none where this transformers lacks it)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        return contextlib.nullcontext()
    return no_init_weights()


def build(name: str, device: str, init: bool = True):
    import torch

    settings = MODELS[name]
    if name.startswith("qwen35"):
        from jit_ahead import demo_models

        return demo_models.qwen35_hybrid(device, hidden=settings["hidden"])
    with torch.device(device), (contextlib.nullcontext() if init else _no_init()):
        if name.startswith("llama-liger"):
            from liger_kernel.transformers import apply_liger_kernel_to_llama
            from transformers import LlamaConfig, LlamaForCausalLM

            apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True)
            config = LlamaConfig(hidden_size=settings["hidden"], intermediate_size=settings["hidden"] * 3,
                                 num_hidden_layers=settings["layers"], num_attention_heads=settings["heads"],
                                 num_key_value_heads=settings["kv_heads"], head_dim=settings["head_dim"],
                                 vocab_size=4096, max_position_embeddings=32768)
            model = LlamaForCausalLM(config)
        elif name.startswith("gla"):
            from fla.models import GLAConfig, GLAForCausalLM

            config = GLAConfig(hidden_size=settings["hidden"], num_hidden_layers=settings["layers"],
                               num_heads=settings["heads"], vocab_size=4096, max_position_embeddings=32768)
            model = GLAForCausalLM(config)
        elif name.startswith("qwen3"):
            from liger_kernel.transformers import apply_liger_kernel_to_qwen3
            from transformers import Qwen3Config, Qwen3ForCausalLM

            apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True)
            config = Qwen3Config(hidden_size=settings["hidden"], intermediate_size=settings["hidden"] * 3,
                                 num_hidden_layers=settings.get("layers", 4), num_attention_heads=settings["heads"],
                                 num_key_value_heads=settings["kv_heads"], head_dim=settings["head_dim"],
                                 vocab_size=4096, max_position_embeddings=32768)
            model = Qwen3ForCausalLM(config)
        else:
            from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

            config = GatedDeltaNetConfig(hidden_size=settings["hidden"], num_hidden_layers=settings.get("layers", 4),
                                         num_heads=settings["heads"], head_dim=settings["head_dim"],
                                         expand_v=settings["expand_v"], vocab_size=4096)
            model = GatedDeltaNetForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def checkpoint_path(folder: str, name: str) -> str:
    return os.path.join(folder, f"{name}.safetensors")


def write_checkpoint(folder: str, name: str) -> str:
    """The model's weights with random values (as a trained checkpoint's sizes and dtypes), once per
    folder: what an engine-style arm reads from disk."""
    import torch
    from safetensors.torch import save_file

    path = checkpoint_path(folder, name)
    if os.path.exists(path):
        return path
    model = build(name, "meta")
    generator = torch.Generator().manual_seed(0)
    state = {key: (torch.randn(value.shape, generator=generator) * 0.02).to(value.dtype)
             for key, value in model.state_dict().items()}
    save_file(state, path + ".part")
    os.replace(path + ".part", path)
    return path


def drop_from_page_cache(path: str) -> bool:
    """Ask the kernel to drop the file's pages, so that the next read comes from the disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except (OSError, AttributeError):
        return False


def load_weights(model, path: str) -> dict:
    """The checkpoint's tensors read onto the GPU and copied into the model, as an engine loads weights."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    state = load_file(path, device="cuda")
    missing, unexpected = model.load_state_dict(state, strict=False)
    return {"weights_gb": round(sum(t.numel() * t.element_size() for t in state.values()) / 1e9, 2),
            "weights_load_s": round(time.perf_counter() - t0, 2), "weights_missing": len(missing),
            "weights_unexpected": len(unexpected)}


def request_mix(limits: dict, seed: int) -> list[tuple[int, int, int, bool]]:
    rng = random.Random(seed)
    out = []
    for i in range(REQUESTS):
        batch = rng.randint(1, limits["max_batch_size"])
        longest = min(limits["max_seq_len"], limits["max_num_tokens"] // batch)
        prompt = rng.randint(max(1, longest // 2), longest) if i % 2 else rng.randint(1, longest)
        out.append((batch, prompt, rng.randint(1, 4), i % 3 == 2))
    return out


class HostBuildCounter:
    """Counts gcc builds of host modules in this process (Triton 3.6's per-signature launcher), by phase:
    work on the launching thread that no compilation listener sees."""

    def __init__(self) -> None:
        from triton.runtime import build

        self.phase = "warmup"
        self.builds = {"warmup": 0, "serving": 0}
        original = build._build

        def counted(*args, **kwargs):
            self.builds[self.phase] += 1
            return original(*args, **kwargs)

        build._build = counted


class AutotuneCounter:
    """Counts autotuner benchmark runs (Autotuner._bench, one per config benchmarked) by phase."""

    def __init__(self) -> None:
        from triton.runtime.autotuner import Autotuner

        self.phase = "warmup"
        self.runs = {"warmup": 0, "serving": 0}
        original = Autotuner._bench

        def counted(tuner, *args, **kwargs):
            self.runs[self.phase] += 1
            return original(tuner, *args, **kwargs)

        Autotuner._bench = counted


class ServingWatch:
    """Where the CPU went while serving: each thread of this process (by name), the child processes
    (helpers, planners, the fork server) and full garbage collections: a slow serving phase with nothing
    compiling is told apart as work beside the requests (threads, children), collector pauses, or neither.
    It sees the threads and children alive at the end of serving (one that exits earlier takes its CPU with
    it) and lists those with 0.02 s or more."""

    def __init__(self) -> None:
        import gc

        self.gc_pauses: list[float] = []
        self.gc_where: list[tuple[float, str, float]] = []
        self._gc_start = self._started = 0.0
        self._on = False
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if not self._on or info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:  # when (from the start of serving), in which thread, how long
            self.gc_pauses.append(time.perf_counter() - self._gc_start)
            self.gc_where.append((round(self._gc_start - self._started, 3), threading.current_thread().name,
                                  round(self.gc_pauses[-1], 3)))

    @staticmethod
    def _threads() -> dict[str, float]:
        import psutil

        names = {t.native_id: t.name for t in threading.enumerate()}
        return {f"{names.get(t.id, 'native')}:{t.id}": t.user_time + t.system_time for t in psutil.Process().threads()}

    @staticmethod
    def _children() -> dict[int, tuple[str, float]]:
        import psutil

        out = {}
        for child in psutil.Process().children(recursive=True):
            try:
                times = child.cpu_times()
                out[child.pid] = (" ".join(child.cmdline()[:3])[-80:], times.user + times.system)
            except psutil.Error:
                continue
        return out

    def start(self) -> None:
        self._threads0, self._children0, self._main0 = self._threads(), self._children(), time.thread_time()
        self._started = time.perf_counter()
        self._on = True

    def stop(self) -> dict:
        self._on = False
        threads, children = self._threads(), self._children()
        busy = {name: round(cpu - self._threads0.get(name, 0.0), 3) for name, cpu in threads.items()}
        child_cpu = {f"{cmd}:{pid}": round(cpu - self._children0.get(pid, ("", 0.0))[1], 3)
                     for pid, (cmd, cpu) in children.items()}
        return {"main_thread_cpu_s": round(time.thread_time() - self._main0, 3),
                "threads_cpu_s": {k: v for k, v in sorted(busy.items(), key=lambda kv: -kv[1]) if v >= 0.02},
                "children_at_start": len(self._children0), "children_at_end": len(children),
                "children_cpu_s": {k: v for k, v in sorted(child_cpu.items(), key=lambda kv: -kv[1]) if v >= 0.02},
                "gc_gen2_pauses": len(self.gc_pauses), "gc_gen2_s": round(sum(self.gc_pauses), 3),
                "gc_gen2_at": self.gc_where}


def _main_thread_usage(since: dict | None = None) -> dict:
    """The main thread's wall, CPU (user, system), page faults and context switches, from ``since``: a phase
    slower with jit_ahead is told apart as the main thread waiting (for the GIL: waits, CPU unchanged), or
    working more (copy-on-write faults after a fork: system time and minor faults)."""
    import resource

    u = resource.getrusage(resource.RUSAGE_THREAD)
    now = {"wall_s": time.perf_counter(), "user_s": u.ru_utime, "system_s": u.ru_stime, "minor_faults": u.ru_minflt,
           "major_faults": u.ru_majflt, "waits": u.ru_nvcsw, "preempted": u.ru_nivcsw,
           "threads": threading.active_count()}
    if since is None:
        return now
    out = {k: round(v - since[k], 3) for k, v in now.items() if k != "threads"}
    out["threads_at_end"] = now["threads"]
    out["thread_names"] = sorted(t.name for t in threading.enumerate())
    try:
        import psutil

        out["children"] = len(psutil.Process().children(recursive=True))
    except ImportError:
        pass
    return out


def _launch_path() -> dict:
    """Who defines what each launch goes through when serving starts (Triton's own module, or a wrapper
    left in place), the launch hooks and the module count: a serving phase slower with jit_ahead and nothing
    of it running is told apart as a longer launch path or not."""
    from triton import knobs
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    def where(f) -> str:
        f = getattr(f, "fget", f)
        return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', type(f).__name__)}"

    path = {f"JITFunction.{n}": where(getattr(JITFunction, n)) for n in ("run", "__getitem__")}
    path.update({f"Autotuner.{n}": where(Autotuner.__dict__.get(n, getattr(Autotuner, n, None)))
                 for n in ("run", "_bench", "check_disk_cache", "prune_configs", "cache_results")})
    for n in ("launch_enter_hook", "launch_exit_hook"):  # a chain of hooks (Triton 3.6+) or one, or none
        hook = getattr(knobs.runtime, n, None)
        path[n] = [where(c) for c in hook.calls] if hasattr(hook, "calls") else (hook and where(hook))
    path["modules"] = len(sys.modules)
    return path


def _profile_top(profiler, count: int = 30) -> list[str]:
    """The calls with the most cumulative time, then those with the most own time, while ``profiler`` ran
    (the arm's start to the built model, or its serving); on Python 3.12 cProfile sees every thread, the
    records replay thread's among them. One line per call, its name on one line whatever it holds."""
    import pstats

    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)

    def line(where, row) -> str:
        file, number, name = where
        label = f"{file}:{number}({name})" if file != "~" else name
        return f"{row[1]:>9} {row[2]:9.3f} {row[3]:9.3f} " + " ".join(label.split())[:240]

    by = lambda column: sorted(stats.items(), key=lambda item: -item[1][column])[:count]  # noqa: E731
    return (["calls, own s, cumulative s: by cumulative"] + [line(w, r) for w, r in by(3)]
            + ["by own time"] + [line(w, r) for w, r in by(2)])


def run_arm(model_name: str, set_name: str, arm: str, seed: int) -> dict:
    import torch

    from jit_ahead import demo_models
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.core.priority import Priority

    limits = EngineLimits(**SETS[set_name], cuda_graph_batch_sizes=(1, 2, 4, 8, 16))
    counter = demo_models.CompileCounter().install()
    tuning = AutotuneCounter()
    host = HostBuildCounter()
    events: list[dict] = []
    session = None
    profiler = None
    profile_to = os.environ.get("ENGINE_STARTS_PROFILE")  # "1": up to the built model; "serving": up to serving
    if profile_to in ("1", "serving"):  # where the start's time goes
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    if arm.startswith("jit") or arm == "busy-jit":
        import jit_ahead

        session = jit_ahead.start()
        session.stats.subscribe(events.append)
    t_started = time.perf_counter() - T0
    torch.manual_seed(0)
    torch.empty(1, device="cuda")  # the CUDA context, timed apart from the model's own imports and build
    t_cuda = time.perf_counter() - T0
    checkpoint = os.environ.get("ENGINE_STARTS_CHECKPOINT")  # --engine-style: weights from disk
    build_usage0 = _main_thread_usage()
    model = build(model_name, "cuda", init=not checkpoint)  # weights from disk: not initialized first
    build_usage = _main_thread_usage(build_usage0)
    run = None
    loaded = {}
    if checkpoint:
        if session is not None and arm != "busy-jit":  # at construction: planning and builds overlap the load
            run = session.plan_model(model, limits)
        loaded = load_weights(model, checkpoint)
    t_model = time.perf_counter() - T0
    cpu_model_built, modules_model_built = time.process_time(), len(sys.modules)
    profile_top = _profile_top(profiler) if profiler is not None and profile_to == "1" else None
    if arm == "busy-jit":  # background work for the whole serving time: another model, planned and built
        busy_model, busy_set = BUSY_MODEL
        run = session.plan_model(build(busy_model, "meta"), EngineLimits(**SETS[busy_set]))
        ready = None
    elif session is not None and checkpoint:  # the ready rule of JIT_AHEAD_READY (default: the whole plan
        ready = session.wait_ready(timeout=1200)  # listed, its WARMUP variants built)
    elif session is not None:
        run = session.plan_model(model, limits)
        ready = session.wait_ready(timeout=1200, priority=Priority.BACKGROUND)
    t_ready = time.perf_counter() - T0
    demo_models.warmup(model, limits, "cuda")
    torch.cuda.synchronize()
    t_warm = time.perf_counter() - T0
    if session is not None:  # with JIT_AHEAD_TUNE_AHEAD on (default) the tune-ahead runs here, in warmup;
        # busy-jit serves at once: the other model's tuning would otherwise wait here for its builds
        session.mark_serving(tune_ahead=arm != "busy-jit")
        torch.cuda.synchronize()
    t_tuned = time.perf_counter() - T0
    cpu_before_serving = time.process_time()  # every thread's, this process's: the start's CPU
    own = None
    if session is not None:  # of it, jit_ahead's own (its threads and the session's calls): core/observing/own_cpu.py
        from jit_ahead.core.observing import own_cpu

        own = {"own_s": own_cpu.total(), "by_where": own_cpu.seconds()}
    if profiler is not None and profile_to == "serving":
        profile_top = _profile_top(profiler, count=45)
    launch_path = _launch_path()
    counter.phase = tuning.phase = host.phase = "serving"
    watch = ServingWatch()
    serving_profiler = None
    if os.environ.get("ENGINE_STARTS_PROFILE_SERVING") == "1":  # where the serving time goes, per call
        import cProfile

        serving_profiler = cProfile.Profile()
        serving_profiler.enable()
    memory0 = torch.cuda.memory_stats()
    watch.start()
    latencies, gpu_seconds, shapes = [], [], request_mix(SETS[set_name], seed)
    began = []  # each request's wall-clock start: which of jit_ahead's events fell inside a slow one
    for i, (batch, prompt, new_tokens, padded) in enumerate(shapes):
        lengths = demo_models.prompt_lengths(batch, prompt, seed=seed + i) if padded else None
        begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        began.append(time.time())
        begin.record()
        demo_models.serve(model, batch, prompt, new_tokens, device="cuda", seed=i, lengths=lengths)
        finish.record()
        torch.cuda.synchronize()
        latencies.append(time.perf_counter() - t0)
        gpu_seconds.append(begin.elapsed_time(finish) / 1000)  # the stream's span: kernels and the gaps between
    memory1 = torch.cuda.memory_stats()
    # cudaMalloc/cudaFree calls and allocator retries while serving: a caching allocator that has to go
    # back to the driver makes requests slow on the CPU side
    allocator = {k: memory1.get(k, 0) - memory0.get(k, 0)
                 for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")}
    allocator["reserved_at_start_gib"] = round(memory0.get("reserved_bytes.all.current", 0) / 2**30, 2)
    t_end = time.perf_counter() - T0
    serving_watch = watch.stop()
    serving_profile = _profile_top(serving_profiler) if serving_profiler is not None else None
    worst = max(range(len(latencies)), key=latencies.__getitem__)
    result = {"model": model_name, "set": set_name, "arm": arm, "seed": seed, "started_s": round(t_started, 2),
              "cuda_ready_s": round(t_cuda, 2), "model_built_s": round(t_model, 2),
              "ready_s": round(t_ready, 2), "warmup_end_s": round(t_warm, 2), "tune_ahead_s": round(t_tuned - t_warm, 2),
              "end_s": round(t_end, 2),
              "serving_s": round(sum(latencies), 3), "worst_request_s": round(latencies[worst], 3),
              "worst_request": list(shapes[worst]), "median_request_s": round(sorted(latencies)[len(latencies) // 2], 4),
              "executor_compiles_warmup": len(counter.compiled["warmup"]),
              "executor_compiles_serving": len(counter.compiled["serving"]),
              "serving_compiled": sorted(set(counter.compiled["serving"])),
              "autotune_runs_warmup": tuning.runs["warmup"], "autotune_runs_serving": tuning.runs["serving"],
              "host_builds_warmup": host.builds["warmup"], "host_builds_serving": host.builds["serving"]}
    result.update(loaded)
    result["choices"] = autotune_choices()
    result["process_cpu_before_serving_s"] = round(cpu_before_serving, 3)
    result["own_cpu"] = own
    result["process_cpu_model_built_s"] = round(cpu_model_built, 3)
    result["modules_model_built"] = modules_model_built
    result["launch_path"] = launch_path
    result["model_build_main_thread"] = build_usage
    result["serving_watch"] = serving_watch
    result["request_s"] = [round(t, 4) for t in latencies]
    result["request_gpu_s"] = [round(t, 4) for t in gpu_seconds]
    result["serving_gpu_s"] = round(sum(gpu_seconds), 3)
    result["serving_allocator"] = allocator
    if profile_top is not None:
        result["start_profile"] = profile_top
    if serving_profile is not None:
        result["serving_profile"] = serving_profile
    if session is not None and arm != "busy-jit":  # what was still building when the mix was served
        result["builds_pending_at_end"] = session.families["triton"].table.pending()
    if arm == "busy-jit":  # was the background work still going when serving ended?
        result.update(busy_planning_done=run.done, busy_builds_pending=session.families["triton"].table.pending(),
                      busy_planned=sum(run.variants.values()))
    if session is not None:  # what the launches waited for, and what was built for them after ready
        waits = [e for e in events if e["event"] == "wait"]
        result.update(waits_serving=sum(e["phase"] == "serving" for e in waits),
                      longest_wait_s=round(max((e["seconds"] for e in waits), default=0.0), 3),
                      longest_wait=max(waits, key=lambda e: e["seconds"], default={}).get("cause"),
                      guards_serving=sum(e["event"] == "guard" for e in events),
                      worst_request_events=_events_within(events, began[worst], began[worst] + latencies[worst]),
                      builds_for_launches_serving=sum(e["event"] == "build_finish" and e["phase"] == "serving"
                                                      and e.get("helper") in ("helper-urgent", "executor")
                                                      for e in events))
    if session is not None:  # when the records were read and queued, on the clock of the other times
        replayed = next((e["time"] for e in events if e["event"] == "replay"), None)
        result["replay_done_s"] = None if replayed is None else round(replayed - time.time() + time.perf_counter() - T0, 2)
    if run is not None:
        first_queued = min((e["time"] for e in events if e["event"] == "queued"), default=None)
        helper_builds = sorted(e["time"] for e in events if e["event"] == "build_finish" and e.get("helper") != "executor")
        started = next((e["time"] for e in events if e["event"] == "forkserver_ready"), None)
        tuned = next((e for e in events if e["event"] == "tune_ahead"), None)
        result["tune_ahead"] = None if tuned is None else {
            k: v for k, v in tuned.items() if k in ("tuned_ahead", "chosen_already", "left", "seconds", "left_why")}
        said = next((e for e in events if e["event"] == "ready"), None)
        result["ready_line"] = None if said is None else {k: v for k, v in said.items()
                                                          if k not in ("event", "time", "phase", "thread")}
        result.update(ready=ready, planned_variants=sum(run.variants.values()), planning_s=round(run.seconds, 2),
                      launches=run.launches, saved_plan=bool(run.saved_plan),
                      plan_loaded=any(e["event"] == "plan_loaded" for e in events),
                      queued=len(run.tickets), built_in_helpers=len(helper_builds),
                      helper_processes=started is not None, planning_errors=run.errors[:5],
                      first_build_after_first_queued_s=None if not helper_builds or first_queued is None
                      else round(helper_builds[0] - first_queued, 3),
                      helpers=session.families["triton"].pool.workers)
        session.close()
    return result


def _events_within(events: list[dict], start: float, end: float) -> dict[str, int]:
    """How many of each kind of jit_ahead event were emitted between ``start`` and ``end`` (wall clock)."""
    counts: dict[str, int] = {}
    for event in events:
        if start <= event["time"] <= end:
            counts[event["event"]] = counts.get(event["event"], 0) + 1
    return counts


def run_child(argv: list[str], env: dict, timeout: float, tag: str, what: dict) -> dict:
    """A script run in a fresh process; the JSON it printed after ``tag``, else ``what`` with the error."""
    try:
        proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**what, "error": "timed out"}
    line = next((l for l in proc.stdout.splitlines() if l.startswith(tag)), None)
    return json.loads(line[len(tag):]) if line else {**what, "error": proc.stderr[-3000:]}


def write_report(out: str, name: str, report: dict, lines: list[str]) -> None:
    """``name``.json and ``name``.md in ``out``, and the markdown printed."""
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def autotuners() -> dict:
    """Every autotuner of the kernel libraries' imported modules: "module.kernel" -> Autotuner."""
    from triton.runtime.autotuner import Autotuner

    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("fla.", "liger_kernel.")):
            continue
        for value in list(vars(module).values()):
            for _ in range(4):
                if isinstance(value, Autotuner):
                    found[f"{name}.{value.base_fn.__name__}"] = value
                    break
                value = getattr(value, "fn", None)
    return found


def autotune_choices() -> dict:
    """Every choice the kernel libraries' autotuners hold at the end of an arm: "module.kernel key" -> config,
    to compare the choices made ahead with those made on the requests' own data."""
    return {f"{name} {list(key)}": str(config) for name, tuner in autotuners().items()
            for key, config in list(tuner.cache.items())}


def choice_agreement(report: dict) -> list[str]:
    """Per model and set: the keys both jit-cold and plain-cold chose for, and how many agree."""
    lines = []
    for r in report["results"]:
        if r.get("arm") != "jit-cold" or "choices" not in r:
            continue
        plain = next((p for p in report["results"] if p.get("arm") == "plain-cold" and p["model"] == r["model"]
                      and p["set"] == r["set"] and "choices" in p), None)
        if plain is None:
            continue
        both = sorted(set(r["choices"]) & set(plain["choices"]))
        differ = [k for k in both if r["choices"][k] != plain["choices"][k]]
        lines.append(f"{r['model']} {r['set']}: {len(both)} tuning keys chosen in both jit-cold (ahead) and plain-cold "
                     f"(on the requests' data); {len(both) - len(differ)} agree, {len(differ)} differ"
                     + (": " + "; ".join(f"{k}: {r['choices'][k]} / {plain['choices'][k]}" for k in differ[:8]) if differ else ""))
    return lines


def _tuned(r: dict) -> str:
    tuned = r.get("tune_ahead")
    if not tuned:
        return ""
    return f"{r.get('tune_ahead_s', '')} ({tuned.get('tuned_ahead', 0)} / {tuned.get('left', 0)})"


def _ready_figures(r: dict) -> str:
    """The ready line's figures of one arm: planning done or not, variants listed / built / pending."""
    said = r.get("ready_line")
    if not said:
        return "-"
    return (f"{'plan done' if said['planning_done'] else 'planning running'} {said['listed']} listed "
            f"{said['built']} built {said['pending']} pending")


def report_lines(report: dict) -> list[str]:
    """The markdown of a run: one row per arm, then per model and limit set the warm ratio, the busy
    ratio and each phase's median per arm (what part of a start jit_ahead adds to)."""
    seed, results = report["seed"], report["results"]
    models = list(dict.fromkeys(r["model"] for r in results))
    sets = list(dict.fromkeys(r["set"] for r in results))

    def runs_of(model: str, set_name: str, arm: str) -> list[dict]:
        return [r for r in results if (r.get("model"), r.get("set"), r.get("arm")) == (model, set_name, arm)
                and "error" not in r]

    lines = [f"# Engine-style starts with and without jit_ahead ({report['date']})", "",
             f"`{report['command']}`; request seed {seed}; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
             "", "| model | limits | arm | process s | ready s | planning s | variants | queued | executor compiles "
             "warmup / serving | autotune runs warmup / serving | tune-ahead s (keys tuned / left) | serving s | worst request s (batch, prompt, "
             "decode, padded) | host builds warmup / serving | process / median plain-warm |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['set']} | {r['arm']} | error: {r['error'][-150:]!r} |" + " |" * 11)
            continue
        bases = [b["process_s"] for b in runs_of(r["model"], r["set"], "plain-warm")]
        ratio = f"{r['process_s'] / statistics.median(bases):.3f}" if bases else ""
        lines.append(f"| {r['model']} | {r['set']} | {r['arm']} | {r['process_s']} | {r['ready_s']} | "
                     f"{r.get('planning_s', '')} | {r.get('planned_variants', '')} | {r.get('queued', '')} | "
                     f"{r['executor_compiles_warmup']} / {r['executor_compiles_serving']} | "
                     f"{r['autotune_runs_warmup']} / {r['autotune_runs_serving']} | {_tuned(r)} | {r['serving_s']} | "
                     f"{r['worst_request_s']} {tuple(r['worst_request'])} | "
                     f"{r['host_builds_warmup']} / {r['host_builds_serving']} | {ratio} |")
    median = statistics.median
    for model in models:
        for set_name in sets:
            warm = {arm: [r["process_s"] for r in runs_of(model, set_name, arm)] for arm in ("jit-warm", "plain-warm")}
            if len(warm["jit-warm"]) > 1 and len(warm["plain-warm"]) > 1:
                lines.append(f"\n{model} {set_name}: warm start with jit_ahead / without, median process time of "
                             f"{len(warm['jit-warm'])} and {len(warm['plain-warm'])} interleaved runs: "
                             f"{median(warm['jit-warm']) / median(warm['plain-warm']):.3f}")
            cold = {kind: [r for r in results if (r.get("model"), r.get("set")) == (model, set_name) and "error" not in r
                           and (r.get("arm") == f"{kind}-cold" or r.get("arm", "").startswith(f"{kind}-cold-"))]
                    for kind in ("jit", "plain")}
            if cold["jit"] and cold["plain"]:
                process = {k: median(r["process_s"] for r in v) for k, v in cold.items()}
                # ready to serve: the warmup and (jit_ahead) the tune-ahead done, as an engine says "ready"
                ready = {k: median(r["warmup_end_s"] + r["tune_ahead_s"] for r in v) for k, v in cold.items()}
                lines.append(f"\n{model} {set_name}: cold start with jit_ahead / without, medians of {len(cold['jit'])} "
                             f"and {len(cold['plain'])} runs: process time {process['jit']:.1f} / {process['plain']:.1f} s "
                             f"= {process['jit'] / process['plain']:.3f}; ready to serve {ready['jit']:.1f} / {ready['plain']:.1f} s; "
                             f"executor compiles after ready {[r['executor_compiles_serving'] for r in cold['jit']]} / "
                             f"{[r['executor_compiles_serving'] for r in cold['plain']]}; autotune runs after ready "
                             f"{[r['autotune_runs_serving'] for r in cold['jit']]} / "
                             f"{[r['autotune_runs_serving'] for r in cold['plain']]}; with jit_ahead, builds for a "
                             f"waiting launch after ready {[r.get('builds_for_launches_serving') for r in cold['jit']]}, "
                             f"guard reports {[r.get('guards_serving') for r in cold['jit']]}, longest wait "
                             f"{[r.get('longest_wait_s') for r in cold['jit']]} s, ready line "
                             f"{[_ready_figures(r) for r in cold['jit']]}")
            owned = [r for r in runs_of(model, set_name, "jit-warm") if r.get("own_cpu")]
            plain_cpu = [r["process_cpu_before_serving_s"] for r in runs_of(model, set_name, "plain-warm")
                         if "process_cpu_before_serving_s" in r]
            if owned and plain_cpu:  # the share of a warm start's CPU that is jit_ahead's, which noise does not blur
                lines.append(f"\n{model} {set_name}: warm starts' CPU before serving, median: jit_ahead's own "
                             f"{median(r['own_cpu']['own_s'] for r in owned):.2f} s of "
                             f"{median(r['process_cpu_before_serving_s'] for r in owned):.1f} s with it; "
                             f"{median(plain_cpu):.1f} s without it. By where, the first jit-warm run: "
                             + ", ".join(f"{w} {v:.2f}" for w, v in owned[0]["own_cpu"]["by_where"].items()))
            built = {arm: [r for r in runs_of(model, set_name, arm) if "process_cpu_model_built_s" in r]
                     for arm in ("jit-warm", "plain-warm")}
            if built["jit-warm"] and built["plain-warm"]:  # the model build's own share: CPU and imports
                lines.append(f"\n{model} {set_name}: warm starts at the built model, median jit / plain: process CPU "
                             + " / ".join(f"{median(r['process_cpu_model_built_s'] for r in v):.2f}" for v in built.values())
                             + " s, modules imported "
                             + " / ".join(f"{median(r['modules_model_built'] for r in v):.0f}" for v in built.values())
                             + "; launch path differences at serving: "
                             + (", ".join(f"{k}: {v} / {built['plain-warm'][0]['launch_path'].get(k)}"
                                          for k, v in built["jit-warm"][0]["launch_path"].items()
                                          if k != "modules" and v != built["plain-warm"][0]["launch_path"].get(k))
                                or "none"))
            usage = {arm: [r["model_build_main_thread"] for r in runs_of(model, set_name, arm)
                           if r.get("model_build_main_thread")] for arm in ("jit-warm", "plain-warm")}
            if usage["jit-warm"] and usage["plain-warm"]:
                lines.append(f"\n{model} {set_name}: the model build's main thread, median jit / plain: "
                             + ", ".join(f"{k} " + " / ".join(f"{median(u[k] for u in v):g}" for v in usage.values())
                                         for k in ("wall_s", "user_s", "system_s", "minor_faults", "waits", "preempted"))
                             + f"; threads then {usage['jit-warm'][0]['thread_names']}, children "
                             f"{usage['jit-warm'][0].get('children')} / {usage['plain-warm'][0].get('children')}")
            ordered = [r for r in results if (r.get("model"), r.get("set")) == (model, set_name) and "error" not in r
                       and r.get("arm") in ("jit-warm", "plain-warm")]
            ratios = [a["process_s"] / b["process_s"] if a["arm"] == "jit-warm" else b["process_s"] / a["process_s"]
                      for a, b in zip(ordered[::2], ordered[1::2]) if {a["arm"], b["arm"]} == {"jit-warm", "plain-warm"}]
            if len(ratios) > 1:  # each pair's ratio: what the host's spread can decide
                lines.append(f"\n{model} {set_name}: warm pair ratios jit / plain, in order: "
                             + ", ".join(f"{x:.3f}" for x in ratios)
                             + f"; median {median(ratios):.3f}, mean {statistics.fmean(ratios):.3f}, "
                             f"standard deviation {statistics.stdev(ratios):.3f}")
            pairs = {arm: [r["serving_s"] for r in runs_of(model, set_name, arm)] for arm in ("busy-plain", "busy-jit")}
            if pairs["busy-plain"] and pairs["busy-jit"]:
                lines.append(f"\n{model} {set_name}: serving time with background planning and builds / without, "
                             f"median of {len(pairs['busy-jit'])} interleaved pairs: "
                             f"{median(pairs['busy-jit']) / median(pairs['busy-plain']):.3f}")
    for model in models:
        for set_name in sets:
            if not any("cuda_ready_s" in r for r in results if (r.get("model"), r.get("set")) == (model, set_name)):
                continue  # a run made before the phases were timed
            lines += [f"\n{model} {set_name}, phase medians (s): started (torch + jit_ahead.start), model build "
                      "(after the CUDA context), ready after the model, warmup, serving, exit after serving",
                      "", "| arm | runs | process | started | model build | ready after model | warmup | serving | exit |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for arm in dict.fromkeys(r["arm"] for r in results):
                runs = [r for r in runs_of(model, set_name, arm) if "cuda_ready_s" in r]
                if not runs:
                    continue
                mid = lambda f: f"{median(f(r) for r in runs):.2f}"  # noqa: E731
                lines.append(f"| {arm} | {len(runs)} | {mid(lambda r: r['process_s'])} | {mid(lambda r: r['started_s'])} | "
                             f"{mid(lambda r: r['model_built_s'] - r['cuda_ready_s'])} | "
                             f"{mid(lambda r: r['ready_s'] - r['model_built_s'])} | "
                             f"{mid(lambda r: r['warmup_end_s'] - r['ready_s'])} | {mid(lambda r: r['serving_s'])} | "
                             f"{mid(lambda r: r['process_s'] - r['end_s'])} |")
    watched = [r for r in results if "serving_watch" in r]
    if watched:
        lines += ["", "Where the CPU went while serving (ServingWatch): the serving thread's own CPU, the other threads "
                  "and the child processes with the most, full garbage collections", ""]
        for r in watched:
            w = r["serving_watch"]
            others = {k: v for k, v in w["threads_cpu_s"].items() if not k.startswith("MainThread:")}
            lines.append(f"- {r['model']} {r['set']} {r['arm']}: serving {r['serving_s']} s, main thread CPU "
                         f"{w['main_thread_cpu_s']} s; other threads {dict(list(others.items())[:4])}; children "
                         f"{w['children_at_start']} -> {w['children_at_end']}, CPU {round(sum(w['children_cpu_s'].values()), 2)} s "
                         f"{dict(list(w['children_cpu_s'].items())[:3])}; gen-2 GC {w['gc_gen2_pauses']} x, {w['gc_gen2_s']} s"
                         + (f"; GPU stream span {r['serving_gpu_s']} s, allocator {r['serving_allocator']}"
                            if "serving_gpu_s" in r else ""))
    agreement = choice_agreement(report)
    if agreement:
        lines += ["", "Autotune choices, made ahead against made on the requests' data:", ""] + [f"- {l}" for l in agreement]
    return lines


@contextlib.contextmanager
def _scratch(state: str | None, name: str):
    """The arms' folders: a temporary one, or FOLDER/NAME kept for a later call (--state)."""
    if state is None:
        with tempfile.TemporaryDirectory() as scratch:
            yield scratch
        return
    folder = os.path.join(state, name)
    os.makedirs(folder, exist_ok=True)
    yield folder


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--models", default="gated-deltanet,qwen3-liger")
    parser.add_argument("--sets", default="engine")
    parser.add_argument("--arms", default="jit-cold,jit-warm,plain-warm,jit-replay")
    parser.add_argument("--plain-cold", action="store_true")
    parser.add_argument("--busy", type=int, default=0, help="busy-plain/busy-jit pairs per model (see above)")
    parser.add_argument("--warm-pairs", type=int, default=0,
                        help="jit-warm/plain-warm pairs per model after the other arms, interleaved")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run's request mix")
    parser.add_argument("--arm-timeout", type=float, default=580)
    parser.add_argument("--no-prime", dest="prime", action="store_false",
                        help="skip the untimed first process (see 'prime' above)")
    parser.add_argument("--engine-style", metavar="FOLDER", default=None,
                        help="weights from a checkpoint in FOLDER (written there once), planned at construction, "
                             "jit arms ready at WARMUP (see above)")
    parser.add_argument("--profile-start", action="store_true",
                        help="profile each arm's main thread up to the built model (start_profile in the json)")
    parser.add_argument("--profile-to-serving", action="store_true",
                        help="cProfile each arm from its start to its first request (ready, warmup and tune-ahead "
                             "included), kept as start_profile")
    parser.add_argument("--profile-serving", action="store_true",
                        help="profile each arm's serving of the request mix (serving_profile in the json)")
    parser.add_argument("--state", metavar="FOLDER", default=None,
                        help="keep the arms' caches, plans and records in FOLDER (kept after the run): a later call "
                             "with --state FOLDER --arms '' --warm-pairs N adds warm pairs on the same cache")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--report", metavar="JSON", help="print the markdown of a saved engine_starts.json")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            print("\n".join(report_lines(json.load(f))))
        return 0
    if args.one:
        model, set_name, arm, seed = args.one
        print("ARM " + json.dumps(run_arm(model, set_name, arm, int(seed))), flush=True)
        return 0
    if not args.out:
        parser.error("--out is required")
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    print(f"request seed {seed}", flush=True)
    # pairs alternate which arm goes first (A B B A ...), so that neither always follows the other
    def pairs(first: str, second: str, count: int) -> list[str]:
        return [arm for i in range(count) for arm in ((first, second) if i % 2 == 0 else (second, first))]

    arms = ([a for a in args.arms.split(",") if a] + (["plain-cold"] if args.plain_cold else []) + pairs("jit-warm", "plain-warm", args.warm_pairs)
            + pairs("busy-plain", "busy-jit", args.busy))
    results = []
    os.makedirs(args.out, exist_ok=True)
    checkpoints = {}
    if args.engine_style:
        os.makedirs(args.engine_style, exist_ok=True)
        for model in args.models.split(","):
            t0 = time.perf_counter()
            checkpoints[model] = write_checkpoint(args.engine_style, model)
            print(f"checkpoint {checkpoints[model]}: {os.path.getsize(checkpoints[model]) / 1e9:.2f} GB "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.prime:  # the first process on a machine pays one-off costs no later one does: none of the arms
        model, set_name = args.models.split(",")[0], args.sets.split(",")[0]
        with tempfile.TemporaryDirectory() as scratch:
            env = dict(os.environ, TRITON_CACHE_DIR=scratch, JIT_AHEAD_PLAN_DIR=scratch)
            t0 = time.perf_counter()
            prime = run_child([__file__, "--one", model, set_name, "plain-cold", str(seed)], env, args.arm_timeout,
                              "ARM ", {"model": model, "set": set_name})
            prime.update(arm="prime", process_s=round(time.perf_counter() - t0, 2))
            results.append(prime)
            print(json.dumps(prime), flush=True)
    for set_name in args.sets.split(","):
        for model in args.models.split(","):
            with _scratch(args.state, f"{model}-{set_name}") as scratch:
                folders = {name: os.path.join(scratch, name) for name in ("cache", "plans", "records", "empty", "cold")}
                for folder in folders.values():
                    os.makedirs(folder, mode=0o700, exist_ok=True)
                folders["snapshot"] = os.path.join(scratch, "snapshot")  # made before the first busy arm
                for arm in arms:
                    cache = {"jit-replay": folders["empty"], "plain-cold": folders["cold"]}.get(arm, folders["cache"])
                    env = dict(os.environ, TRITON_CACHE_DIR=cache, JIT_AHEAD_PLAN_DIR=folders["plans"],
                               JIT_AHEAD_RECORD_DIR=folders["records"],
                               JIT_AHEAD_TUNING_DIR=os.path.join(scratch, "tuning"))  # never the machine's own
                    if args.profile_start or args.profile_to_serving:
                        env["ENGINE_STARTS_PROFILE"] = "serving" if args.profile_to_serving else "1"
                    if args.profile_serving:
                        env["ENGINE_STARTS_PROFILE_SERVING"] = "1"
                    if arm.endswith("-norecords"):  # the same arm with recording and replay off
                        env.pop("JIT_AHEAD_RECORD_DIR")
                    if arm.startswith(("jit-cold-", "plain-cold-")):  # another cold arm: cold folders of its own
                        env.update(TRITON_CACHE_DIR=tempfile.mkdtemp(dir=scratch), JIT_AHEAD_PLAN_DIR=tempfile.mkdtemp(dir=scratch),
                                   JIT_AHEAD_RECORD_DIR=tempfile.mkdtemp(dir=scratch),
                                   JIT_AHEAD_TUNING_DIR=tempfile.mkdtemp(dir=scratch))
                    if model in checkpoints:
                        env["ENGINE_STARTS_CHECKPOINT"] = checkpoints[model]
                        drop_from_page_cache(checkpoints[model])
                    if arm.startswith("busy"):  # the other model's plan and builds start from nothing each time:
                        # a copy of the warm cache as the arms before left it (the other model's builds land
                        # in the process's one Triton cache, and its tuning choices in the tuning folder)
                        if not os.path.isdir(folders["snapshot"]):
                            shutil.copytree(folders["cache"], folders["snapshot"])
                        fresh = tempfile.mkdtemp(dir=scratch)
                        shutil.copytree(folders["snapshot"], os.path.join(fresh, "cache"))
                        env.update(TRITON_CACHE_DIR=os.path.join(fresh, "cache"), JIT_AHEAD_PLAN_DIR=tempfile.mkdtemp(dir=scratch),
                                   JIT_AHEAD_TUNING_DIR=os.path.join(fresh, "tuning"))
                        env.pop("JIT_AHEAD_RECORD_DIR")
                    t0 = time.perf_counter()
                    result = run_child([__file__, "--one", model, set_name, arm, str(seed)], env, args.arm_timeout,
                                       "ARM ", {"model": model, "set": set_name, "arm": arm})
                    result["process_s"] = round(time.perf_counter() - t0, 2)
                    results.append(result)
                    print(json.dumps(result), flush=True)
                    with open(os.path.join(args.out, "engine_starts.partial.json"), "w") as f:
                        json.dump({"seed": seed, "results": results}, f, indent=1)  # kept if a later arm hangs
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "sets": SETS, "models": MODELS, "requests": REQUESTS, "seed": seed,
              "command": " ".join(sys.argv), "results": results}
    write_report(args.out, "engine_starts", report, report_lines(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
