"""Planning: run real launcher code and get back the exact compile requests it would cause.

Inside ``with capture() as plan:`` any Triton launch (``kernel[grid](...)``, ``kernel.warmup(...)``,
a library's Python wrapper around them) is turned into a recorded :class:`TritonCompileRequest`
instead of a compile and a launch. Arguments are meta tensors (exact dtype, shape, strides and storage
offset, so alignment specialization matches the caching allocator) and plain ints. With no GPU the
stand-in driver supplies the target.

Autotuned kernels record every config that survives pruning: Triton's ``Autotuner.run`` would benchmark
them, which needs a GPU, so while a capture is active in the calling context it is replaced by a pass that
requests each pruned config instead, or only the chosen one where the autotuner already holds a choice
for the tuning key (a recorded choice: ``autotune.py``). A capture requests the configs of an autotuned
launch once per tuning key and argument specialization; later launches that repeat both are skipped.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import itertools
import threading
import time
from collections.abc import Iterator

import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from ..core.processes import fork_safe_lock
from ..core.shared_patch import capturing_into
from . import autotune, hook, tuning
from .request import cache_invalidating_env, request_from_hook
from .request import TritonCompileRequest
from .compile_inputs import on_disk
from . import standin
from .standin import driver_for


class _Recorded:
    """Fills a capture's private in-memory cache for a variant already recorded, so that enumerating
    thousands of shapes costs Triton's in-memory hit path per repeat, far cheaper than a hook call.
    It accepts the launch and does nothing, like the capture itself, except name its variant to the
    autotuned launch being captured: that launch's group holds its repeated configs too."""

    function = None
    packed_metadata = None

    def __init__(self, predicted_hash: str) -> None:
        self.predicted_hash = predicted_hash

    def launch_metadata(self, *args):
        return None

    def run(self, *args, **kwargs):
        group = _autotune_group.get()
        if group is not None:
            group.append(self.predicted_hash)
        return None


# Each capture launches on its own device index, far above any real GPU's: Triton keys its in-memory cache
# by device, so what a capture stores there is never seen by a real launch, and is dropped afterwards.
_private_devices = itertools.count(1 << 20)


class Capture:
    """The requests captured in one planning context, deduplicated by predicted disk hash.

    The in-memory key depends on keyword order; the disk hash does not, so it is the identity here.
    ``launches`` counts distinct in-memory variants seen (repeats hit the capture's private cache).
    """

    def __init__(self, target: GPUTarget) -> None:
        self.target = target  # what the capture's private device index stands for
        self._lock = threading.Lock()
        self._requests: dict[str, TritonCompileRequest] = {}
        self._env = cache_invalidating_env()
        self._kernels: set[JITFunction] = set()
        self.device = next(_private_devices)
        self._autotuned: set = set()  # autotuned launches already requested in full (plan._repeat_key)
        # the variants of each autotuned launch, in config order; a dict: enumerating many tuning keys of
        # one specialization repeats the same group
        self._autotune_groups: dict[tuple[str, ...], None] = {}
        self.autotune_repeats = 0  # autotuned launches skipped as repeats of those
        self._tuning: dict[tuple, tuning.TuningTask] = {}  # (autotuner, tuning key) -> first task met
        self.launches = 0
        self.seconds = 0.0
        # repeats of an autotuned launch are skipped; a launch trace (launch_trace.py) sees every launch
        self.skip_autotune_repeats = True

    def record(self, *, fn, compile: dict) -> None:
        request = request_from_hook(fn, compile, self._env)
        kernel = fn.jit_function
        kernel.device_caches[compile["device"]][0][compile["key"]] = _Recorded(request.predicted_hash)
        with self._lock:
            self._kernels.add(kernel)
            self.launches += 1
            self._requests.setdefault(request.predicted_hash, request)
        group = _autotune_group.get()
        if group is not None:
            group.append(request.predicted_hash)

    def seen_autotune(self, repeat_key) -> bool:
        if not self.skip_autotune_repeats:
            return False
        with self._lock:
            seen = repeat_key in self._autotuned
            self.autotune_repeats += seen
            return seen

    def add_autotune(self, repeat_key) -> None:
        with self._lock:
            self._autotuned.add(repeat_key)

    def add_autotune_group(self, keys: list[str]) -> None:
        with self._lock:
            self._autotune_groups.setdefault(tuple(dict.fromkeys(keys)), None)

    def add_tuning(self, autotuner, key: tuple, make) -> None:
        """The tuning task ``make()`` of ``autotuner`` at ``key``, unless this capture met that key already."""
        try:
            ident = (id(autotuner), key)
            hash(ident)
        except TypeError:  # a tuning key Triton's own cache could not hold either
            return
        with self._lock:
            if ident in self._tuning:
                return
            self._tuning[ident] = None  # claimed: a concurrent launch of the same key does not make it again
        task = make()
        with self._lock:
            if task is None:
                del self._tuning[ident]
            else:
                self._tuning[ident] = task

    @property
    def tuning_tasks(self) -> list[tuning.TuningTask]:
        """Every (autotuner, tuning key) met that has no choice yet, first-seen order: what tune-ahead
        benchmarks on the GPU before serving."""
        with self._lock:
            return [t for t in self._tuning.values() if t is not None]

    @property
    def autotune_groups(self) -> list[tuple[str, ...]]:
        """The variants of each autotuned launch that requested more than one config: the set an autotuner
        on the executor benchmarks one after another when it meets that tuning key."""
        with self._lock:
            return list(self._autotune_groups)

    def release(self) -> None:
        """Drop the private in-memory caches this capture filled."""
        with self._lock:
            kernels, self._kernels = self._kernels, set()
        for kernel in kernels:
            kernel.device_caches.pop(self.device, None)

    @property
    def requests(self) -> list[TritonCompileRequest]:
        with self._lock:
            return list(self._requests.values())

    def missing(self) -> list[TritonCompileRequest]:
        """Requests with no complete entry in Triton's cache: what helpers still have to build."""
        return [r for r in self.requests if not on_disk(r.predicted_hash, r.name)]

    def __len__(self) -> int:
        return len(self._requests)


# -- process-wide patches, installed while any capture is active ---------------------------------------------
# Launches outside capturing contexts only pass through a ContextVar check while a capture runs, and
# nothing at all otherwise.
_original_autotuner_run = Autotuner.run
# the variants requested by the autotuned launch being captured on this thread (Capture.autotune_groups)
_autotune_group: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("jit_ahead_autotune_group",
                                                                                    default=None)


class _NoChoiceYet(Exception):
    def __init__(self, tuning_key) -> None:
        super().__init__(tuning_key)
        self.tuning_key = tuning_key


class _ChoicesOf(dict):
    """An autotuner's cache as Autotuner.run sees it inside a capture: every key looks known, so run()
    computes the tuning key its own way and asks for the choice; one not made yet raises _NoChoiceYet."""

    def __init__(self, real: dict) -> None:
        super().__init__()
        self.real = real

    def __contains__(self, key) -> bool:
        return True

    def __getitem__(self, key):
        try:
            return self.real[key]
        except KeyError:
            raise _NoChoiceYet(key) from None


def _capturing_autotuner_run(self, *args, **kwargs):
    """In a capture, request the config this autotuner already chose for these arguments (earlier in this
    process, or in a recorded start: ``autotune.KNOWN``), else every pruned config: Triton's ``run`` would
    benchmark them, which needs a GPU."""
    plan = hook.capturing.get()
    if plan is None:
        return _original_autotuner_run(self, *args, **kwargs)
    fixed = _fixed_configs_key(self, plan.device, args, kwargs)
    if fixed is not None:  # no pruning: every config is benchmarked, at every tuning key
        _note_tuning(plan, self, args, kwargs, self.configs)
        if plan.seen_autotune(fixed):
            return None
    probe = copy.copy(self)  # Triton's own run() on a private copy whose cache answers from the real one
    # a choice made on the stand-in is no choice: plan every config (recorded ones still answer, below)
    probe.cache = _ChoicesOf({} if autotune.chose_blindly(self) else self.cache)
    try:
        return _original_autotuner_run(probe, *args, **kwargs)
    except _NoChoiceYet as missing:
        tuning_key = missing.tuning_key
    # pruning reads the arguments from ``nargs``: set them on the private copy, never on the autotuner a
    # serving thread may be running at this moment
    probe.nargs = dict(zip(self.arg_names, args))
    pruned = probe.prune_configs(kwargs)
    # recorded choices answer only where Triton's check_disk_cache would be asked
    known = autotune.KNOWN.config_for(self, tuning_key, pruned) if self.cache_results else None
    configs = pruned if known is None else [known]
    if known is None and fixed is None:
        _note_tuning(plan, self, args, kwargs, pruned)
    repeat = _repeat_key(self, plan.device, tuning_key, configs, args, kwargs)
    if repeat is not None and plan.seen_autotune(repeat):
        return None
    group: list[str] = []
    token = _autotune_group.set(group)
    try:
        for config in configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())
    finally:
        _autotune_group.reset(token)
    if len(configs) > 1 and group:
        plan.add_autotune_group(group)
    if repeat is not None:
        plan.add_autotune(repeat)
    if fixed is not None:
        plan.add_autotune(fixed)
    return None


def _note_tuning(plan: Capture, autotuner: Autotuner, args: tuple, kwargs: dict, configs: list) -> None:
    """A tuning task for an autotuned launch that would benchmark (more than one config to choose from)."""
    if len(configs) < 2:
        return
    key = tuning.tuning_key(autotuner, args, kwargs)
    plan.add_tuning(autotuner, key, lambda: tuning.task_of(autotuner, args, kwargs, configs, key))


def _fixed_configs_key(autotuner: Autotuner, device: int, args: tuple, kwargs: dict):
    """The repeat key of an autotuned launch whose configs cannot depend on its arguments' values: no
    pruning function or performance model, no choice made in this process or recorded. It then runs all
    its configs for every tuning key, so what it requests is decided by its configs and the arguments'
    specialization alone, and a repeat is known without computing the tuning key or pruning (the common
    case in fla, where enumerating thousands of shapes launches each autotuner once per shape). None
    otherwise: ``_repeat_key`` decides after Triton's own key and pruning."""
    kernel = autotuner.fn
    if (not isinstance(kernel, JITFunction) or len(autotuner.configs) < 2 or autotuner.early_config_prune
            or autotuner.perf_model or autotuner.cache or autotune.KNOWN):
        return None
    binder = kernel.device_caches[device][4]
    _, specialization, _ = binder(*args, **kwargs, **autotuner.configs[0].all_kwargs())
    key = "fixed", id(autotuner), tuple(specialization)
    try:
        hash(key)
        return key
    except TypeError:  # an unhashable constexpr value
        return "fixed", id(autotuner), str(specialization)


def _repeat_key(autotuner: Autotuner, device: int, tuning_key, configs: list, args: tuple, kwargs: dict):
    """What decides the variants an autotuned launch requests: the autotuner, its tuning key, the configs
    it runs and the arguments' specialization (Triton's own binder; integer classes, alignment, dtypes and
    constexpr values). Enumerating thousands of shapes repeats these, and each repeat would cost one
    launch per config (13 on average in fla). None where it cannot be known up front: heuristics inside
    the autotuner compute values from each config's full arguments."""
    kernel = autotuner.fn
    if not isinstance(kernel, JITFunction) or not configs:
        return None
    binder = kernel.device_caches[device][4]
    _, specialization, _ = binder(*args, **kwargs, **configs[0].all_kwargs())
    ids = tuple(map(id, configs))
    # the autotuner's own Config objects live as long as it does; ones a pruning function made up may not
    chosen = ids if set(ids) <= set(map(id, autotuner.configs)) else repr([c.all_kwargs() for c in configs])
    return id(autotuner), tuning_key, chosen, str(specialization)


def _redirect_driver(driver) -> dict:
    """In a capture, launch on the capture's private device (and stream 0); returns what to restore."""
    saved = {name: (name in vars(driver), getattr(driver, name))
             for name in ("get_current_device", "get_current_stream", "get_current_target")}
    original_device = saved["get_current_device"][1]
    original_stream = saved["get_current_stream"][1]
    original_target = saved["get_current_target"][1]

    def get_current_device():
        plan = hook.capturing.get()
        return original_device() if plan is None else plan.device

    def get_current_stream(*args):
        return original_stream(*args) if hook.capturing.get() is None else 0

    def get_current_target():
        # a real driver would look the private index up on the GPU (torch: "Invalid device id")
        plan = hook.capturing.get()
        return original_target() if plan is None else plan.target

    driver.get_current_device = get_current_device
    driver.get_current_stream = get_current_stream
    driver.get_current_target = get_current_target
    return saved


def _restore_driver(driver, saved: dict) -> None:
    for name, (was_instance_attribute, original) in saved.items():
        if was_instance_attribute:
            setattr(driver, name, original)
        else:
            vars(driver).pop(name, None)


_patch_lock = fork_safe_lock()
_patch_users = 0
_patched_driver: tuple | None = None  # (driver, what _redirect_driver saved)


def reset_after_fork() -> None:
    """In a planner forked from the server while one of its threads was capturing: no capture is active
    in this process, so the next one installs the patches afresh (on this process's driver)."""
    global _patch_users, _patched_driver
    _patch_users = 0
    _patched_driver = None
    Autotuner.run = _original_autotuner_run
    standin.reset_after_fork()


@contextlib.contextmanager
def _capture_patches() -> Iterator[None]:
    global _patch_users, _patched_driver
    with _patch_lock:
        _patch_users += 1
        if _patch_users == 1:
            Autotuner.run = _capturing_autotuner_run
            driver = triton.runtime.driver.active
            _patched_driver = (driver, _redirect_driver(driver))
    try:
        yield
    finally:
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                Autotuner.run = _original_autotuner_run
                _restore_driver(*_patched_driver)
                _patched_driver = None


@contextlib.contextmanager
def capture(target: GPUTarget | None = None) -> Iterator[Capture]:
    """Record the compile requests of every Triton launch made in this context; nothing compiles or runs.

    While any capture is active, the driver's device and stream queries go through a ContextVar check
    (well under a microsecond per launch): launches outside capturing contexts are otherwise untouched.
    """
    with driver_for(target) as target:
        plan = Capture(target)
        t0 = time.perf_counter()
        with capturing_into(hook, plan), _capture_patches():
            try:
                yield plan
            finally:
                plan.release()
                plan.seconds += time.perf_counter() - t0


def plan_launch(kernel, *args, grid=(1,), **kwargs) -> list[TritonCompileRequest]:
    """The requests one launch of ``kernel`` (jit, heuristics or autotune) would cause."""
    with capture() as plan:
        kernel.run(*args, grid=grid, warmup=True, **kwargs)
    return plan.requests
