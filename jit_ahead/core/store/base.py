"""The store's interface, its entries' framing, and the one configured for this process.

An entry is a name (segments of letters, digits, ``.``, ``_`` and ``-``, joined by ``/``) and bytes. Stored,
the bytes are framed with the frame's version, their length and their SHA-256: an entry that does not
match its frame (cut short, damaged, written by a jit_ahead that frames otherwise) is never handed to a
caller. What an entry holds is its publisher's; the name carries everything that must match (a DSL's own
key names its version, target and options).

``JIT_AHEAD_STORE``: a folder (a local disk or a shared mount, ``directory.py``) or a Redis server
(``redis://host:port/db``, ``redis_store.py``). Nothing is read or written anywhere unless it is set.
Trouble with the store costs one log line and a local build, never the server.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from abc import ABC, abstractmethod

log = logging.getLogger("jit_ahead.store")

KNOB = "JIT_AHEAD_STORE"
FRAME = b"jit_ahead-store 1"
_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")


class StoreError(Exception):
    """An entry that is there and cannot be used, or a store that cannot be reached or written."""


class StoreDown(StoreError):
    """A store that stopped answering; it said so in one line of its own, and callers need not."""


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name) or any(part in (".", "..") for part in name.split("/")):
        raise ValueError(f"not a store entry name: {name!r}")
    return name


def frame(payload: bytes) -> bytes:
    return b"%s %d %s\n" % (FRAME, len(payload), hashlib.sha256(payload).hexdigest().encode()) + payload


def unframe(name: str, data: bytes) -> bytes:
    """The payload of a stored entry; StoreError if it is not one this jit_ahead wrote whole."""
    head, newline, payload = data.partition(b"\n")
    parts = head.split(b" ")
    if not newline or len(parts) != 4 or b" ".join(parts[:2]) != FRAME:
        raise StoreError(f"{name}: not an entry of this jit_ahead's store format")
    if not parts[2].isdigit() or int(parts[2]) != len(payload):
        raise StoreError(f"{name}: {len(payload)} bytes where its frame says {parts[2].decode(errors='replace')} "
                         "(cut short or damaged)")
    if hashlib.sha256(payload).hexdigest().encode() != parts[3]:
        raise StoreError(f"{name}: its bytes do not match their SHA-256 (damaged)")
    return payload


class Store(ABC):
    """Where builds are published and fetched by name."""

    writes_off = False  # set by ``writes_failed``: a full, read-only or refusing store is not written again

    def writes_failed(self, what: str, exc: Exception) -> None:
        """The first write this store refused (publish or claim): one line, and no more writes from this
        process; it still reads."""
        with _lock:
            first, self.writes_off = not self.writes_off, True
        if first:
            log.warning("jit_ahead store %s: could not publish %s (%s); this process writes nothing more there (no "
                        "publish, no claim: other nodes build what it builds), and serves on", self.describe(), what,
                        exc)

    @abstractmethod
    def get(self, name: str) -> bytes | None:
        """The entry's bytes, None if there is none; StoreError if it is there and unusable."""

    @abstractmethod
    def put(self, name: str, data: bytes) -> None:
        """Publish ``data`` as ``name``, whole or not at all (readers never see part of it); StoreError if the
        store cannot take it."""

    @abstractmethod
    def claim(self, name: str, owner: str, seconds: float) -> str | None:
        """Hold the claim ``name`` for ``owner`` for ``seconds``: taken when free or lapsed, renewed when
        ``owner`` holds it. None when ``owner`` holds it now, else who does. Claims are apart from entries:
        a node claims what it is about to build, so that the others wait for its entry instead."""

    @abstractmethod
    def release(self, name: str, owner: str) -> None:
        """Let go of ``owner``'s claim ``name`` (nothing if another holds it)."""

    @abstractmethod
    def names(self, prefix: str) -> list[str]:
        """The names of the entries under the folder-like ``prefix`` (``records/triton-0123``), in no order;
        StoreError if the store cannot list them."""

    @abstractmethod
    def describe(self) -> str:
        """Where the store is, for log lines."""


_said: set[str] = set()


def say_once(kind: str, message: str, *args) -> None:
    """One warning per kind of store trouble and process: a store that fails fails for every entry alike."""
    if kind not in _said:
        _said.add(kind)
        log.warning(message, *args)


_lock = threading.Lock()
_configured: dict[str, Store | None] = {}


def configured() -> Store | None:
    """The store ``JIT_AHEAD_STORE`` names, made once per process and value; None where it is unset or
    unusable (one line says why)."""
    raw = os.environ.get(KNOB, "").strip()
    if not raw:
        return None
    with _lock:
        if raw not in _configured:
            _configured[raw] = _open(raw)
        return _configured[raw]


def _open(raw: str) -> Store | None:
    from .. import knobs

    try:
        if raw.startswith(("redis://", "rediss://", "unix://")):
            from .redis_store import TIMEOUT_KNOB, RedisStore

            return RedisStore(raw, knobs.env_seconds(TIMEOUT_KNOB, 2.0, minimum=0.05))
        if "://" in raw:
            raise ValueError("a folder, or a redis:// URL")
        from .directory import DirectoryStore

        return DirectoryStore(raw)
    except ImportError as exc:
        log.warning("%s=%s needs the redis package (pip install 'jit_ahead[redis]'): %s; running without a store",
                    KNOB, raw, exc)
    except (OSError, ValueError) as exc:
        log.warning("%s=%s cannot be used (%s); running without a store", KNOB, raw, exc)
    return None
