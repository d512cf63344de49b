"""Files that other processes, or other users, may have put where jit_ahead reads or removes them: a saved plan,
a record, a DSL's cache entry. Read only if regular and safe; removed so that no reader sees half of one."""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
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


def write_json(folder: str | Path, name: str, data, **dump_options) -> None:
    """``data`` as ``folder/name``, written aside and moved in place: a reader sees the old file or the
    whole new one. Raises OSError where it cannot be written (nothing is left aside)."""
    fd, aside = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, **dump_options)
        os.replace(aside, os.path.join(folder, name))
    except BaseException:
        if os.path.exists(aside):
            os.unlink(aside)
        raise


def open_regular(path: Path, binary: bool = False):
    """``path`` opened for reading as text (``binary``: as bytes), if it is a regular file: a FIFO or a device
    in a saved plan's, a record's or a store entry's place would block the read (or never end); OSError
    (EINVAL) names what it is instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"it is {kind}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb") if binary else os.fdopen(fd, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


class Unusable(Exception):
    """A file that is there but cannot be used; ``damaged``: it was read, and its bytes are not what was
    written (False: it could not be read at all)."""

    def __init__(self, reason: str, damaged: bool) -> None:
        super().__init__(reason)
        self.damaged = damaged


def read_json(path: str | Path, max_bytes: int):
    """The JSON value the regular file ``path`` holds, or None where there is no file; ``Unusable`` says why
    one that is there cannot be used (unreadable, not UTF-8 text, larger than ``max_bytes``, not JSON)."""
    try:
        with open_regular(path) as f:  # a FIFO there would block the read
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unusable(str(exc), damaged=False) from None
    except UnicodeDecodeError:
        raise Unusable("not UTF-8 text", damaged=True) from None
    if len(raw) > max_bytes:
        raise Unusable(f"larger than {max_bytes >> 20} MiB", damaged=True)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Unusable(str(exc) or type(exc).__name__, damaged=True) from None


def unsafe_because(path: Path, st: os.stat_result) -> str | None:
    """Why another user could change what this path holds, or None."""
    if st.st_uid not in (os.getuid(), 0):
        return f"owned by uid {st.st_uid}, not by this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None
