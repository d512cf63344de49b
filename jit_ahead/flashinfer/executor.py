"""The executor side of the FlashInfer family: a module an op asks for loads from FlashInfer's JIT folder
when a helper built it (no ninja, no nvcc: the library is loaded as ``build_and_load`` would load it), is
waited for while a helper builds it, or is built in place with the helpers' own build."""
from __future__ import annotations

from ..core.building.executor import ExecutorBase
from .request import FAMILY, FlashInferModule


class FlashInferExecutor(ExecutorBase):
    family, dsl = FAMILY, "FlashInfer"

    def on_miss(self, spec, module: FlashInferModule, in_place):
        """The hook's handler, for ``spec.build_and_load()`` (``module``: its variant); ``in_place`` is
        FlashInfer's own."""
        return self.serve_miss(module, built=module.is_built(), load=lambda: spec.load(spec.jit_library_path),
                               compile_here=in_place)
