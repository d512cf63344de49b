"""jit_ahead in a vLLM worker: the session follows the worker's start.

Hooks (vLLM 0.25.x; another version gets one line and no hook, and records of earlier starts still replay):
- the model is built (``initialize_model`` in the model loader, before its weights load): the session
  starts there and plans the model within the worker's limits with the planners of vLLM's own kernel
  modules (``providers()``), so that planning and builds run while the weights load; what those do not
  plan is built ahead at the next start where records are kept (``JIT_AHEAD_RECORD_DIR``);
- ``Worker.compile_or_warm_up_model``, before: the session is waited on as ``JIT_AHEAD_READY`` says
  (at most ``JIT_AHEAD_VLLM_READY_TIMEOUT_S``, default 300 s: vLLM's engine waits 600 s for all of its
  start), so vLLM's dummy runs, kernel warmups and CUDA-graph capture find the builds on disk;
- ``vllm.utils.jit_monitor.activate`` (the end of warmup), before: every planned or replayed variant that
  is built goes into Triton's in-memory caches (the monitor fires on every in-memory miss, a load from
  disk included), then the session marks serving (its tune-ahead runs there), so what both do is warmup
  to vLLM's JIT monitor, not a miss;
- vLLM's Inductor adaptors point ``TRITON_CACHE_DIR`` at a folder of the compiled model's own at the first
  ``torch.compile`` (after the profile run, when helpers have built into the folder set at start): with
  jit_ahead on, the folder set at start is kept, so the helpers' builds and vLLM's kernels share one cache.

A hook never stops vLLM: what fails in jit_ahead's part is logged and the worker goes on.
"""
from __future__ import annotations

import functools
import logging
import os

from ...core.knobs import env_seconds

log = logging.getLogger("jit_ahead.engines.vllm")

KNOWN_VERSIONS = ("0.25.",)
READY_TIMEOUT_KNOB = "JIT_AHEAD_VLLM_READY_TIMEOUT_S"
_MARK = "_jit_ahead_vllm_hook"


def known(version: str) -> bool:
    return version.startswith(KNOWN_VERSIONS)


def install() -> bool:
    """Hook vLLM's worker once (``plugin`` calls this after ``vllm.v1.worker.gpu_worker`` is imported);
    False, with one line, for a vLLM this module does not know."""
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if not known(version):
        log.warning("vLLM %s is not a version jit_ahead's plugin knows (%s): its worker is not hooked, so the "
                    "model is not planned at start; variants recorded by earlier starts (JIT_AHEAD_RECORD_DIR) "
                    "still replay", version, ", ".join(v + "x" for v in KNOWN_VERSIONS))
        return False
    from vllm.compilation import compiler_interface
    from vllm.model_executor.model_loader import base_loader
    from vllm.utils import jit_monitor
    from vllm.v1.worker import gpu_worker

    _hook(base_loader, "initialize_model", _after(_after_model_built))
    _hook(gpu_worker.Worker, "compile_or_warm_up_model", _before(_before_warmup))
    _hook(jit_monitor, "activate", _before(_before_monitor))
    for adaptor in ("InductorAdaptor", "InductorStandaloneAdaptor"):
        cls = getattr(compiler_interface, adaptor, None)
        if cls is not None:
            _hook(cls, "initialize_cache", _keeping_triton_cache)
    log.debug("jit_ahead hooked vLLM %s's worker", version)
    return True


def _hook(owner, name: str, around) -> None:
    """``owner.name`` becomes ``around(original)`` (marked, with the original's name and docstring); never
    twice on one attribute."""
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return
    hooked = functools.wraps(original)(around(original))
    setattr(hooked, _MARK, True)
    setattr(owner, name, hooked)


def _before(hook):
    """Runs ``hook`` with the original's arguments, then the original."""
    def around(original):
        def hooked(*args, **kwargs):
            _guarded(hook, *args, **kwargs)
            return original(*args, **kwargs)
        return hooked
    return around


def _after(hook):
    """Runs the original, then ``hook`` with its result and the original's arguments."""
    def around(original):
        def hooked(*args, **kwargs):
            result = original(*args, **kwargs)
            _guarded(hook, result, *args, **kwargs)
            return result
        return hooked
    return around


def _guarded(hook, *args, **kwargs) -> None:
    try:
        hook(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - jit_ahead is an optimisation: vLLM goes on without this step
        log.warning("jit_ahead's %s hook failed (%s: %s); vLLM goes on without it", hook.__name__,
                    type(exc).__name__, exc)


def _session():
    """The process's session, started now if it was put off until the first compile."""
    import jit_ahead

    return jit_ahead.current()


def providers(vllm_config=None) -> list:
    """The providers a vLLM model is planned with: those of vLLM's kernel modules (``vllm_config``: the
    worker's; None, the current one). transformers' model planner is not among them: a vLLM forward needs
    the engine's forward context and CUDA ops."""
    from ...providers.vllm_attention import VllmTritonAttentionProvider
    from ...providers.vllm_flashinfer_attention import VllmFlashInferAttentionProvider
    from ...providers.vllm_fused_moe import VllmFusedMoEProvider
    from ...providers.vllm_mhc import VllmMhcProvider
    from ...providers.vllm_sampler import VllmFlashInferSamplerProvider
    from ...providers.vllm_spec_decode import VllmSpecDecodeProvider

    return [VllmFusedMoEProvider(), VllmTritonAttentionProvider(vllm_config), VllmMhcProvider(),
            VllmFlashInferAttentionProvider(vllm_config), VllmFlashInferSamplerProvider(vllm_config),
            VllmSpecDecodeProvider(vllm_config)]


def _after_model_built(model, *args, vllm_config=None, **kwargs) -> None:
    from .limits import limits_from

    session = _session()
    if session is None or vllm_config is None:
        return
    limits = limits_from(vllm_config)
    log.info("jit_ahead: vLLM built %s; planning it within %s while its weights load", type(model).__name__, limits)
    session.plan_model(model, limits, providers=providers(vllm_config))


def _before_warmup(worker, *args, **kwargs) -> None:
    session = _session()
    if session is None:
        return
    timeout = env_seconds(READY_TIMEOUT_KNOB, 300.0, minimum=0.0)
    if not session.wait_ready(timeout):
        log.warning("jit_ahead was not ready within %s=%.0f s; vLLM's warmup goes on, and what is not built "
                    "yet compiles where it is launched", READY_TIMEOUT_KNOB, timeout)


def _before_monitor(*args, **kwargs) -> None:
    session = _session()
    if session is not None:
        session.load_into_memory()  # the monitor counts a load from disk as a compile
        session.mark_serving()


def _keeping_triton_cache(original):
    """vLLM's ``initialize_cache``, with ``TRITON_CACHE_DIR`` put back as it was after it (set to the same
    folder, or unset: Triton's default folder)."""
    def initialize_cache(self, *args, **kwargs):
        kept = os.environ.get("TRITON_CACHE_DIR")
        try:
            return original(self, *args, **kwargs)
        finally:
            moved = os.environ.get("TRITON_CACHE_DIR")
            if moved != kept:
                if kept is None:
                    os.environ.pop("TRITON_CACHE_DIR", None)
                else:
                    os.environ["TRITON_CACHE_DIR"] = kept
                log.info("jit_ahead keeps Triton's cache in %s (vLLM's %s would move it to %s, away from the "
                         "builds made so far)", kept or "Triton's default folder", type(self).__name__, moved)
    return initialize_cache
