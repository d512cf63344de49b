"""A store in a folder: a local disk, or a mount several machines share. Each entry is one file, written
aside in the store's own ``tmp`` folder and renamed into place (a rename within one file system is atomic,
NFS included): a reader sees no entry or a whole one, and writers on several machines never mix theirs.

A claim is a file in ``claims`` made with O_EXCL (exclusive on NFS since v3) holding its owner and until
when it holds; its owner renews it by writing it again. A claim that lapsed, or whose owner is a process of
this machine that is gone, is taken over: moved aside under a name of the taker's own first, so that of two
takers only one removes it."""
from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from ..building.shared_files import open_regular
from .base import Store, StoreError, check_name, frame, unframe

MAX_ENTRY_BYTES = 1 << 30  # a larger file in an entry's place is not read


class DirectoryStore(Store):
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).absolute()
        self.entries = self.root / "entries"
        self.aside = self.root / "tmp"
        self.claims = self.root / "claims"  # made at the first claim: a store only read needs none
        for folder in (self.entries, self.aside):
            folder.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return str(self.root)

    def get(self, name: str) -> bytes | None:
        path = self.entries / check_name(name)
        try:
            with open_regular(path, binary=True) as f:
                size = os.fstat(f.fileno()).st_size
                if size > MAX_ENTRY_BYTES:
                    raise StoreError(f"{name}: {size} bytes, more than an entry may hold")
                data = f.read(MAX_ENTRY_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            what = "not a regular file: " if exc.errno == errno.EINVAL else ""
            raise StoreError(f"{name}: {what}{exc.strerror or exc}") from None
        return unframe(name, data)

    def claim(self, name: str, owner: str, seconds: float) -> str | None:
        path = self.claims / check_name(name)
        record = json.dumps({"owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
                             "until": time.time() + seconds}).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for _ in range(3):  # a lapsed claim moved away by another taker meanwhile: look again
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    held = _read_claim(path)
                    if held is None:
                        continue  # gone between the two calls
                    if held.get("owner") == owner:
                        self._write_aside(path, record)  # renewed
                        return None
                    if not _lapsed(held):
                        return str(held.get("owner"))
                    self._take_over(path, held)
                    continue
                with os.fdopen(fd, "wb") as f:
                    f.write(record)
                return None
        except OSError as exc:
            raise StoreError(f"claim {name}: {exc.strerror or exc}") from None
        raise StoreError(f"claim {name}: taken and let go again and again")

    def _take_over(self, path: Path, held: dict) -> None:
        """Move the lapsed claim ``held`` out of the way, unless what is there now is another claim."""
        moved = self.aside / f"claim.{os.getpid()}.{time.monotonic_ns()}"
        try:
            os.rename(path, moved)
        except FileNotFoundError:
            return
        if _read_claim(moved) != held:  # a fresh claim came between the read and the move: put it back
            try:
                os.link(moved, path)
            except FileExistsError:
                pass
        os.unlink(moved)

    def release(self, name: str, owner: str) -> None:
        path = self.claims / check_name(name)
        held = _read_claim(path)
        if held is not None and held.get("owner") == owner:
            self._take_over(path, held)

    def _write_aside(self, path: Path, data: bytes, durable: bool = False) -> None:
        """``data`` as ``path``, written in the store's tmp folder and renamed into place (``durable``: on disk
        before it has a name readers look for)."""
        fd, aside = tempfile.mkstemp(prefix=f"{path.name}.", dir=self.aside)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(aside, path)
        except OSError:
            try:
                os.unlink(aside)
            except OSError:
                pass
            raise

    def names(self, prefix: str) -> list[str]:
        folder = self.entries / check_name(prefix)
        try:
            return [f"{prefix}/{child.name}" for child in folder.iterdir() if child.is_file()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"{prefix}: {exc.strerror or exc}") from None

    def put(self, name: str, data: bytes) -> None:
        path = self.entries / check_name(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write_aside(path, frame(data), durable=True)
        except OSError as exc:
            raise StoreError(f"{name}: {exc.strerror or errno.errorcode.get(exc.errno, exc)}") from None


def _read_claim(path: Path) -> dict | None:
    try:
        with open_regular(path, binary=True) as f:
            held = json.loads(f.read(4096))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"owner": "?", "until": 0}  # not a claim of ours, or cut short: lapsed
    return held if isinstance(held, dict) else {"owner": "?", "until": 0}


def _lapsed(held: dict) -> bool:
    until = held.get("until")
    if not isinstance(until, (int, float)) or until < time.time():
        return True
    pid = held.get("pid")
    if held.get("host") == socket.gethostname() and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True  # its owner, a process of this machine, is gone
        except PermissionError:
            pass
    return False
