"""Variants into this process's in-memory caches before serving: each planned or recorded variant that is on
disk goes through Triton's own ``JITFunction.preload``, so that its first launch while serving is an
in-memory hit: vLLM's JIT monitor counts every in-memory miss after warmup, a load from disk included, as a
compile. The binary still goes onto the GPU at its first launch, as Triton does for every kernel (an engine
that watches those loads, as SGLang's watcher does, needs more than this)."""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from .compile_inputs import on_disk, resolve_kernel, spec_json, target_tuple
from .request import TritonCompileRequest

log = logging.getLogger("jit_ahead.triton")


@dataclass(frozen=True)
class Loaded:
    loaded: int = 0  # brought into memory now
    already: int = 0  # in memory before (launched in warmup, or loaded by tune-ahead)
    not_built: int = 0  # not on disk yet: its first launch waits for the build, as before
    other_target: int = 0  # planned for another GPU
    failed: int = 0  # the kernel could not be imported or Triton refused the entry: its launch loads it

    def fields(self) -> dict:
        return dict(vars(self))


def load_into_memory(requests: Iterable[TritonCompileRequest]) -> Loaded:
    from triton.runtime import driver

    here = target_tuple(driver.active.get_current_target())
    device = driver.active.get_current_device()
    counts = dict.fromkeys(Loaded.__dataclass_fields__, 0)
    first_failure = None  # (label, why) of the first variant that could not be loaded
    for request in requests:
        if tuple(request.target) != here:
            counts["other_target"] += 1
            continue
        if not on_disk(request.predicted_hash, request.name):
            counts["not_built"] += 1
            continue
        try:
            kernel = resolve_kernel(request.module, request.qualname)
            if spec_json(request.specialization_data)["key"] in kernel.device_caches[device][0]:
                counts["already"] += 1
                continue
            kernel.preload(request.specialization_data)
            counts["loaded"] += 1
        except Exception as exc:  # noqa: BLE001 - one variant's load never stops the rest or the server
            counts["failed"] += 1
            first_failure = first_failure or (request.label, f"{type(exc).__name__}: {exc}")
    if first_failure is not None:
        label, why = first_failure
        log.warning("%d variants could not be loaded into memory ahead (the first: %s, %s); each loads at its "
                    "first launch instead", counts["failed"], label, why)
    return Loaded(**counts)
