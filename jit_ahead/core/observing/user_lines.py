"""The few lines a person running a server must see exactly once (jit_ahead is on; its summary)."""
from __future__ import annotations

import logging
import sys

log = logging.getLogger("jit_ahead.session")


def tell_user(line: str) -> None:
    """A line a person should see exactly once: through logging where it shows jit_ahead's INFO lines
    (the server configured it so), else on stderr."""
    if _logging_shows_info(log):
        log.info("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)


def _logging_shows_info(logger: logging.Logger) -> bool:
    """True when an INFO record of ``logger`` reaches a handler that emits it: the logger lets INFO through
    and a handler on its way up (as far as records propagate) has a level at or below INFO. Handlers' own
    filters are not consulted: a filter is the server's choice of what it shows."""
    if not logger.isEnabledFor(logging.INFO):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        if any(handler.level <= logging.INFO for handler in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def family_helpers(name: str, workers: int) -> str:
    """A family and its helper count, as the start line names them."""
    return f"{name} with " + (f"{workers} helper{'s' if workers != 1 else ''}" if workers
                              else "no helpers (misses build in place)")


def on_line(families: str, warmup_s: float, stats_log) -> str:
    """The line that says ``JIT_AHEAD=1`` took effect: the families, when serving is assumed, the stats log."""
    return (f"jit_ahead on (JIT_AHEAD=1): {families}; serving is assumed "
            + (f"{warmup_s:.0f}s after start" if warmup_s > 0 else "only when the engine says so (JIT_AHEAD_WARMUP_S=0)")
            + (f"; stats log {stats_log}" if stats_log is not None else ""))
