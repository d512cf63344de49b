"""Providers: model-facing planners per kernel library (see ``base.Provider``)."""
from .base import PlannedLaunch, Provider

__all__ = ["PlannedLaunch", "Provider"]
