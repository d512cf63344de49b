"""Autotuner choices in records: a start with an empty cache skips the benchmarks an earlier start ran.

An autotuned launch with a new tuning key benchmarks every pruned config on the GPU (for fla's chunked
kernels, tens of seconds of warmup) and, with ``cache_results``, stores the timings in Triton's cache.
Helpers cannot benchmark: they have no GPU. So with ``JIT_AHEAD_RECORD_DIR`` set, the choice each
autotuner made (or loaded from Triton's cache) is recorded next to the variants, under a header that
adds the GPU's name to the Triton one (timings from one GPU model say nothing about another). A later
start answers from the recorded choices where Triton would look its stored timings up
(``Autotuner.check_disk_cache``): the first launch for that key runs the chosen config at once, as on a
warm cache. Planning sees the choices too and asks helpers for the chosen config's variant only.

Every autotuner's choices are kept (``keep_every_choice``): while a session keeps them
(JIT_AHEAD_TUNING_DIR, on by default), an autotuner whose library does not store results behaves as one
that does (``cache_results``), so that Triton asks ``check_disk_cache``; Triton then stores its timings in
its own cache too (on a GPU: see below). A choice is used only if the kernel's source (``JITFunction.cache_key``), the tuning
key and the pruned configs are what was recorded. No kernel module is imported to apply one.

No choice an autotuner makes on the stand-in driver is kept (``refuse_blind_choices``): its benchmarker
gives every config the same time, so Triton's ``min`` picks the first config. Such an autotuner runs every
config as on a GPU, and neither Triton's timings file nor a record nor a later plan takes its "choice".
"""
from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from triton.runtime.autotuner import Autotuner

from ..core.processes import fork_safe_lock
from ..core.records import RecordFormat, is_dotted_name
from .record import header as triton_header
from .compile_inputs import unwrap_jit_function
from .standin import times_nothing

log = logging.getLogger("jit_ahead.triton.autotune")

FAMILY = "triton-autotune"
_KEY_TYPES = (int, float, str, bool, type(None))


@dataclass(frozen=True)
class TuningChoice:
    """One autotuner's choice for one tuning key."""

    module: str
    qualname: str  # of the @triton.jit function under the autotuner
    source_key: str  # JITFunction.cache_key: the kernel's source and its dependencies
    key: tuple  # the tuning key, as Autotuner.run computes it
    configs: tuple[str, ...]  # str() of every pruned config it chose from
    best: str  # str() of the chosen config

    @property
    def identity(self) -> tuple:
        """What must match for the choice to apply: everything but the choice itself."""
        return (self.module, self.qualname, self.source_key, self.key, self.configs)


def _storable(configs) -> bool:
    """Triton's check_disk_cache neither stores nor loads choices among configs with pre_hooks."""
    return not any(c.pre_hook for c in configs)


def _identity(autotuner: Autotuner, tuning_key, configs) -> tuple | None:
    kernel = unwrap_jit_function(autotuner)
    if kernel is None or not all(isinstance(v, _KEY_TYPES) for v in tuning_key):
        return None
    return (kernel.module, kernel.fn.__qualname__, kernel.cache_key, tuple(tuning_key),
            tuple(str(c) for c in configs))


def choice_of(autotuner: Autotuner, tuning_key, configs) -> TuningChoice | None:
    """The choice ``autotuner`` holds for ``tuning_key`` after benchmarking (or loading) ``configs``."""
    best = autotuner.cache.get(tuning_key)
    identity = _identity(autotuner, tuning_key, configs)
    if best is None or identity is None:
        return None
    return TuningChoice(*identity, str(best))


class KnownChoices:
    """The recorded choices of earlier starts, looked up where Triton would look in its own cache. Each
    family that read them is their owner; they are forgotten when it closes, so that nothing of one session
    answers another's autotuners. Owners are kept by identity (not by ``id``: an owner forgotten and
    collected must not leave its number to a new one)."""

    def __init__(self) -> None:
        self._by_owner: dict[object, dict[tuple, TuningChoice]] = {}
        self._by_identity: dict[tuple, TuningChoice] = {}
        self._lock = fork_safe_lock()  # planners are forked while a replay thread may hold it
        self._reading: set[object] = set()  # owners whose stored choices are being read
        self._read = threading.Condition(self._lock)
        if hasattr(os, "register_at_fork"):
            # a fork (a planner) has no reading thread: its lookups must not wait for one
            os.register_at_fork(after_in_child=self._reading.clear)

    def expect(self, owner: object) -> None:
        """``owner`` is about to read stored choices: a lookup waits for them (``add``) a little, so that
        the first launches of a start that begins with autotuned kernels do not benchmark what is stored."""
        with self._lock:
            self._reading.add(owner)

    def add(self, choices, owner: object = None) -> None:
        with self._lock:
            mine = self._by_owner.setdefault(owner, {})
            for choice in choices:
                mine[choice.identity] = choice
            self._merge()
            self._done_reading(owner)

    def forget(self, owner: object) -> None:
        with self._lock:
            if self._by_owner.pop(owner, None) is not None:
                self._merge()
            self._done_reading(owner)

    def _done_reading(self, owner: object) -> None:  # called with the lock held
        if owner in self._reading:
            self._reading.discard(owner)
            self._read.notify_all()

    def _wait_read(self) -> None:
        with self._lock:
            if self._reading:
                self._read.wait_for(lambda: not self._reading, READ_WAIT_S)

    def _merge(self) -> None:  # called with the lock held
        self._by_identity = {identity: choice for mine in self._by_owner.values() for identity, choice in mine.items()}

    def __bool__(self) -> bool:
        """True once any choice is known (an autotuner's configs may then depend on its tuning key)."""
        return bool(self._by_identity)

    def config_for(self, autotuner: Autotuner, tuning_key, configs):
        """The Config among ``configs`` recorded as the choice for this kernel source, key and configs;
        None where Triton would not store or load one (a config with a pre_hook)."""
        self._wait_read()
        if not self._by_identity or not _storable(configs):
            return None
        identity = _identity(autotuner, tuning_key, configs)
        choice = self._by_identity.get(identity) if identity is not None else None
        if choice is None:
            return None
        return next((c for c in configs if str(c) == choice.best), None)


KNOWN = KnownChoices()
# How long a lookup waits for stored choices still being read (a small file; a start's first autotuned
# launch can come before the reading thread has run).
READ_WAIT_S = 10.0


# -- every autotuner keeps its choices ------------------------------------------------------------------------
_keep_every_choice = False


def _get_cache_results(self) -> bool:
    own = self.__dict__.get("cache_results", False)
    if own or not _keep_every_choice:
        return own
    from triton import knobs

    return not knobs.runtime.interpret


def _set_cache_results(self, value) -> None:
    self.__dict__["cache_results"] = value


_KEEPING = property(_get_cache_results, _set_cache_results,
                    doc="the library's own setting, or True while jit_ahead keeps every choice")


def keep_every_choice(on: bool) -> None:
    """While on, every autotuner stores its choices as one built with ``cache_results`` does: Triton asks
    ``check_disk_cache`` (where records answer and record). A property on the class (it takes precedence
    over each instance's own attribute, which it leaves as the library set it): off again, every
    autotuner is what it was."""
    global _keep_every_choice
    with _lock:
        _keep_every_choice = on
        if on:
            Autotuner.cache_results = _KEEPING
        elif Autotuner.__dict__.get("cache_results") is _KEEPING:
            del Autotuner.cache_results


# -- Autotuner.check_disk_cache: where Triton loads or stores a choice, so where records do too ------------
class Benchmark:
    """One autotuner's benchmark in progress on this thread: the variants first launched for each config,
    so that those of configs it did not choose can be recorded as benchmark-only."""

    def __init__(self) -> None:
        self.config = None  # the config being timed (Autotuner._bench)
        self.launched: list[tuple[object, object]] = []  # (variant, config)


_benchmark: contextvars.ContextVar[Benchmark | None] = contextvars.ContextVar("jit_ahead_benchmark", default=None)
_original_check_disk_cache = Autotuner.check_disk_cache
_original_bench = Autotuner._bench
ChoiceRecorder = Callable[[TuningChoice | None, list], None]
BenchListener = Callable[[Autotuner, tuple, dict], None]
_recorder: ChoiceRecorder | None = None
_bench_listener: BenchListener | None = None
_lock = fork_safe_lock()


def benchmark_in_progress() -> Benchmark | None:
    """The benchmark this thread is inside, if an autotuner is timing configs right now."""
    return _benchmark.get()


def benchmarks_blindly(autotuner: Autotuner) -> bool:
    """Whether ``autotuner`` times its configs with the stand-in driver's benchmarker (asked just before it
    benchmarks: Triton fixes an autotuner's benchmarker at its first benchmark, a cached property of the
    driver active then)."""
    return times_nothing(autotuner.do_bench)


def chose_blindly(autotuner: Autotuner) -> bool:
    """Whether ``autotuner`` has benchmarked with the stand-in's benchmarker in this process, so that the
    choices it holds may be the stand-in's. One that never benchmarked here (its choices loaded, or made
    on a GPU before a planner was forked) is not asked for a benchmarker now."""
    benchmarker = vars(autotuner).get("do_bench")  # set at its first benchmark
    return benchmarker is not None and times_nothing(benchmarker)


def _check_disk_cache_with_records(self, tuning_key, configs, bench_fn):
    known = KNOWN.config_for(self, tuning_key, configs)
    if known is not None:  # as if Triton had found the timings in its cache
        self.cache[tuning_key] = known
        return True
    blind = benchmarks_blindly(self)
    benchmark = Benchmark()
    token = _benchmark.set(benchmark)
    try:
        if blind:  # every config runs; Triton's timings file is neither read (it may hold a blind choice of
            bench_fn()  # an earlier version) nor written
            used_cached = False
        else:
            used_cached = _original_check_disk_cache(self, tuning_key, configs, bench_fn)
    finally:
        _benchmark.reset(token)
    recorder = _recorder
    if recorder is not None:
        try:
            kept = _storable(configs) and not blind
            recorder(choice_of(self, tuning_key, configs) if kept else None, benchmark.launched)
        except Exception:  # recording must never break a launch
            log.exception("recording the autotune choice of %s failed", getattr(self, "base_fn", self))
    return used_cached


def _bench_naming_the_config(self, *args, config, **meta):
    benchmark = _benchmark.get()
    if benchmark is not None:
        benchmark.config = config
    listener = _bench_listener
    if listener is not None:
        try:
            listener(self, args, meta)
        except Exception:  # counting must never break a benchmark
            log.exception("the autotune benchmark listener failed")
    return _original_bench(self, *args, config=config, **meta)


def _patch_bench() -> None:
    """``Autotuner._bench`` is ours while a recorder or a listener needs it (called with _lock held)."""
    Autotuner._bench = _bench_naming_the_config if (_recorder or _bench_listener) else _original_bench


def _patch_check_disk_cache() -> None:
    """``Autotuner.check_disk_cache`` is ours while a recorder needs it or once a stand-in was installed
    (called with _lock held)."""
    ours = _recorder is not None or _refusing_blind_choices
    Autotuner.check_disk_cache = _check_disk_cache_with_records if ours else _original_check_disk_cache


_refusing_blind_choices = False


def refuse_blind_choices() -> None:
    """From now on in this process, no choice made with the stand-in's benchmarker is stored in Triton's
    cache (whose timings files a GPU server with the same target would read). Called when the stand-in
    driver is installed; it stays, as autotuners keep the benchmarker they first used."""
    global _refusing_blind_choices
    with _lock:
        _refusing_blind_choices = True
        _patch_check_disk_cache()


def install_recorder(recorder: ChoiceRecorder) -> None:
    """``recorder(choice, launched)`` after every check_disk_cache: the choice (None if not storable or made
    on the stand-in) and the (variant, config) pairs the benchmark launched first."""
    global _recorder
    with _lock:
        _recorder = recorder
        _patch_check_disk_cache()
        _patch_bench()


def remove_recorder(recorder: ChoiceRecorder) -> None:
    global _recorder
    with _lock:
        if _recorder == recorder:
            _recorder = None
            _patch_check_disk_cache()
            _patch_bench()


def install_bench_listener(listener: BenchListener) -> None:
    """``listener(autotuner, args, kwargs)`` before each config an autotuner times (its benchmark, on the
    GPU): what the stats count as a tuning on the executor."""
    global _bench_listener
    with _lock:
        _bench_listener = listener
        _patch_bench()


def remove_bench_listener(listener: BenchListener) -> None:
    global _bench_listener
    with _lock:
        if _bench_listener == listener:
            _bench_listener = None
            _patch_bench()


# -- the record format ------------------------------------------------------------------------------------
def encode(choice: TuningChoice) -> dict:
    return {"module": choice.module, "qualname": choice.qualname, "source_key": choice.source_key,
            "key": list(choice.key), "configs": list(choice.configs), "best": choice.best}


def decode(entry: dict) -> TuningChoice:
    module, qualname = entry["module"], entry["qualname"]
    if not (is_dotted_name(module) and is_dotted_name(qualname)):
        raise ValueError(f"not a kernel name: {module!r} {qualname!r}")
    key, configs, best, source_key = entry["key"], entry["configs"], entry["best"], entry["source_key"]
    if not (isinstance(key, list) and all(isinstance(v, _KEY_TYPES) for v in key) and isinstance(configs, list)
            and all(isinstance(c, str) for c in configs) and isinstance(best, str) and isinstance(source_key, str)):
        raise TypeError("bad tuning key, configs or choice")
    return TuningChoice(module, qualname, source_key, tuple(key), tuple(configs), best)


def record_format(target: tuple[str, int, int], device_name: str) -> RecordFormat:
    """Triton's header plus the GPU's name: the timings behind a choice belong to that GPU model."""
    return RecordFormat(family=FAMILY, header={**triton_header(target), "device": device_name},
                        key_of=lambda choice: json.dumps(choice.identity), encode=encode, decode=decode)
