"""The FlashInfer family: its pool, its hook on ``JitSpec.build_and_load`` and its executor side.

Enabled with ``Session(families=("triton", "flashinfer"))`` or ``JIT_AHEAD_FAMILIES=triton,flashinfer``;
needs ``pip install jit_ahead[flashinfer]``, and nvcc for the helpers' builds (``toolchain.py``: what a
CPU-only helper is given to build for the server's GPU). Helpers build into FlashInfer's JIT folder as this
process resolves it (``FLASHINFER_WORKSPACE_BASE``, FlashInfer's version and the target archs). With
``JIT_AHEAD_RECORD_DIR`` it records each module the server loads and builds it ahead at the next start.
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..core.building.pool import FamilySpec
from ..core import device_view
from ..core.family import Family
from ..core.observing.stats import Stats
from ..core.records import RecordFormat, dataclass_format
from ..registry import workers_knob
from . import hook, toolchain
from .executor import FlashInferExecutor
from .plan import capture
from .request import FAMILY, FlashInferModule

log = logging.getLogger("jit_ahead.flashinfer")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.flashinfer.build", workers_knob=workers_knob(FAMILY),
                  preload_knob="JIT_AHEAD_FLASHINFER_PRELOAD")


class FlashInferFamily(Family):
    name, spec, executor_class, hook = FAMILY, SPEC, FlashInferExecutor, hook

    def __init__(self, stats: Stats, *, preload: tuple[str, ...] | None = None, **options) -> None:
        import flashinfer  # the library (jit_ahead[flashinfer]); without it the family is not available
        from flashinfer.jit import env

        if toolchain.nvcc() is None:  # nothing could build a module, here or in a helper
            raise ImportError("no nvcc (CUDA_HOME, the PATH, /usr/local/cuda): FlashInfer's modules cannot be "
                              "built; FlashInfer builds and loads them as it would without jit_ahead")

        self.version = flashinfer.__version__
        self.jit_dir = str(env.FLASHINFER_JIT_DIR)  # helpers build where this process loads from
        view = device_view.current()  # the server's GPU, or the embedded default on a machine without one
        helpers = toolchain.helper_environment(view.capability, Path(env.FLASHINFER_WORKSPACE_DIR) / "jit_ahead")
        super().__init__(stats, preload=("flashinfer", *(preload or ())), device_view=view, env_overrides=helpers,
                         **options)

    def start(self) -> None:
        super().start()
        log.info("flashinfer: %d helpers, JIT folder %s", self.pool.workers, self.jit_dir)

    def enter_planner(self) -> None:
        hook.enter_planner()

    def capture(self, target=None):
        return capture(target)

    def record_format(self) -> RecordFormat:
        return dataclass_format(self.name, {"flashinfer": self.version}, FlashInferModule)
