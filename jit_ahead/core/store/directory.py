"""A store in a folder: a local disk, or a mount several machines share. Each entry is one file, written
aside in the store's own ``tmp`` folder and renamed into place (a rename within one file system is atomic,
NFS included): a reader sees no entry or a whole one, and writers on several machines never mix theirs."""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from ..building.shared_files import open_regular
from .base import Store, StoreError, check_name, frame, unframe

MAX_ENTRY_BYTES = 1 << 30  # a larger file in an entry's place is not read


class DirectoryStore(Store):
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).absolute()
        self.entries = self.root / "entries"
        self.aside = self.root / "tmp"
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
            fd, aside = tempfile.mkstemp(prefix=f"{path.name}.", dir=self.aside)
        except OSError as exc:
            raise StoreError(f"{name}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(frame(data))
                f.flush()
                os.fsync(f.fileno())  # whole on disk before it has a name readers look for
            os.replace(aside, path)
        except OSError as exc:
            try:
                os.unlink(aside)
            except OSError:
                pass
            raise StoreError(f"{name}: {exc.strerror or errno.errorcode.get(exc.errno, exc)}") from None
