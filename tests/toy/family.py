"""The toy family on the family contract: what a new family writes. It is its own builder module too
(``build``, imported by helpers by name); its FamilyInfo is in ``tests/toy/__init__.py``."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from jit_ahead.core.family import (AttributeHook, DeviceView, ExecutorBase, Family, FamilySpec, RecordFormat,
                                   VariantBase, dataclass_format)

from . import INFO, dsl


@dataclass(frozen=True)
class ToyRequest(VariantBase):  # the toy's variant (core/requests.py)
    kernel: str
    spec: str
    module: str = "tests.toy.kernels"  # what the report and records call the kernel's module
    family, build_modules = INFO.name, ("tests.toy.dsl",)  # helpers import the DSL to build it

    qualname = property(lambda self: self.kernel)
    key = property(lambda self: dsl.key(self.kernel, self.spec))
    label = property(lambda self: f"{self.kernel}[{self.spec}]")

    def is_built(self) -> bool:
        return dsl.path_of(self.kernel, self.spec).exists()


def build(request: ToyRequest) -> dict:  # the builder helpers import calls this per request
    return {"path": str(dsl.build(request.kernel, request.spec))}


class ToyExecutor(ExecutorBase):
    family, dsl = INFO.name, "the toy DSL"

    def on_miss(self, kernel: str, spec: str) -> str:
        """The DSL's hook: load the built file, wait for the helper building it, or build it here."""
        request = ToyRequest(kernel, spec)
        return self.serve_miss(request, built=request.is_built(), load=dsl.path_of(kernel, spec).read_text,
                               compile_here=lambda: dsl.compile_here(kernel, spec))


class ToyFamily(Family):
    name, executor_class, hook = INFO.name, ToyExecutor, AttributeHook(dsl, "handler")
    spec = FamilySpec(name=INFO.name, builder=__name__, workers_knob="TOY_WORKERS", preload_knob="TOY_PRELOAD")

    def __init__(self, stats, **options) -> None:
        super().__init__(stats, device_view=DeviceView.h200(), env_overrides={dsl.CACHE_KNOB: str(dsl.cache_dir())},
                         **options)

    def record_format(self) -> RecordFormat:
        return dataclass_format(self.name, {"toy_dsl": 1}, ToyRequest)

    @contextlib.contextmanager
    def capture(self, target=None):
        dsl.capturing = calls = []
        try:
            yield calls
        finally:
            dsl.capturing = None

    def _variants_of(self, found) -> list[ToyRequest]:  # a capture finds (kernel, spec) calls
        return [r if isinstance(r, ToyRequest) else ToyRequest(*r) for r in found]
