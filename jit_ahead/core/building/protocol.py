"""Messages between the pool and its helpers, and their framing on a pipe.

Each frame is an 8-byte big-endian length followed by a pickle of one frozen dataclass. Both ends are
the same interpreter and the same install, and pipes are private to the two processes, so pickle is
safe here; nothing else ever reads these pipes.
"""
from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

from ..requests import BuildRequest, BuildResult

_HEADER = struct.Struct("!Q")


@dataclass(frozen=True)
class Configure:
    """First message to a helper: the server's import path and the family's builder module."""

    sys_path: tuple[str, ...]
    builder: str  # the module helpers import: core/family.py's Builder (prepare(device_view), build(payload))
    device_view: object = None  # jit_ahead.core.device_view.DeviceView: the server's GPU as libraries see it


@dataclass(frozen=True)
class Ready:
    """Readiness handshake: the helper imported its builder and warmed it up."""

    pid: int
    seconds: float
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Preload:
    modules: tuple[str, ...]


@dataclass(frozen=True)
class PreloadDone:
    failed: dict = field(default_factory=dict)  # module -> error text


@dataclass(frozen=True)
class Job:
    job_id: int
    request: BuildRequest


@dataclass(frozen=True)
class JobTaken:
    """The helper read ``Job`` ``job_id`` and starts it: a helper that dies before saying so died idle, and
    its death is not the job's."""

    job_id: int


@dataclass(frozen=True)
class JobDone:
    job_id: int
    result: BuildResult  # its ``builder`` is filled in by the pool, which knows the helper's name


@dataclass(frozen=True)
class Shutdown:
    pass


# -- the fork server: one helper process that imports once and forks the helpers ----------------------------
@dataclass(frozen=True)
class Fork:
    """Fork a helper. The helper's two pipe ends follow this frame as SCM_RIGHTS on one byte."""

    name: str


@dataclass(frozen=True)
class Forked:
    pid: int


@dataclass(frozen=True)
class Exited:
    """Sent by the fork server, unasked, when it reaped one of its helpers."""

    pid: int
    returncode: int  # negative: killed by that signal, as subprocess reports it


class ProtocolError(RuntimeError):
    pass


def write_message(stream: BinaryIO, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: BinaryIO) -> object | None:
    """Read one message; None on a clean end of stream (the other side closed or died)."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    data = _read_exactly(stream, size)
    if data is None:
        raise ProtocolError(f"stream ended inside a {size}-byte frame")
    return pickle.loads(data)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    chunks = []
    remaining = size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            if remaining == size:
                return None
            raise ProtocolError(f"stream ended after {size - remaining} of {size} bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
