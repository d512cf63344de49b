"""Environment knobs. A bad value logs one line naming the problem and the fallback, never raises."""
from __future__ import annotations

import logging
import os
import re


log = logging.getLogger("jit_ahead.knobs")

# Variables launchers set to say how many ranks share this node, most specific first.
_LOCAL_SIZE_VARS = (
    "LOCAL_WORLD_SIZE",  # torchrun
    "OMPI_COMM_WORLD_LOCAL_SIZE",  # Open MPI
    "MPI_LOCALNRANKS",  # MPICH / Intel MPI
    "MV2_COMM_WORLD_LOCAL_SIZE",  # MVAPICH
    "SLURM_NTASKS_PER_NODE",  # Slurm; may read "8(x2)"
)


# Bounds that only refuse absurd values: a day for any wait, and sizes far beyond what engines use.
MAX_SECONDS = 86400.0
MAX_PROCESSES = 1024
MAX_TOKENS = 1 << 24
MAX_BATCH = 1 << 16


def _env_number(name: str, default, minimum, maximum, parse, kind: str, quiet: bool = False,
                default_said: str | None = None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = parse(raw.strip())
    except ValueError:
        value = None
    if value is None or not minimum <= value <= maximum:  # also false for nan; inf is above any maximum
        if not quiet:
            log.error("%s=%r is not %s from %s to %s; using the default %s", name, raw, kind, minimum, maximum,
                      default if default_said is None else default_said)
        return default
    return value


def _plain_int(text: str) -> int:
    """An integer written as plain ASCII digits with an optional sign: Python's ``int`` also takes ``1_000``
    and other scripts' digits, which a shell user does not mean as a count."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(text)
    return int(text)


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int = 2**31 - 1, quiet: bool = False,
            default_said: str | None = None) -> int:
    """``default_said``: how a bad value's line names the default, where ``default`` only stands for one
    worked out later."""
    return _env_number(name, default, minimum, maximum, _plain_int, "an integer", quiet, default_said)


def _plain_float(text: str) -> float:
    """A decimal number in plain ASCII (``1.5``, ``2``, ``1e3``): as ``_plain_int``, not ``1_0``."""
    if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
        raise ValueError(text)
    return float(text)


def env_seconds(name: str, default: float, *, minimum: float = 0.0) -> float:
    """A duration knob: finite, from ``minimum`` to a day."""
    return _env_number(name, default, minimum, MAX_SECONDS, _plain_float, "a number")


def usable_cpus() -> int:
    """CPUs this process may run on (affinity and cgroup-pinned sets), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this platform
        return max(1, os.cpu_count() or 1)


def local_rank_count() -> int:
    for name in _LOCAL_SIZE_VARS:
        raw = os.environ.get(name, "").strip()
        digits = raw.split("(", 1)[0]
        if digits.isdigit() and int(digits) > 0:
            return int(digits)
    return 1


def _cpus_per_rank() -> int:
    return usable_cpus() // local_rank_count()


def default_worker_count() -> int:
    """Helpers per rank: the CPUs left per local rank after one for the rank's own executor."""
    return max(1, _cpus_per_rank() - 1)


def helper_count(name: str, default: int, *, minimum: int = 0, quiet: bool = False) -> int:
    """A count of helpers this rank keeps: above the CPUs it may use, more only queue for them (and hold
    memory and pids for as long as there is work), so it is capped there with one line."""
    value = env_int(name, default, minimum=minimum, maximum=MAX_PROCESSES, quiet=quiet)
    cap = max(1, minimum, _cpus_per_rank())
    if value > cap:
        if not quiet:
            log.warning("%s=%d is more than the %d CPUs this rank may use (%d usable, %d local ranks); using %d",
                        name, value, cap, usable_cpus(), local_rank_count(), cap)
        return cap
    return value


def worker_count(knob: str, quiet: bool = False) -> int:
    """Helpers for one family; ``0`` means no helpers (every miss builds in place). ``quiet``: a bad or
    capped value is not said (the pool that reads it again says it)."""
    return helper_count(knob, default_worker_count(), minimum=0, quiet=quiet)


def planner_count(quiet: bool = False) -> int:
    """JIT_AHEAD_PLANNERS: planner processes forked from the server to enumerate a model's launches
    (default: the CPUs per local rank, minus one for the rank's own work); ``0`` enumerates in a thread
    of the server instead, which stops once serving starts. Capped, with one line, at the CPUs this rank
    may use, as helpers are: more planners only queue for them, each a fork of the server. ``quiet``: the
    cap is not said (a caller that reads it again)."""
    return helper_count("JIT_AHEAD_PLANNERS", default_worker_count(), minimum=0, quiet=quiet)


def serving_worker_count() -> int:
    """JIT_AHEAD_SERVING_WORKERS: helpers per family that keep building once serving has started (the
    others exit after their current build). Default: half the CPUs per local rank, minus one for the
    executor: a full set of helpers slows a busy executor thread even at nice 19, half of them leaves it
    CPUs of its own (measured: docs/benchmarks.md, CPU politeness)."""
    default = max(1, _cpus_per_rank() // 2 - 1)
    return helper_count("JIT_AHEAD_SERVING_WORKERS", default, minimum=0)


def serving_planner_count() -> int:
    """JIT_AHEAD_SERVING_PLANNERS: planners that keep enumerating once serving has started; the others
    exit after the chunk they run and the ones left claim the rest, so planning left over at serving
    shares the spare CPUs with the helpers still building instead of taking them all. Default: half the
    serving helpers, at least one."""
    return helper_count("JIT_AHEAD_SERVING_PLANNERS", max(1, serving_worker_count() // 2), minimum=1)


def checked_process_count(name: str, value) -> int:
    """A process count passed in code (or on a command line): anything but an integer from 0 to
    MAX_PROCESSES raises."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PROCESSES:
        raise ValueError(f"{name} must be an integer from 0 (no helpers: misses build in place) to "
                         f"{MAX_PROCESSES}, not {value!r}")
    return value


def checked_seconds(name: str, value: float, *, minimum: float = 0.0) -> float:
    """A duration passed in code: one that no wait can take (nan, inf, negative, beyond a day) raises."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value <= MAX_SECONDS:
        raise ValueError(f"{name} must be a number of seconds from {minimum} to {MAX_SECONDS:.0f}, not {value!r}")
    return float(value)


def wait_timeout_s(explicit: float | None = None) -> float:
    """How long a launch waits on another's build before it falls back to the DSL's own path:
    ``explicit`` (checked) or JIT_AHEAD_WAIT_TIMEOUT_S."""
    if explicit is not None:
        return checked_seconds("wait_timeout", explicit)
    return env_seconds("JIT_AHEAD_WAIT_TIMEOUT_S", 120.0, minimum=0.0)


def build_timeout_s() -> float:
    """A helper build that runs longer than this is killed and counts as a crash."""
    return env_seconds("JIT_AHEAD_BUILD_TIMEOUT_S", 600.0, minimum=1.0)


def preload_modules(knob: str) -> tuple[str, ...]:
    """Comma-separated modules helpers import as soon as they start (e.g. ``liger_kernel.ops``), so the
    kernel library's import overlaps the server's own start instead of following its first plan."""
    return tuple(m.strip() for m in os.environ.get(knob, "").split(",") if m.strip())


def cache_folder(name: str, default_leaf: str, raw: str | None = None) -> "Path | None":
    """The folder knob ``name`` names: unset or empty, ``~/.cache/jit_ahead/<default_leaf>`` (under
    ``$XDG_CACHE_HOME`` where that is set); ``0``/``off``/``false``/``no``: None (off)."""
    from pathlib import Path

    raw = ((os.environ.get(name) if raw is None else raw) or "").strip()
    if raw.lower() in ("0", "off", "false", "no"):
        return None
    if not raw:
        base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
        raw = os.path.join(base, "jit_ahead", default_leaf)
    return Path(raw).absolute()


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """One of ``choices`` (case-insensitive); unset or empty gives ``default``, anything else logs one line."""
    raw = os.environ.get(name, default).strip().lower() or default
    if raw not in choices:
        log.error("%s=%r is not one of %s; using %s", name, raw, "|".join(choices), default)
        return default
    return raw


HELPER_START_MODES = ("server", "fork", "spawn")


def helper_start_mode() -> str:
    """JIT_AHEAD_HELPER_START: ``server`` (default) forks every helper from a fork server that is itself
    a fork of the server made before serving (the kernel libraries it imported are there, so the first
    build starts at once); ``fork`` makes that fork server a fresh interpreter that imports them once;
    ``spawn`` starts each helper as its own interpreter."""
    return env_choice("JIT_AHEAD_HELPER_START", HELPER_START_MODES, "server")


GUARD_MODES = ("off", "warn", "error")


def guard_mode() -> str:
    """JIT_AHEAD_MODE: what an executor compile after the start of serving does: ``warn`` (default) logs
    one warning naming the variant and how it differs from the nearest planned one, ``error`` raises,
    ``off`` says nothing."""
    return env_choice("JIT_AHEAD_MODE", GUARD_MODES, "warn")


def model_planner_enabled() -> bool:
    """``JIT_AHEAD_MODEL_PLANNER`` (on|off, default on): plan each model's own forward beyond the layers
    library providers know."""
    return env_choice("JIT_AHEAD_MODEL_PLANNER", ("on", "off"), "on") == "on"


def tune_ahead_enabled() -> bool:
    """``JIT_AHEAD_TUNE_AHEAD`` (1|0, default 1): at ``mark_serving``, benchmark on the GPU every tuning key
    planning met that has no choice yet, so that no autotuner benchmarks while serving."""
    return env_choice("JIT_AHEAD_TUNE_AHEAD", ("1", "0", "on", "off"), "1") in ("1", "on")


def tune_ahead_budget_bytes(free_bytes: int) -> int:
    """``JIT_AHEAD_TUNE_AHEAD_MEMORY_MB``: the most GPU memory one tuning task's tensors may take
    (default: a sixteenth of the memory free when tuning starts)."""
    megabytes = env_int("JIT_AHEAD_TUNE_AHEAD_MEMORY_MB", -1, minimum=0, maximum=1 << 24,
                        default_said="(a sixteenth of the free GPU memory)")
    return free_bytes // 16 if megabytes < 0 else megabytes << 20


def tune_ahead_rep_ms() -> int:
    """``JIT_AHEAD_TUNE_AHEAD_REP_MS`` (1-1000, default 20): how long, in milliseconds, tune-ahead times each
    config of an autotuner that uses Triton's default benchmark (its warmup runs for a quarter of that).
    Triton's own default is 100 ms of timed runs after 25 of warmup; tune-ahead benchmarks every key the
    limits allow before ready, where a request would have benchmarked only the keys it met, so it times
    each config over a shorter window. 100 gives Triton's window. An autotuner given its own ``do_bench``
    keeps it."""
    return env_int("JIT_AHEAD_TUNE_AHEAD_REP_MS", 20, minimum=1, maximum=1000)


def max_planned_launches() -> int:
    """``JIT_AHEAD_MAX_PLANNED_LAUNCHES`` (default 200000): the most launches one planning run lists, over all
    its providers. Planning holds each listed launch until it runs; limits whose space is larger than this
    (a provider that cannot classify its shapes, at a long context) are cut there with one line, the plan is
    not whole, and what is left compiles as without jit_ahead."""
    return env_int("JIT_AHEAD_MAX_PLANNED_LAUNCHES", 200_000, minimum=1, maximum=10_000_000)


def engine_limits():
    """The limits the ``JIT_AHEAD=1`` path plans models within: ``JIT_AHEAD_MAX_NUM_TOKENS`` (default
    8192), ``JIT_AHEAD_MAX_BATCH_SIZE`` (16), ``JIT_AHEAD_MAX_SEQ_LEN`` (4096) and
    ``JIT_AHEAD_CUDA_GRAPH_SIZES`` (comma-separated, default 1,2,4,8,16; sizes above the batch limit are
    dropped). A bad value logs one line and uses the default."""
    from .planning.limits import EngineLimits

    tokens = env_int("JIT_AHEAD_MAX_NUM_TOKENS", 8192, minimum=1, maximum=MAX_TOKENS)
    batch = env_int("JIT_AHEAD_MAX_BATCH_SIZE", 16, minimum=1, maximum=MAX_BATCH)
    seq = env_int("JIT_AHEAD_MAX_SEQ_LEN", 4096, minimum=1, maximum=MAX_TOKENS)
    raw = os.environ.get("JIT_AHEAD_CUDA_GRAPH_SIZES", "1,2,4,8,16")
    try:
        graphs = tuple(sorted({int(v) for v in raw.split(",") if v.strip()}))
        if any(not 1 <= g <= MAX_BATCH for g in graphs):
            raise ValueError
    except ValueError:
        log.error("JIT_AHEAD_CUDA_GRAPH_SIZES=%r is not a comma-separated list of positive integers; using "
                  "1,2,4,8,16", raw)
        graphs = (1, 2, 4, 8, 16)
    return EngineLimits(tokens, batch, seq, cuda_graph_batch_sizes=tuple(g for g in graphs if g <= batch))


def plan_models_enabled() -> bool:
    """``JIT_AHEAD_PLAN_MODELS`` (on|off, default on): with ``JIT_AHEAD=1``, plan each transformers model
    built by ``from_pretrained``/``from_config``."""
    return env_choice("JIT_AHEAD_PLAN_MODELS", ("on", "off"), "on") == "on"
