"""Removing a damaged entry (a folder) from a DSL's disk cache, shared by the families' cache checks."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def remove_entry(entry: str | Path, aside: str | Path) -> None:
    """Remove ``entry`` so that no reader sees half of it: renamed to ``aside`` first (a reader then finds no
    entry), then deleted. Where it cannot be moved aside it is deleted where it is; where it is gone already
    (another process moved it first), nothing is done."""
    try:
        os.rename(entry, aside)
    except OSError:
        if not os.path.lexists(entry):
            return
        aside = entry
    shutil.rmtree(aside, ignore_errors=True)
