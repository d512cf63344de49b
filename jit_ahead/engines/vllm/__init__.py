"""``JIT_AHEAD=1 vllm serve ...``: the vLLM plugin (entry point ``vllm.general_plugins: jit_ahead``).

vLLM calls :func:`register` in every process it starts (the API server, each engine core, each worker, the
short-lived model inspection). It does nothing unless ``JIT_AHEAD`` is on, and imports nothing of vLLM
itself: the worker's hooks go in once ``vllm.v1.worker.gpu_worker`` is imported (``worker.py``), so a
process that builds no model pays nothing. What the hooks do, and the versions they know, are in
``worker.py``; the limits a worker serves within come from its ``VllmConfig`` (``limits.py``).
"""
from __future__ import annotations

from .plugin import register

__all__ = ["register"]
