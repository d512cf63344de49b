"""The executor side: what an in-memory miss does before Triton's own ``compile()`` runs.

The hook's call becomes a request whose disk hash is predicted (``request.py``); the cache check says whether
that entry is there, intact. Then the shared miss path (``ExecutorBase.serve_miss``): on disk, nothing to
do, Triton loads it; otherwise the guard, and the pool's answer: wait for the helper that builds it (raised
to URGENT), or build it in place on this thread, whichever is faster by measurement; a helper that dies
releases its claim and the launch builds in place at once. A miss of one config of an autotuned
launch raises the planned configs of that launch with it: the autotuner benchmarks them next. Either way
Triton then loads the finished entry from disk. Failures fall back to Triton's normal in-place compile.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict

from triton import knobs

from ..core.observing import events
from ..core.building.executor import ExecutorBase, JitAfterReadyError, kernel_of, refuse_fallback_if_strict
from ..core.building.pool import HelperPool
from ..core.observing.stats import Stats
from ..core.priority import Priority
from . import cache_check
from .cache_check import Entry
from .request import request_from_hook
from .variant_diff import nearest

log = logging.getLogger("jit_ahead.triton.executor")


def build_in_place(request) -> dict:
    from .build import compile_request

    compiled, found = compile_request(request)
    return {"hash": compiled.hash, "compiled": not found}


class TritonExecutor(ExecutorBase):
    """Handles the executor's misses for one pool."""

    family, dsl = "triton", "Triton"
    build_here = staticmethod(build_in_place)  # a helper's build without the launcher it prebuilds

    def __init__(self, pool: HelperPool, stats: Stats, wait_timeout: float, guard: str = "warn") -> None:
        super().__init__(pool, stats, wait_timeout, guard)
        self._specializations: dict[str, dict[str, None]] = defaultdict(dict)  # kernel -> its planned variants' JSON
        self._previous_listener = None  # Triton's compilation listener before ours
        self._damaged: set[str] = set()  # variants whose cache entry was found damaged (and removed)
        # variant -> the autotuned launches (their variants, in config order) it was planned in
        self._autotune_groups: dict[str, list[tuple[str, ...]]] = defaultdict(list)

    def _take_new(self, request) -> bool:
        # one variant per specialization of a kernel: what ``explain`` compares an unplanned one against
        variants = self._specializations[kernel_of(request)]
        if request.specialization_data in variants:
            return False
        variants[request.specialization_data] = None
        self._planned[request.predicted_hash] = request
        return True

    def _variant_fields(self, request) -> dict:
        return {"spec": request.specialization_data}

    def explain(self, request) -> str:
        """How an unplanned variant differs from the nearest planned variant of its kernel."""
        with self._lock:
            planned = list(self._specializations.get(kernel_of(request), ()))
        if not planned:
            return "no variant of this kernel was planned"
        try:
            best, diff = nearest(request.specialization_data, planned)
        except (ValueError, TypeError, AttributeError) as exc:  # never lets the guard itself fail
            return f"what differs is unknown ({type(exc).__name__}: {exc})"
        if best is None:
            return "no planned variant of this kernel could be compared"
        return "nearest planned variant differs in " + "; ".join(diff) if diff else "it was planned"

    def remove_damaged(self, request, damage: str, then: str = "building it again") -> bool:
        """A damaged entry (found at a launch, or by planning: ``then`` says what follows) is removed; the
        first time, its variant is then built again like any miss (True), after that Triton's own compile
        rebuilds it (False): a cache that damages what it is given is not worked around forever."""
        key = request.predicted_hash
        with self._lock:
            first = key not in self._damaged
            self._damaged.add(key)
        cache_check.remove(key)
        self.stats.emit(events.CacheDamaged(family="triton", key=key, label=request.label, reason=damage,
                                            rebuilt=first))
        if first:
            self.table.forget_done(key)
            log.warning("%s: its Triton cache entry %s is damaged (%s); removed, %s",
                        request.label, key[:16], damage, then)
        else:
            log.error("%s: its Triton cache entry %s is damaged again after a rebuild (%s); removed, Triton "
                      "compiles it in place", request.label, key[:16], damage)
        return first

    def unplanned_message(self, request) -> str:
        planning = ("planning had finished" if self.planning_finished()
                    else "planning was still running, so it may have come later")
        return (f"{request.label} was not planned and needs a build after serving started (key "
                f"{request.predicted_hash[:16]}; {planning}): {self.explain(request)}")

    def note_autotune_groups(self, groups) -> None:
        """Remember which planned variants an autotuner benchmarks together (Capture.autotune_groups)."""
        with self._lock:
            for group in groups:
                for key in group:
                    if group not in self._autotune_groups[key]:
                        self._autotune_groups[key].append(group)

    def _before_wait(self, request) -> dict:
        """Raise the autotune siblings of a miss; an unplanned variant's specialization goes to the stats
        log, where the report compares it with the planned ones."""
        planned = self.is_planned(request.predicted_hash)
        return {"siblings_raised": self._raise_autotune_siblings(request),
                "spec": None if planned else request.specialization_data}

    def _raise_autotune_siblings(self, request) -> int:
        """A miss inside an autotuner's benchmark: it is about to launch the other configs of this tuning
        key one after another, each waiting for its build. Raise them all to URGENT now, the missed one
        first, so that helpers build them side by side instead of one per benchmark step."""
        with self._lock:
            groups = self._autotune_groups.get(request.predicted_hash)
            if not groups:
                return 0
            keys = [request.predicted_hash] + [key for group in groups for key in group]
        return self.table.raise_queued(dict.fromkeys(keys), Priority.URGENT)

    def listen_to_compiles(self) -> None:
        """Be Triton's compilation listener (the one there before is called first): one ``compile`` event per
        ``compile()`` of this process, a disk hit or a real compile."""
        self._previous_listener = knobs.compilation.listener
        knobs.compilation.listener = self.on_compile

    def stop_listening_to_compiles(self) -> None:
        if knobs.compilation.listener == self.on_compile:
            knobs.compilation.listener = self._previous_listener

    def on_compile(self, *, src, metadata, metadata_group, times, cache_hit, **kwargs) -> None:
        previous = self._previous_listener
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit,
                     **kwargs)
        micros = [getattr(times, "ir_initialization", 0) or 0, getattr(times, "store_results", 0) or 0,
                  *(d for _, d in getattr(times, "lowering_stages", None) or ())]
        self.stats.emit(events.Compile(family="triton", kernel=getattr(src, "name", "?"), key=metadata.get("hash"),
                                       cache_hit=bool(cache_hit), seconds=sum(micros) / 1e6))

    def on_miss(self, *, fn, compile: dict) -> None:
        """The hook's miss handler. If handling the miss fails, the launch compiles the DSL's way (the
        hook logs why), unless ``refuse_fallback_if_strict`` refuses it."""
        try:
            self._on_miss(fn, compile)
        except JitAfterReadyError:
            raise
        except Exception as exc:
            refuse_fallback_if_strict(self.guard, self.stats.phase, str(getattr(fn, "name", fn)), exc)
            raise

    def _on_miss(self, fn, compile: dict) -> None:
        t0 = time.perf_counter()
        request = request_from_hook(fn, compile)
        entry, damage = cache_check.check(request.predicted_hash, request.name, request.target[1])
        if entry is Entry.DAMAGED and not self.remove_damaged(request, damage):
            # damaged again after its rebuild: removed, and Triton's own compile makes it anew
            self.record_met(request)
            self.stats.emit(events.ExecutorMiss(family="triton", key=request.predicted_hash, label=request.label,
                                                kernel=kernel_of(request), outcome="damaged",
                                                seconds=time.perf_counter() - t0))
            return
        # Triton loads the entry from disk, or compiles it itself if no build came
        self.serve_miss(request, built=entry is Entry.OK, t0=t0, rebuilding=entry is Entry.DAMAGED)
