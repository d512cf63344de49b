"""Records: the variants a process compiled or loaded, kept in ``JIT_AHEAD_RECORD_DIR`` for the next start.

One JSON-lines file per family, header and rank: ``{family}-{header digest}-{rank}.jsonl``. The first
line is the header, which pins what makes the entries valid (for Triton: its version and install key,
the Python ABI, the target, the cache-invalidating environment); each further line is one variant,
appended with a single ``write`` on an ``O_APPEND`` descriptor, so ranks never share a file and a
crash loses at most the line being written. On start, every file of the family whose header equals this
process's header is read and merged (deduplicated by key) across ranks and runs; a file whose header
differs is ignored with one log line naming the difference.

With a store (``JIT_AHEAD_STORE``), a process that wrote to its file publishes the file at close
(``records/{family}-{header digest}/{host}-{rank}``), and reading merges the store's entries of the same
header with the folder's, checked alike: what one node met, the next node replays.

Replay imports the kernel modules that entries name, in helpers. So a folder or file that another user
can write (group- or world-writable, or owned by someone else) is refused, and module names must be
plain dotted identifiers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .building.shared_files import open_regular, unsafe_because
from .store import Store, StoreDown, StoreError, configured, say_once

log = logging.getLogger("jit_ahead.records")

KNOB = "JIT_AHEAD_RECORD_DIR"
TUNING_KNOB = "JIT_AHEAD_TUNING_DIR"
FORMAT = 1
_FILE_NAME = re.compile(r"[0-9a-f]{16}-rank\d+\.jsonl")  # after "{family}-"

# Variables launchers set to say which rank this process is, most specific first.
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


# A record holds one line per distinct variant or choice a deployment met: far below this. A larger file is
# not ours (or damaged) and is not read into the server's memory.
MAX_RECORD_BYTES = 256 << 20


def rank_tag(environ=os.environ) -> str:
    for name in _RANK_VARS:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return f"rank{int(value)}"
    return "rank0"


def header_digest(header: dict) -> str:
    return hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:16]


def is_dotted_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and all(part.isidentifier() for part in name.split("."))


def describe_difference(theirs: dict, ours: dict) -> str:
    names = sorted(set(theirs) | set(ours))
    parts = [f"{name}: {theirs.get(name)!r} here {ours.get(name)!r}" for name in names
             if theirs.get(name) != ours.get(name)]
    return "; ".join(parts) if parts else "same fields, other encoding"


@dataclass(frozen=True)
class RecordFormat:
    """What a family contributes: its header and how one variant becomes a JSON entry and back.
    ``decode`` raises (KeyError, TypeError, ValueError) on an entry it cannot use."""

    family: str
    header: dict
    key_of: Callable[[object], str]
    encode: Callable[[object], dict]
    decode: Callable[[dict], object]


_PLAIN_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def dataclass_format(family: str, header: dict, variant_class: type) -> RecordFormat:
    """The record format of a variant that is a dataclass of plain fields (str, int, float, bool), keyed by its
    ``key``: an entry holds the fields by name, each checked against its declared type when read back."""
    fields = [(f.name, _PLAIN_TYPES[f.type if isinstance(f.type, str) else f.type.__name__])
              for f in dataclasses.fields(variant_class)]

    def decode(entry: dict):
        values = {name: entry[name] for name, _ in fields}
        wrong = [name for name, kind in fields if type(values[name]) is not kind]
        if wrong:
            raise TypeError(f"{', '.join(wrong)}: not of the declared type")
        return variant_class(**values)

    return RecordFormat(family=family, header=header, key_of=lambda variant: variant.key,
                        encode=lambda variant: {name: getattr(variant, name) for name, _ in fields}, decode=decode)


class RecordFolder:
    """This process's view of ``JIT_AHEAD_RECORD_DIR`` for one family: read the matching records, append
    the variants this process compiled or loaded."""

    def __init__(self, folder: str | os.PathLike, fmt: RecordFormat, rank: str | None = None,
                 knob: str = KNOB, shared: Store | None = None) -> None:
        self.knob = knob  # what error lines name: the knob that chose the folder
        self.folder = Path(folder).absolute()
        self.format = fmt
        self.header = {"jit_ahead_record": FORMAT, "family": fmt.family, **fmt.header}
        self.digest = header_digest(self.header)
        self.path = self.folder / f"{fmt.family}-{self.digest}-{rank or rank_tag()}.jsonl"
        self.shared = shared  # the deployment's store: this file is published there at close
        self.shared_prefix = f"records/{fmt.family}-{self.digest}"
        self.shared_name = f"{self.shared_prefix}/{_host()}-{rank or rank_tag()}"
        self._inherited: list = []  # what the store held under this process's own name: kept when it publishes
        self._lock = threading.Lock()
        self._written: set[str] = set()
        self._fd: int | None = None
        self.usable = self._check_folder()

    # -- reading ----------------------------------------------------------------------------------------
    def read(self) -> list:
        """The variants of every matching record in the folder (all ranks, all runs), deduplicated."""
        if not self.usable:
            return []
        merged: dict[str, object] = {}
        for path in sorted(self.folder.glob(f"{self.format.family}-*.jsonl")):
            if not _FILE_NAME.fullmatch(path.name[len(self.format.family) + 1:]):
                continue  # another family whose name starts like this one ("triton-autotune-...")
            for item in self._read_file(path):
                merged.setdefault(self.format.key_of(item), item)
        for item in self._read_shared():
            merged.setdefault(self.format.key_of(item), item)
        return list(merged.values())

    def _read_shared(self) -> list:
        """The entries the nodes published for this header (this host's and rank's own included: a machine
        that comes back under its name with an empty disk finds what it met before)."""
        if self.shared is None:
            return []
        try:
            names = sorted(self.shared.names(self.shared_prefix))
        except StoreDown:  # the store said so itself
            return []
        except (StoreError, ValueError) as exc:
            say_once("records-list", "jit_ahead store %s: the records cannot be listed (%s); this node replays its "
                     "own only", self.shared.describe(), exc)
            return []
        items = []
        for name in names:
            try:
                data = self.shared.get(name)
                if data is None:
                    continue
                if len(data) > MAX_RECORD_BYTES:
                    raise StoreError(f"{name}: {len(data)} bytes, more than any record ({MAX_RECORD_BYTES})")
                try:
                    lines = data.decode().splitlines()
                except ValueError:
                    raise StoreError(f"{name}: not UTF-8 text") from None
            except StoreDown:
                break
            except (StoreError, ValueError) as exc:
                say_once("records-get", "jit_ahead store %s: %s; skipped (each unusable record alike), the others "
                         "are read", self.shared.describe(), exc)
                continue
            found = self._read_lines(lines, f"store entry {name}")
            if name == self.shared_name:
                self._inherited = found
            items += found
        return items

    def _read_file(self, path: Path) -> list:
        try:
            with open_regular(path) as f:
                info = os.fstat(f.fileno())
                why = unsafe_because(path, info)
                if why:
                    log.error("record %s is %s; replay imports the modules it names, so it is ignored", path, why)
                    return []
                if info.st_size > MAX_RECORD_BYTES:  # read whole into the server's memory otherwise
                    log.error("record %s is %d bytes, more than any record (%d); ignored", path, info.st_size,
                              MAX_RECORD_BYTES)
                    return []
                lines = f.read().splitlines()
        except OSError as exc:
            log.error("record %s cannot be read (%s); ignored", path, exc)
            return []
        except ValueError as exc:  # UnicodeDecodeError: bytes that are no record of ours
            log.error("record %s is not UTF-8 text (%s); ignored", path, exc)
            return []
        items = self._read_lines(lines, f"record {path}")
        if path == self.path:
            self._written.update(self.format.key_of(item) for item in items)
        return items

    def _read_lines(self, lines: list[str], where: str) -> list:
        """The variants of one record's lines (a file's or a store entry's), if its header is this process's."""
        try:
            header = json.loads(lines[0]) if lines else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("jit_ahead_record") is None:
            log.error("%s has no jit_ahead header on its first line; ignored", where)
            return []
        if header != self.header:
            log.warning("%s does not match this process (%s); ignored", where,
                        describe_difference(header, self.header))
            return []
        items, bad = [], 0
        for line in lines[1:]:
            try:
                items.append(self.format.decode(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                bad += 1  # a torn last line after a crash, or an edit by hand
        if bad:
            log.warning("%s: %d unusable line(s) skipped, %d variants read", where, bad, len(items))
        return items

    # -- writing ----------------------------------------------------------------------------------------
    def add(self, items: Iterable) -> int:
        """Append the variants this file does not hold yet; returns how many were written."""
        if not self.usable:
            return 0
        lines = []
        with self._lock:
            for item in items:
                key = self.format.key_of(item)
                if key not in self._written:
                    self._written.add(key)
                    lines.append(json.dumps(self.format.encode(item), sort_keys=True) + "\n")
            if not lines:
                return 0
            try:
                fd = self._open()
                os.write(fd, "".join(lines).encode())
            except OSError as exc:
                log.error("cannot append to record %s (%s); recording stops", self.path, exc)
                self.usable = False
                return 0
        return len(lines)

    def _open(self) -> int:
        if self._fd is None:
            if not self.path.exists():
                self._create_with_header()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
            why = unsafe_because(self.path, os.fstat(fd))
            if why:
                os.close(fd)
                raise OSError(f"it is {why}")
            self._fd = fd
        return self._fd

    def _create_with_header(self) -> None:
        """The file appears with its header already in it (written aside, then linked into place), so a
        second process with the same rank tag never sees it empty or writes a second header."""
        aside = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, (json.dumps(self.header, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
        try:
            os.link(aside, self.path)
        except FileExistsError:
            pass
        finally:
            os.unlink(aside)

    def close(self) -> None:
        with self._lock:
            wrote = self._fd is not None
            if wrote:
                os.close(self._fd)
                self._fd = None
        if wrote:
            self._publish()

    def _publish(self) -> None:
        """This process's file, with what the store held under its name, for the other nodes."""
        if self.shared is None or self.shared.writes_off:
            return
        merged = {self.format.key_of(item): item for item in self._inherited}
        for item in self._read_file(self.path):
            merged.setdefault(self.format.key_of(item), item)
        lines = [json.dumps(self.header, sort_keys=True)]
        lines += [json.dumps(self.format.encode(item), sort_keys=True) for item in merged.values()]
        try:
            data = ("\n".join(lines) + "\n").encode()
            if len(data) > MAX_RECORD_BYTES:
                raise StoreError(f"{self.path} is more than any record ({MAX_RECORD_BYTES} bytes)")
            self.shared.put(self.shared_name, data)
        except StoreDown:
            pass
        except (StoreError, OSError) as exc:
            self.shared.writes_failed(f"record {self.shared_name}", exc)

    def _check_folder(self) -> bool:
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(self.folder)
        except OSError as exc:
            log.error("%s=%s cannot be used (%s); nothing is recorded or replayed", self.knob, self.folder, exc)
            return False
        why = unsafe_because(self.folder, st)
        if why:
            log.error("%s=%s is %s; replay imports the modules records name, so nothing is recorded or "
                      "replayed", self.knob, self.folder, why)
            return False
        return True


def recording_enabled() -> bool:
    """JIT_AHEAD_RECORD_DIR is set: the families record what they build and replay it at the next start."""
    return bool(os.environ.get(KNOB, "").strip())


def tuning_folder(fmt: RecordFormat) -> RecordFolder | None:
    """Where autotune choices are kept and read back, so that no start benchmarks what an earlier one did:
    JIT_AHEAD_RECORD_DIR when it is set (beside the other records), else JIT_AHEAD_TUNING_DIR (default
    ``~/.cache/jit_ahead/tuning``; ``0`` keeps none)."""
    if recording_enabled():
        return record_folder(fmt)
    from .knobs import cache_folder

    folder = cache_folder(TUNING_KNOB, "tuning")
    return RecordFolder(folder, fmt, knob=TUNING_KNOB, shared=configured()) if folder is not None else None


def keeps_tuning() -> bool:
    """Autotune choices are kept (``tuning_folder``) unless both knobs leave them out."""
    from .knobs import cache_folder

    return recording_enabled() or cache_folder(TUNING_KNOB, "tuning") is not None


def record_folder(fmt: RecordFormat, raw: str | None = None) -> RecordFolder | None:
    """The RecordFolder JIT_AHEAD_RECORD_DIR asks for, or None when it is unset or empty."""
    raw = (os.environ.get(KNOB, "") if raw is None else raw).strip()
    return RecordFolder(raw, fmt, shared=configured()) if raw else None


def _host() -> str:
    """This machine's name as a store entry name may hold it."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
