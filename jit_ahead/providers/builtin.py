"""The built-in providers, enabled when their library is importable."""
from __future__ import annotations

import importlib
import importlib.util
import logging

from ..core.knobs import model_planner_enabled
from .base import Provider

log = logging.getLogger("jit_ahead.providers")

# library module -> "module:Class"; the provider module is imported only when its library is installed
BUILTIN = {
    "liger_kernel": "jit_ahead.providers.liger:LigerProvider",
    "fla": "jit_ahead.providers.fla:FlaGatedDeltaNetProvider",
}


def builtin_providers() -> list[Provider]:
    providers = []
    for library, target in BUILTIN.items():
        if importlib.util.find_spec(library) is None:
            continue
        module, _, cls = target.partition(":")
        try:
            providers.append(getattr(importlib.import_module(module), cls)())
        except Exception as exc:  # a broken install must not stop the others
            log.warning("provider for %s not available (%s: %s)", library, type(exc).__name__, exc)
    if model_planner_enabled():
        from .model import ModelProvider

        providers.append(ModelProvider())  # after the library providers: it plans what they leave
    return providers
