"""The family-agnostic core: requests, priorities, the request table, the helper pool, stats, session."""
from .priority import Priority
from .requests import BuildRequest, BuildResult

__all__ = ["Priority", "BuildRequest", "BuildResult"]
