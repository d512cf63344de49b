"""The toy family on the family contract: what a new family writes. It is its own builder module too
(``prepare``/``build``, imported by helpers by name); its FamilyInfo is in ``tests/toy/__init__.py``."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from jit_ahead.core.device_view import DeviceView
from jit_ahead.core.executor import ExecutorBase
from jit_ahead.core.family import Family
from jit_ahead.core.pool import FamilySpec
from jit_ahead.core.records import RecordFormat
from jit_ahead.core.requests import BuildRequest

from . import INFO, dsl


@dataclass(frozen=True)
class ToyRequest:  # the toy's variant (core/variant.py)
    kernel: str
    spec: str
    module: str = "tests.toy.kernels"  # what the report and records call the kernel's module

    qualname = property(lambda self: self.kernel)
    key = property(lambda self: dsl.key(self.kernel, self.spec))
    label = property(lambda self: f"{self.kernel}[{self.spec}]")

    def is_built(self) -> bool:
        return dsl.path_of(self.kernel, self.spec).exists()

    def build_request(self) -> BuildRequest:
        return BuildRequest(INFO.name, self.key, self, self.label, modules=("tests.toy.dsl",))


def prepare(view: DeviceView | None = None) -> dict:  # the builder helpers import: once, then per request
    return {"toy": "ready"}


def build(request: ToyRequest) -> dict:
    return {"path": str(dsl.build(request.kernel, request.spec))}


class ToyExecutor(ExecutorBase):
    family = INFO.name
    build_here = staticmethod(build)

    def on_call(self, kernel: str, spec: str) -> str:
        """The DSL's hook: load the built file, wait for the helper building it, or build it here."""
        request, t0 = ToyRequest(kernel, spec), time.perf_counter()
        if self.recorder is not None:
            self.recorder(request)
        return self.serve_miss(request, t0, built=request.is_built(), dsl="the toy DSL",
                               load=dsl.path_of(kernel, spec).read_text, compile_here=lambda: dsl.compile_here(kernel, spec))


class ToyFamily(Family):
    name, executor_class = INFO.name, ToyExecutor
    spec = FamilySpec(name=INFO.name, builder=__name__, workers_knob="TOY_WORKERS", preload_knob="TOY_PRELOAD")

    def __init__(self, stats, **options) -> None:
        super().__init__(stats, device_view=DeviceView.h200(), env_overrides={dsl.CACHE_KNOB: str(dsl.cache_dir())},
                         **options)

    def _install_hooks(self) -> None:
        dsl.handler = self.executor.on_call

    def _remove_hooks(self) -> None:
        if dsl.handler == self.executor.on_call:
            dsl.handler = None

    def record_format(self) -> RecordFormat:
        return RecordFormat(family=self.name, header={"toy_dsl": 1}, key_of=lambda r: r.key,
                            encode=lambda r: {"kernel": r.kernel, "spec": r.spec},
                            decode=lambda e: ToyRequest(str(e["kernel"]), str(e["spec"])))

    @contextlib.contextmanager
    def capture(self, target=None):
        dsl.capturing = calls = []
        try:
            yield calls
        finally:
            dsl.capturing = None

    def _variants_of(self, found) -> list[ToyRequest]:  # a capture finds (kernel, spec) calls
        return [r if isinstance(r, ToyRequest) else ToyRequest(*r) for r in found]
