"""Files that other processes, or other users, may have put where jit_ahead reads or removes them: a saved plan,
a record, a DSL's cache entry. Read only if regular and safe; removed so that no reader sees half of one."""
from __future__ import annotations

import errno
import os
import shutil
import stat
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


def open_regular(path: Path):
    """``path`` opened for reading as text, if it is a regular file: a FIFO or a device in a saved plan's or
    a record's place would block the read (or never end); OSError names what it is instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"it is {kind}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def unsafe_because(path: Path, st: os.stat_result) -> str | None:
    """Why another user could change what this path holds, or None."""
    if st.st_uid not in (os.getuid(), 0):
        return f"owned by uid {st.st_uid}, not by this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None
