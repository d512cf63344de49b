"""The plugin's entry point: cheap, idempotent, never raises (a plugin that raises stops vLLM's start)."""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("jit_ahead.engines.vllm")

WORKER_MODULE = "vllm.v1.worker.gpu_worker"
_registered = False


def enabled(environ=os.environ) -> bool:
    """``JIT_AHEAD`` is on and this is not one of jit_ahead's own helper processes."""
    return environ.get("JIT_AHEAD", "").strip() not in ("", "0") and environ.get("JIT_AHEAD_HELPER") != "1"


def register() -> None:
    """vLLM's ``load_general_plugins`` calls this in each of its processes."""
    global _registered
    if _registered or not enabled():
        return
    _registered = True
    try:
        if WORKER_MODULE in sys.modules:
            _hook_worker()
        else:
            from ...autostart import _AfterImport

            sys.meta_path.insert(0, _AfterImport((WORKER_MODULE,), _hook_worker))
    except Exception as exc:  # noqa: BLE001 - the server starts without jit_ahead's hooks rather than not at all
        log.warning("jit_ahead's vLLM plugin could not be registered (%s: %s); vLLM runs without it",
                    type(exc).__name__, exc)


def _hook_worker() -> None:
    try:
        from . import worker

        worker.install()
    except Exception as exc:  # noqa: BLE001 - as above
        log.warning("jit_ahead could not hook vLLM's worker (%s: %s); vLLM runs without it", type(exc).__name__, exc)
