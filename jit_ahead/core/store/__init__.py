"""A store jit_ahead publishes builds to and fetches them from, shared by the nodes of a deployment
(``JIT_AHEAD_STORE``): ``configured()`` is this process's, or None."""
from .base import Store, StoreDown, StoreError, configured, say_once

__all__ = ["Store", "StoreDown", "StoreError", "configured", "say_once"]
