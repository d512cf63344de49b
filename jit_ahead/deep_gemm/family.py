"""The DeepGEMM family: kernels DeepGEMM compiled in an earlier run are recorded, and rebuilt by CPU-only
helpers at the next start, on this machine or another (``JIT_AHEAD_RECORD_DIR``).

DeepGEMM's JIT runs inside its C++ extension, where nothing can be hooked from Python: the server's own
compiles are seen after the fact, as new committed entries of DeepGEMM's writable cache root between the
session's start and its close, and each becomes a record (its ``kernel.cu`` and ``meta.json``). A record is
rebuilt only where it gives the very entry the server's DeepGEMM looks for (``rebuild.py``). Planning the
kernels of a model ahead needs DeepGEMM's heuristics to run without a GPU (a patch; not here yet), so this
family plans nothing: its variants come from records only.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from ..core.building.executor import ExecutorBase
from ..core.family import Family
from ..core.building.pool import FamilySpec
from ..core.records import RecordFormat
from ..registry import workers_knob
from . import build, disk_cache
from .rebuild import FAMILY, RecordedKernel

log = logging.getLogger("jit_ahead.deep_gemm")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.deep_gemm.build", workers_knob=workers_knob(FAMILY),
                  preload_knob="JIT_AHEAD_DEEP_GEMM_PRELOAD")


RECORD_FORMAT = RecordFormat(family=FAMILY, header={"deep_gemm_records": 1}, key_of=lambda r: r.entry,
                             encode=RecordedKernel.to_json, decode=RecordedKernel.from_json)


class DeepGemmExecutor(ExecutorBase):
    """No launch reaches it (DeepGEMM cannot be hooked): it builds what is queued in place when the family
    has no helpers (``wait_ready``)."""

    family = FAMILY
    key_of = staticmethod(lambda record: record.entry)


class DeepGemmFamily(Family):
    name, spec, executor_class = FAMILY, SPEC, DeepGemmExecutor

    def __init__(self, stats, **options) -> None:
        build.include_dirs()  # ImportError where DeepGEMM kernels cannot be rebuilt: the family is left out
        build.nvcc()
        super().__init__(stats, **options)
        self._entries_at_start: set[str] = set()

    def start(self) -> None:
        self._entries_at_start = disk_cache.committed_entries(disk_cache.cache_roots()[0])
        super().start()
        log.info("deep_gemm: %d helpers, cache %s", self.pool.workers, disk_cache.cache_roots()[0])

    # -- records: the server's own compiles, seen in DeepGEMM's cache --------------------------------------------
    def _remove_hooks(self) -> None:
        if self._replay_thread is not None:  # recording: what DeepGEMM compiled since the start
            self._record_new_entries()

    def _record_new_entries(self) -> None:
        root = disk_cache.cache_roots()[0]
        for name in sorted(disk_cache.committed_entries(root) - self._entries_at_start):
            try:
                self._add_record("records", RecordedKernel.from_entry(root / "cache" / name))
            except (OSError, ValueError, KeyError) as exc:  # not an entry of DeepGEMM's own making
                log.warning("deep_gemm: cache entry %s cannot be recorded (%s: %s)", name, type(exc).__name__, exc)

    def record_format(self) -> RecordFormat:
        return RECORD_FORMAT

    @contextlib.contextmanager
    def capture(self, target=None) -> Iterator[list]:
        """Nothing of DeepGEMM is planned by capture (its kernels come from records)."""
        yield []
