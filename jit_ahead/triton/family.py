"""The Triton family: its pool, its hook and its executor side, wired together."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from triton import knobs
from triton.backends.compiler import GPUTarget

from ..core import device_view
from ..core.observing import events
from ..core import knobs as core_knobs
from ..core.family import Family
from ..core.building.pool import FamilySpec
from ..core.priority import Priority
from ..core.records import KNOB as RECORD_KNOB
from ..core.records import (RecordFolder, RecordFormat, is_dotted_name, keeps_tuning, record_folder,
                             recording_enabled, tuning_folder)
from ..core.observing.stats import Stats
from ..core.building.table import Ticket
from ..registry import workers_knob
from . import autotune, cache_check, hook, store_cache
from .executor import TritonExecutor
from .installation_key import compute_installation_key_in_background
from .record import RecordedVariant, record_format
from .record import decode_for as decode_record_for
from .record import encode as encode_record
from .record import header as record_header
from .compile_inputs import not_importable
from .device import target_of
from .request import FAMILY, TritonCompileRequest
from .standin import install_stand_in

if TYPE_CHECKING:  # planning's modules are imported when a process first plans or tunes
    from .plan import Capture

log = logging.getLogger("jit_ahead.triton")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.triton.build", workers_knob=workers_knob(FAMILY),
                  preload_knob="JIT_AHEAD_TRITON_PRELOAD")
# Triton's installation key is found this long after the session starts (installation_key.py): the CPU it takes is
# not spent by short processes, and a server is still building its model then.
INSTALLATION_KEY_DELAY_S = 1.0


class TritonFamily(Family):
    name, spec, executor_class, hook = FAMILY, SPEC, TritonExecutor, hook
    # records: the variants this process built or loaded, and its autotune choices (per GPU model)
    record_kinds = ("records", "tuning_records")
    extra_kinds = ("autotune_groups", "tuning_tasks")  # what a capture (plan.Capture) finds besides variants

    def __init__(self, stats: Stats, **options) -> None:
        # Helpers must write where this process reads: Triton's group files hold absolute paths.
        self.cache_dir = os.path.abspath(knobs.cache.dir)
        self._view = device_view.ViewOnDemand()  # read when first needed: starting costs no torch import
        super().__init__(stats, device_view=self._view, env_overrides={"TRITON_CACHE_DIR": self.cache_dir}, **options)
        self._plan_decoder = None
        self._tuning_lock = threading.Lock()
        self._closing = False
        self._key_timer: threading.Timer | None = None
        self._store_manager = None  # what store_cache.use_store() changed, put back at close
        self._tuning: dict[tuple, tuple] = {}  # task identity -> (priority, order, TuningTask)

    @property
    def device_view(self) -> device_view.DeviceView:
        return self._view.get()

    def start(self) -> None:
        self._key_timer = compute_installation_key_in_background(delay=INSTALLATION_KEY_DELAY_S)
        self._store_manager = store_cache.use_store()  # before helpers start: they inherit it
        super().start()
        log.info("triton: %d helpers, cache %s", self.pool.workers, self.cache_dir)

    def close(self, grace: float = 2.0) -> None:
        if self._key_timer is not None:
            self._key_timer.cancel()
        self._closing = True  # a replay thread still reading forgets what it adds (_open_tuning_records)
        super().close(grace)
        store_cache.stop_using_store(self._store_manager)
        self._keep_checked()  # what the launches found sound since the last plan or replay
        autotune.KNOWN.forget(self)  # the choices this session read go with it

    def _records_wanted(self) -> bool:
        """Autotune choices are kept by default (JIT_AHEAD_TUNING_DIR), variants with JIT_AHEAD_RECORD_DIR."""
        return keeps_tuning()

    def _start_recording(self) -> None:
        if recording_enabled():  # variants are recorded only where a record folder keeps them
            self.executor.recorder = self._record
        autotune.KNOWN.expect(self)  # the stored choices are read next, in the replay thread
        autotune.keep_every_choice(True)
        autotune.install_recorder(self._record_choice)

    def _install_hooks(self) -> None:
        autotune.install_bench_listener(self._on_benchmark)
        super()._install_hooks()
        self.executor.listen_to_compiles()

    def _remove_hooks(self) -> None:
        super()._remove_hooks()
        autotune.remove_recorder(self._record_choice)
        autotune.keep_every_choice(False)
        autotune.remove_bench_listener(self._on_benchmark)
        self.executor.stop_listening_to_compiles()

    @contextlib.contextmanager
    def capture(self, target=None) -> Iterator[Capture]:
        # Recorded autotune choices narrow what planning asks for: apply them first.
        if not self.wait_replay(timeout=60):
            log.warning("triton: records still being read after 60 s; planning goes on without their "
                        "autotune choices")
        from .plan import capture

        with capture(target or GPUTarget(*target_of(self.device_view))) as plan:
            yield plan
            self.executor.note_autotune_groups(plan.autotune_groups)

    def enter_planner(self) -> None:
        """In a planner process forked from the server: plan for the server's GPU without touching it
        (a stand-in driver with its target and properties), with no capture of the server's active."""
        from .plan import reset_after_fork

        reset_after_fork()
        install_stand_in(self.device_view)

    def absorb(self, kind: str, items: list, priority: Priority) -> None:
        """A capture's autotune groups (the variants an autotuner benchmarks together) or tuning tasks."""
        if kind == "autotune_groups":
            self.executor.note_autotune_groups(items)
        elif kind == "tuning_tasks":
            self.note_tuning(items, priority)
        else:
            super().absorb(kind, items, priority)

    def note_tuning(self, tasks, priority) -> None:
        """Tuning tasks a planner met (Capture.tuning_tasks); kept in priority order, then first seen."""
        with self._tuning_lock:
            for task in tasks:
                if task.identity not in self._tuning:
                    self._tuning[task.identity] = (int(priority), len(self._tuning), task)

    @property
    def tuning_tasks(self) -> list:
        with self._tuning_lock:
            return [task for _, _, task in sorted(self._tuning.values(), key=lambda e: e[:2])]

    def tune_ahead(self, budget_bytes: int | None = None, device=None) -> dict:
        """Benchmark every tuning key planning met that has no choice yet (``tune_ahead.py``), on this
        process's current GPU (``device``: another torch device, for tests on the stand-in driver);
        returns the summary, also emitted as the ``tune_ahead`` event."""
        tasks = self.tuning_tasks
        if not tasks:
            return {}
        import torch

        from . import tune_ahead

        if device is None:
            if not torch.cuda.is_available():
                log.info("triton: tune-ahead skipped (%d tuning keys): no GPU in this process", len(tasks))
                return {"tuned_ahead": 0, "left": len(tasks), "left_why": {"no GPU in this process": len(tasks)}}
            device = torch.device("cuda", torch.cuda.current_device())
        if budget_bytes is None:
            free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 30
            budget_bytes = core_knobs.tune_ahead_budget_bytes(free)
        result = tune_ahead.tune(tasks, device, budget_bytes, core_knobs.tune_ahead_rep_ms())
        summary = result.summary()
        self.stats.emit(events.TuneAhead(**summary))
        for left in result.left:
            log.info("triton: %s not tuned ahead: %s; its first launch tunes it", left.task.label, left.why)
        return summary

    # -- saved plans: the record header and entries (core/planning/plan_cache.py) -----------------------------------
    def plan_header(self) -> dict:
        return record_header(target_of(self.device_view))

    def plan_encode(self, request: TritonCompileRequest) -> dict:
        return encode_record(RecordedVariant(request))

    def _on_benchmark(self, autotuner, args: tuple, kwargs: dict) -> None:
        """An autotuner times one config on this process's GPU: the ``autotune_bench`` event, naming the
        kernel and the tuning key, and whether tune-ahead runs it."""
        from . import tuning
        from .compile_inputs import unwrap_jit_function
        from .tune_ahead import tuning_ahead

        kernel = unwrap_jit_function(autotuner)
        key = tuning.tuning_key(autotuner, args, kwargs)  # it reads only the kernel's own arguments
        self.stats.emit(events.AutotuneBench(family=FAMILY, ahead=tuning_ahead(), tuning_key=repr(key),
                                             kernel=f"{kernel.module}.{kernel.fn.__qualname__}" if kernel else "?"))

    def extra_encode(self, kind: str, item):
        if kind == "autotune_groups":
            return list(item)
        from . import tuning

        return tuning.encode_task(item) if kind == "tuning_tasks" else super().extra_encode(kind, item)

    def extra_decode(self, kind: str, entry):
        if kind == "autotune_groups":
            return tuple(map(str, entry))
        from . import tuning

        return tuning.decode_task(entry) if kind == "tuning_tasks" else super().extra_decode(kind, entry)

    def plan_decode(self, entry: dict) -> TritonCompileRequest:
        if self._plan_decoder is None:
            header = self.plan_header()
            self._plan_decoder = decode_record_for(tuple(header["target"]), header["env"])
        return self._plan_decoder(entry).request

    def submit(self, variants: Iterable[TritonCompileRequest] | Capture,
               priority: Priority = Priority.BACKGROUND, source: str = "plan") -> list[Ticket]:
        tickets = super().submit(variants, priority, source)
        self._keep_checked()
        return tickets

    def _variants_of(self, found: Iterable[TritonCompileRequest] | Capture) -> list[TritonCompileRequest]:
        autotune_groups = getattr(found, "autotune_groups", None)  # a capture's: what each autotuner benchmarks
        if autotune_groups is not None:
            self.executor.note_autotune_groups(autotune_groups)
        return super()._variants_of(found)

    def load_into_memory(self) -> dict:
        """Every variant planned or replayed so far and on disk, into this process's in-memory caches
        (``load.py``)."""
        from .load import load_into_memory

        return load_into_memory(self.executor.planned_requests()).fields()

    @staticmethod
    def _keep_checked() -> None:
        """What this process found sound, for the next start to check with a few ``stat`` calls."""
        try:
            cache_check.save_checked()
        except Exception:  # an optimisation: the next start checks in full
            log.exception("triton: the entries found sound could not be kept for the next start")

    def _needs_build(self, request: TritonCompileRequest, source: str) -> bool:
        """Not on disk, or damaged there: a damaged entry is removed by the executor's rule (rebuilt once),
        so that planning builds it again ahead instead of the launch that finds it. Records are replayed
        beside the server's start (imports, model build): a pass that reads no file contents, since the
        launch checks each entry in full anyway."""
        entry, damage = cache_check.check(request.predicted_hash, request.name, request.target[1],
                                          thorough=source != "record")
        if entry is cache_check.Entry.DAMAGED:
            return self.executor.remove_damaged(request, damage, then="queued to be built again")
        return entry is cache_check.Entry.MISSING

    # -- records (JIT_AHEAD_RECORD_DIR) -------------------------------------------------------------------
    def _open_records(self) -> dict[str, RecordFolder | None]:
        """Read the matching records of every rank, apply their autotune choices and queue their
        variants at REPLAY (those only benchmarked last)."""
        tuning = self._open_tuning_records()
        try:
            folder = self._replay_variants()
        except Exception:  # records are an optimisation; the autotune choices still serve and are recorded
            log.exception("triton: %s could not be read; no replay, no recording of variants", RECORD_KNOB)
            folder = None
        return {"records": folder, "tuning_records": tuning}

    def record_format(self) -> RecordFormat:
        return record_format(target_of(self.device_view))

    def _replay_variants(self) -> RecordFolder | None:
        folder = record_folder(self.record_format())
        items = folder.read() if folder is not None else []
        replayed = [item.request for item in items if not item.benchmark_only]
        spare = [item.request for item in items if item.benchmark_only]
        tickets = self.submit(replayed, Priority.REPLAY, source="record") if replayed else []
        tickets += self.submit(spare, Priority.SPARE, source="record") if spare else []
        self.stats.emit(events.Replay(family=FAMILY, variants=len(items), benchmark_only=len(spare),
                                      queued=len(tickets), folder=str(folder.folder) if folder else None,
                                      file=str(folder.path) if folder else None))
        if items:
            log.info("triton: replaying %d recorded variants (%d only benchmarked, built last; %d not on "
                     "disk yet) from %s", len(items), len(spare), len(tickets), folder.folder)
        return folder

    def _open_tuning_records(self) -> RecordFolder | None:
        """The autotune choices of earlier starts on this GPU model, for autotuners to answer from."""
        try:
            folder = tuning_folder(autotune.record_format(target_of(self.device_view), self.device_view.name))
            choices = folder.read() if folder is not None else []
            autotune.KNOWN.add(choices, owner=self)
            if self._closing:  # closed while reading: close() may have forgotten this family's choices already
                autotune.KNOWN.forget(self)
            if choices:
                log.info("triton: %d recorded autotune choices from %s", len(choices), folder.folder)
                self.stats.emit(events.ReplayAutotune(family=FAMILY, choices=len(choices),
                                                      file=str(folder.path)))
            return folder
        except Exception:  # an optimisation: the autotuners benchmark as they would without it
            autotune.KNOWN.forget(self)  # no lookup waits for what will not come
            log.exception("triton: recorded autotune choices could not be read; autotuners benchmark")
            return None

    def _record(self, request: TritonCompileRequest) -> None:
        """Every variant this process compiled or loaded, once (the executor's first launch of it)."""
        benchmark = autotune.benchmark_in_progress()
        if benchmark is not None:  # recorded with the autotuner's choice, once it is made
            benchmark.launched.append((request, benchmark.config))
            return
        self._add_record("records", RecordedVariant(request))

    def _record_choice(self, choice: autotune.TuningChoice | None, launched: list) -> None:
        """An autotune choice this process made or loaded from Triton's cache, and the variants its
        benchmark launched first: those of configs it did not choose are benchmark-only."""
        if choice is not None:
            self._add_record("tuning_records", choice)
        if not recording_enabled():  # choices only: no folder keeps variants
            return
        for request, config in launched:
            not_chosen = choice is not None and str(config) != choice.best
            self._add_record("records", RecordedVariant(request, benchmark_only=not_chosen))

    def _add_record(self, kind: str, item) -> None:
        if not is_dotted_name(item.module) or not_importable(item.module, item.qualname):
            return  # a helper (or the next start) could not import it, so it cannot be replayed
        super()._add_record(kind, item)

    def _recordable(self, kind: str, item, folder: RecordFolder) -> bool:
        return kind != "records" or _fits_header(folder, item.request)


def _fits_header(records: RecordFolder, request: TritonCompileRequest) -> bool:
    """Entries carry no target or environment of their own: a variant built for another target or under
    another cache-invalidating environment than the header pins is not recorded."""
    header = records.format.header
    return tuple(header["target"]) == tuple(request.target) and sorted(map(tuple, header["env"])) == sorted(request.env)
