"""The one place jit_ahead enters FlashInfer: ``JitSpec.build_and_load``, which every FlashInfer op reaches
for its module (through a ``functools.cache``d ``get_*_module``: once per module and process).

In a thread that is capturing (a ContextVar) the call becomes a request and raises ``Captured``: the op
stops there, and nothing is built or cached. Elsewhere the executor's handler decides: the module built and
stamped loads; one a helper is building is waited for; one not planned is built in place. A module of
FlashInfer's AOT folder, or one jit_ahead cannot carry to a helper, is FlashInfer's. Any trouble in
jit_ahead's part, and FlashInfer builds and loads it as it would without jit_ahead.
"""
from __future__ import annotations

import contextvars
import logging

from ..core.building.executor import JitAfterReadyError
from ..core.shared_patch import SharedPatch, swap_in, swap_out
from .request import FlashInferModule, Unsupported

log = logging.getLogger("jit_ahead.flashinfer")

capturing: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_flashinfer_capture", default=None)

_original = None
_in_planner = False  # a planner process: nothing is built outside a capture
_unsupported: set[str] = set()  # modules said to be FlashInfer's own (one line each)


class Captured(Exception):
    """Raised from ``build_and_load`` inside a capture once its request is recorded."""

    def __init__(self, request: FlashInferModule) -> None:
        super().__init__(f"captured {request.label} (jit_ahead planning: nothing was built)")
        self.request = request


def _module_of(spec) -> tuple[FlashInferModule | None, str]:
    """The module jit_ahead builds for ``spec``, or None and why it is FlashInfer's own (a spec that is not
    an nvcc module, or has fields a helper cannot be given: one line each)."""
    try:
        return FlashInferModule.of(spec), ""
    except Unsupported as exc:
        if spec.name not in _unsupported:
            _unsupported.add(spec.name)
            log.info("FlashInfer's module %s is left to FlashInfer (%s)", spec.name, exc)
        return None, str(exc)


def _build_and_load(self):
    if getattr(self, "is_aot", False):  # prebuilt, installed with FlashInfer: nothing to plan or build
        return _original(self)
    module, why = _module_of(self)
    collector = capturing.get()
    if collector is not None:
        if module is None:  # nothing a helper could build: planning must not build it here either
            raise RuntimeError(f"FlashInfer's module {self.name} is not planned: {why}")
        collector.record(module)
        raise Captured(module)
    if module is None:
        return _original(self)
    if _in_planner:  # another family's capture met it: a planner builds nothing (minutes of nvcc)
        raise RuntimeError(f"FlashInfer's module {self.name} asked for outside a FlashInfer capture in a planner; "
                           "not built here")
    handler = _patch.handler
    if handler is None:
        return _original(self)
    built = False

    def in_place():
        nonlocal built
        built = True
        return _original(self)

    try:
        return handler(self, module, in_place)
    except JitAfterReadyError:  # JIT_AHEAD_MODE=error: the engine asked for this build to fail
        raise
    except Exception:  # never break the caller: FlashInfer builds and loads it as it would without jit_ahead
        if built:  # FlashInfer's own build failed: its error is the caller's, and a second try would fail alike
            raise
        log.exception("jit_ahead could not handle FlashInfer's module %s; FlashInfer builds it in place", self.name)
        return _original(self)


def _patch_dsl() -> None:
    global _original
    from flashinfer.jit.core import JitSpec

    _original = swap_in(JitSpec, "build_and_load", _build_and_load, _original)


def _unpatch_dsl() -> None:
    from flashinfer.jit.core import JitSpec

    swap_out(JitSpec, "build_and_load", _build_and_load, _original)


_patch: SharedPatch = SharedPatch(_patch_dsl, _unpatch_dsl)


def install(handler=None) -> None:
    _patch.hold(handler)


def release(handler=None) -> None:
    _patch.let_go(handler)


def enter_planner() -> None:
    """In a planner forked from the server: its executor's handler stays behind, and a module asked for
    outside a FlashInfer capture (another family's planning met a FlashInfer op) is not built."""
    global _in_planner
    _patch.handler = None
    _in_planner = True
