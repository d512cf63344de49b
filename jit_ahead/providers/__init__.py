"""Providers: model-facing planners per kernel library (see ``base.Provider``)."""
from .base import PlannedLaunch, Provider, warmup_token_counts
from .builtin import builtin_providers

__all__ = ["PlannedLaunch", "Provider", "builtin_providers", "warmup_token_counts"]
