"""What the ``jit-ahead`` command shows while it works: build progress, and library notes kept apart.

``BuildProgress`` follows a pool's request table: a tqdm bar on a terminal, a plain line at intervals
otherwise (a log file, CI), each with built, queued, building and failed counts and an ETA from the rate
so far. ``LibraryNotes`` holds back what kernel and model libraries print on their own (Python warnings,
their loggers' warnings) while jit_ahead's output runs, and shows each distinct note once at the end,
marked as the library's: a FutureWarning of transformers is not a failure of the user's setup.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
from collections import Counter
from typing import TextIO

from .core.building.table import RequestTable
from .core.observing.own_cpu import OwnThread


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class BuildProgress:
    """Use as a context manager around the builds; ``write`` prints a line without breaking the bar."""

    def __init__(self, table: RequestTable, stream: TextIO | None = None, every: float = 10.0,
                 bar: bool | None = None) -> None:
        self._table = table
        self._stream = stream or sys.stderr
        self._every = every
        use_bar = self._stream.isatty() if bar is None else bar
        self._bar = None
        if use_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=0, unit="variant", file=self._stream, dynamic_ncols=True, leave=True)
        self._stop = threading.Event()
        self._thread = OwnThread(target=self._run, daemon=True, name="jit_ahead-progress")
        self._t0 = time.monotonic()

    def __enter__(self) -> "BuildProgress":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._show(final=True)
        if self._bar is not None:
            self._bar.close()

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def status(self) -> str:
        counts = self._table.counts()
        done, failed = counts["done"], counts["failed"] + counts["quarantined"]
        left = counts["queued"] + counts["running"]
        elapsed = time.monotonic() - self._t0
        eta = left * elapsed / done if done else None
        return (f"built {done} of {done + failed + left}, {counts['queued']} queued, {counts['running']} building, "
                f"{failed} failed, {elapsed:.0f}s, ETA {_eta(eta if left else 0.0)}")

    def _show(self, final: bool = False) -> None:
        if self._bar is None:
            if not final:
                print(f"jit_ahead: {self.status()}", file=self._stream, flush=True)
            return
        counts = self._table.counts()
        total = sum(counts.values())
        self._bar.total = total
        self._bar.n = counts["done"] + counts["failed"] + counts["quarantined"]
        self._bar.set_postfix_str(f"{counts['running']} building, {counts['failed'] + counts['quarantined']} failed",
                                  refresh=False)
        self._bar.refresh()

    def _run(self) -> None:
        interval = 0.25 if self._bar is not None else self._every
        while not self._stop.wait(interval):
            self._show()


class LibraryNotes:
    """Hold back warnings from outside jit_ahead (Python warnings, other loggers below ERROR) for the
    block; ``report()`` returns each distinct one once, with its count. Handlers a library adds during
    the block are covered by calling ``cover_new_handlers()`` once it is imported."""

    def __init__(self) -> None:
        self._notes: Counter[str] = Counter()
        self._catch = warnings.catch_warnings(record=True)
        self._caught: list = []
        self._hold = _HoldBack(self._notes)
        self._covered: list[logging.Handler] = []

    def __enter__(self) -> "LibraryNotes":
        self._caught = self._catch.__enter__()
        warnings.simplefilter("default")  # each distinct warning once per place, as Python would show it
        self.cover_new_handlers()
        return self

    def cover_new_handlers(self) -> None:
        loggers = [logging.getLogger()] + [lg for lg in list(logging.Logger.manager.loggerDict.values())
                                           if isinstance(lg, logging.Logger)]
        handlers = {h for lg in loggers for h in lg.handlers} | ({logging.lastResort} if logging.lastResort else set())
        for handler in handlers - set(self._covered):
            handler.addFilter(self._hold)
            self._covered.append(handler)

    def __exit__(self, *exc) -> None:
        for handler in self._covered:
            handler.removeFilter(self._hold)
        self._covered.clear()
        self._catch.__exit__(*exc)
        for caught in self._caught:
            self._notes[f"{caught.category.__name__}: {_first_line(caught.message)}"] += 1

    def report(self) -> list[str]:
        return [note + (f" (x{count})" if count > 1 else "") for note, count in self._notes.items()]


def _first_line(message) -> str:
    text = str(message).strip().splitlines()
    return (text[0] if text else "")[:240]


class _HoldBack(logging.Filter):
    """Passes jit_ahead's records and every error; notes the others once each (a record can pass
    several handlers) and holds them back."""

    def __init__(self, notes: Counter) -> None:
        super().__init__()
        self._notes = notes

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "jit_ahead" or record.name.startswith("jit_ahead.") or record.levelno >= logging.ERROR:
            return True
        if not getattr(record, "jit_ahead_noted", False):
            record.jit_ahead_noted = True
            self._notes[f"{record.name}: {_first_line(record.getMessage())}"] += 1
        return False
