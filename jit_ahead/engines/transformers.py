"""``JIT_AHEAD=1`` with transformers: every model built by ``from_pretrained`` or ``from_config`` (the
``Auto*`` classes and each model class's own) is planned when it is returned, within the limits of the
``JIT_AHEAD_MAX_*`` knobs (``knobs.engine_limits``), by the built-in providers and the model planner.

Covered: ``PreTrainedModel.from_pretrained`` and ``PreTrainedModel._from_config`` (what
``AutoModel*.from_config`` and ``Model.from_config`` call). Not covered: a model class called directly
(``Qwen3ForCausalLM(config)``); an engine that builds its models so calls ``jit_ahead.current().plan_model``
itself. A model built inside another's construction is planned as part of the outer one only.
``JIT_AHEAD_PLAN_MODELS=off`` turns the hook off.
"""
from __future__ import annotations

import functools
import logging
import threading

log = logging.getLogger("jit_ahead.engines.transformers")

_building = threading.local()
_installed = False


def install() -> None:
    """Wrap transformers' model builders once; idempotent, never raises."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from transformers import PreTrainedModel
    except Exception as exc:  # noqa: BLE001 - a broken transformers install: the server goes on without the hook
        log.warning("transformers could not be imported (%s: %s); its models are not planned", type(exc).__name__, exc)
        return
    for name in ("from_pretrained", "_from_config"):
        original = getattr(PreTrainedModel, name)
        setattr(PreTrainedModel, name, classmethod(_planning_after(original.__func__)))


def _planning_after(build):
    @functools.wraps(build)
    def wrapper(cls, *args, **kwargs):
        depth = getattr(_building, "depth", 0)
        _building.depth = depth + 1
        try:
            model = build(cls, *args, **kwargs)
        finally:
            _building.depth = depth
        if depth == 0:
            plan(model)
        return model

    return wrapper


def plan(model) -> None:
    """Plan ``model`` in the current session (started now if Triton was not imported yet); logs and
    returns on any failure."""
    try:
        import torch

        if not isinstance(model, torch.nn.Module):
            return
        from ..core import knobs
        from ..session import current

        session = current()
        if session is None:
            from ..autostart import start_session

            session = start_session()
        if session is None:
            return
        limits = knobs.engine_limits()
        session.plan_model(model, limits)
        log.info("planning %s within %s (from_pretrained/from_config, JIT_AHEAD=1)", type(model).__name__, limits)
    except Exception as exc:  # noqa: BLE001 - planning is an optimisation: the model is returned as built
        log.warning("could not plan %s (%s: %s); it runs without a plan", type(model).__name__, type(exc).__name__, exc)
