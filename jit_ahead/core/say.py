"""The few lines a person running a server must see exactly once (jit_ahead is on; its summary)."""
from __future__ import annotations

import logging
import sys

log = logging.getLogger("jit_ahead.session")


def say(line: str) -> None:
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
