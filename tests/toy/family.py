"""The toy family on the family contract: what a third family writes (about as much as this file).

It is its own builder module too (``prepare``/``build``), as helpers import it by name; its FamilyInfo is
in ``tests/toy/__init__.py``.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from jit_ahead.core import events, knobs
from jit_ahead.core.device_view import DeviceView
from jit_ahead.core.executor import ExecutorBase, Outcome, kernel_of
from jit_ahead.core.family import Family
from jit_ahead.core.pool import FamilySpec, HelperPool
from jit_ahead.core.priority import Priority
from jit_ahead.core.records import RecordFormat, RecordFolder, record_folder
from jit_ahead.core.requests import BuildRequest
from jit_ahead.core.table import RequestTable

from . import INFO, dsl

FAMILY = INFO.name
SPEC = FamilySpec(name=FAMILY, builder="tests.toy.family", workers_knob="TOY_WORKERS", preload_knob="TOY_PRELOAD")


@dataclass(frozen=True)
class ToyRequest:
    kernel: str
    spec: str
    module: str = "tests.toy.kernels"  # what the report and records call the kernel's module

    @property
    def qualname(self) -> str:
        return self.kernel

    @property
    def key(self) -> str:
        return dsl.key(self.kernel, self.spec)

    @property
    def label(self) -> str:
        return f"{self.kernel}[{self.spec}]"

    def build_request(self) -> BuildRequest:
        return BuildRequest(FAMILY, self.key, self, self.label, modules=("tests.toy.dsl",))


# -- the builder helpers import ------------------------------------------------------------------------------
def prepare(view: DeviceView | None = None) -> dict:
    return {"toy": "ready"}


def build(request: ToyRequest) -> dict:
    return {"path": str(dsl.build(request.kernel, request.spec))}


# -- the executor side -----------------------------------------------------------------------------------------
class ToyExecutor(ExecutorBase):
    family = FAMILY
    build_here = staticmethod(build)

    @staticmethod
    def key_of(request: ToyRequest) -> str:
        return request.key

    def on_call(self, kernel: str, spec: str) -> str:
        """The DSL's hook: load the built file, wait for the helper building it, or build it here."""
        t0 = time.perf_counter()
        request = ToyRequest(kernel, spec)
        if self.recorder is not None:
            self.recorder(request)
        if dsl.path_of(kernel, spec).exists():
            outcome = "disk"
        else:
            if self.guarding() and not self.building_ahead(request.key):
                self.report_unplanned(request.label, request.key, f"{request.label} was not planned and needs "
                                      "a build after serving started")
            result, _ = self.obtain(request.build_request(), build)
            outcome = result.value
        self.stats.emit(events.ExecutorMiss(family=FAMILY, key=request.key, label=request.label,
                                            kernel=kernel_of(request), outcome=outcome,
                                            planned=self.is_planned(request.key), seconds=time.perf_counter() - t0))
        if outcome == Outcome.FALLBACK.value:
            return dsl.compile_here(kernel, spec)
        return dsl.path_of(kernel, spec).read_text()


# -- the family --------------------------------------------------------------------------------------------------
def _record_format() -> RecordFormat:
    return RecordFormat(family=FAMILY, header={"toy_dsl": 1}, key_of=lambda r: r.key,
                        encode=lambda r: {"kernel": r.kernel, "spec": r.spec},
                        decode=lambda e: ToyRequest(str(e["kernel"]), str(e["spec"])))


class ToyFamily(Family):
    name = FAMILY

    def __init__(self, stats, *, workers: int | None = None, wait_timeout: float | None = None,
                 preload: tuple[str, ...] | None = None) -> None:
        table = RequestTable()
        pool = HelperPool.from_knobs(SPEC, stats, table, workers=workers, device_view=DeviceView.h200(),
                                     env_overrides={dsl.CACHE_KNOB: str(dsl.cache_dir())})
        super().__init__(stats, table, pool, ToyExecutor(pool, table, stats, knobs.wait_timeout_s(wait_timeout),
                                                         guard=knobs.guard_mode()))

    def _install_hooks(self) -> None:
        dsl.handler = self.executor.on_call

    def _remove_hooks(self) -> None:
        if dsl.handler == self.executor.on_call:
            dsl.handler = None

    def _start_recording(self) -> None:
        self.executor.recorder = lambda request: self._add_record("records", request)

    def _open_records(self) -> dict[str, RecordFolder | None]:
        folder = record_folder(_record_format())
        items = folder.read() if folder is not None else []
        tickets = self.submit(items, Priority.REPLAY, source="record") if items else []
        self.stats.emit(events.Replay(family=FAMILY, variants=len(items), queued=len(tickets)))
        return {"records": folder}

    @contextlib.contextmanager
    def capture(self, target=None) -> Iterator[list]:
        calls: list = []
        dsl.capturing = calls
        try:
            yield calls
        finally:
            dsl.capturing = None

    def submit(self, requests: Iterable, priority: Priority = Priority.BACKGROUND, source: str = "plan") -> list:
        requests = [r if isinstance(r, ToyRequest) else ToyRequest(*r) for r in requests]
        self.executor.note_planned(requests, source)
        missing = [r for r in requests if not dsl.path_of(r.kernel, r.spec).exists()]
        return [self.pool.submit(r.build_request(), priority) for r in missing]

    def plan_header(self) -> dict:
        return {"toy_dsl": 1}

    def plan_encode(self, request: ToyRequest) -> dict:
        return {"kernel": request.kernel, "spec": request.spec}

    def plan_decode(self, entry: dict) -> ToyRequest:
        return ToyRequest(str(entry["kernel"]), str(entry["spec"]))
