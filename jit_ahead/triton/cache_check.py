"""Checking a Triton cache entry before jit_ahead calls it "on disk".

Triton trusts its cache: an entry whose metadata JSON was truncated raises on every launch, a cubin
cut short fails to load on the GPU, and a metadata file with another ``num_warps`` launches with the
wrong configuration, all without a word. Whoever builds an entry for jit_ahead (a helper, or the
executor in place) writes a manifest beside it (``jit_ahead_manifest.json``: size and SHA-256 of each
file of the group), written last and atomically. The check then needs, for an entry to count:

- its group file parses and names files that all exist;
- the metadata parses and carries the entry's own hash;
- with a manifest, every file has its recorded size and digest (without one, an entry Triton wrote by
  itself, only the checks above and below apply);
- the binary is a CUDA ELF for the target's compute capability.

A damaged entry is removed, for its variant to be built again (``TritonExecutor``). Cache managers that
are not Triton's file cache (a remote cache) are not checked: they are trusted as Triton trusts them.

One process checks an entry up to three times on a warm start (reading the saved plan, replaying the
records, the first launch), and the digests are most of a check's cost. So an entry found sound is
remembered with the identity of its files (size, modification time, inode); a later check whose files
all still have theirs is answered without reading them. What a process found sound is also kept for the
next ones, in ``jit_ahead_checked.json`` at the top of the cache (``save_checked``, merged with what is
there; entries whose folder is gone are dropped): a warm start then checks a planned entry with a few
``stat`` calls instead of reading and hashing its files. A file changed in place keeping its size,
modification time and inode is not noticed: the risk accepted for it (Triton itself trusts every file
it finds). Files written less than ``SETTLED_S`` ago are not remembered: file times advance in coarse
steps, and a file rewritten in the step it was written in would keep its time. A copied cache (another
node) has other inodes and times: its entries are checked in full once there.
"""
from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import time
import uuid

from triton.runtime.cache import FileCacheManager, get_cache_manager

from ..core.processes import fork_safe_lock
from ..core.building.shared_files import Unusable, read_json, remove_entry, write_json
from ..core.building.cuda_elf import cuda_elf_arch
from .compile_inputs import cache_file_stem
from .store_cache import StoreCacheManager

MANIFEST = "jit_ahead_manifest.json"
CHECKED = "jit_ahead_checked.json"  # at the top of the cache: what earlier processes found sound
MAX_CHECKED_BYTES = 64 << 20  # a file larger than any a cache makes is not read
log = logging.getLogger("jit_ahead.triton.cache_check")


class Entry(enum.Enum):
    MISSING = "missing"
    OK = "ok"
    DAMAGED = "damaged"


# (folder, kernel name, arch) of each entry found sound, by this process or (CHECKED) an earlier one -> the
# identity of its files then
_sound: dict[tuple[str, str, int | None], tuple] = {}
_verified_here: set[tuple[str, str, int | None]] = set()  # those this process checked in full itself
SETTLED_S = 1.0
_roots_read: set[str] = set()  # caches whose CHECKED file this process has read
_unsaved: set[str] = set()  # caches with entries found sound since their CHECKED file was last written
_checked_lock = fork_safe_lock()  # planners and helpers are forked while a thread may be saving


def _identity(paths: list[str]) -> tuple | None:
    """Each file's (path, size, modification time, inode); None if one is gone."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            return None
        out.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def _files_of(folder: str, kernel_name: str, paths: dict[str, str]) -> list[str]:
    return [_group_file(folder, kernel_name), os.path.join(folder, MANIFEST), *sorted(paths.values())]


def folder_of(predicted_hash: str) -> str | None:
    """The entry's folder in Triton's file cache; None for another cache manager."""
    return _file_cache_folder(get_cache_manager(predicted_hash))


def _file_cache_folder(manager) -> str | None:
    if type(manager) not in (FileCacheManager, StoreCacheManager) or not manager.cache_dir:
        return None
    return manager.cache_dir


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _group_file(folder: str, kernel_name: str) -> str:
    return os.path.join(folder, f"__grp__{cache_file_stem(kernel_name)}.json")


def _group_paths(folder: str, kernel_name: str) -> dict[str, str] | None:
    """The group's files by name; None if the group file is absent; raises ValueError if it is damaged."""
    try:
        with open(_group_file(folder, kernel_name), encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        paths = json.loads(text)["child_paths"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("its group file does not parse") from None
    if not isinstance(paths, dict) or not all(isinstance(p, str) for p in paths.values()):
        raise ValueError("its group file names no files")
    return paths


def check(predicted_hash: str, kernel_name: str, arch: int | None, thorough: bool = True) -> tuple[Entry, str]:
    """Whether the entry for ``predicted_hash`` is there and sound, and if damaged, why. ``thorough=False``
    leaves out what reads the files' contents (digests, the binary's ELF header): every file there, with
    the size its manifest records and metadata naming the entry. For a background pass that only decides
    what to queue; the launch that loads the entry checks it in full."""
    try:
        manager = get_cache_manager(predicted_hash)
        if isinstance(manager, StoreCacheManager):  # another node's build: into the local cache, checked below
            manager.fetch_if_missing(f"{cache_file_stem(kernel_name)}.json")
        folder = _file_cache_folder(manager)
        if folder is None:  # not Triton's file cache: its own manager decides what a hit is
            group = manager.get_group(f"{cache_file_stem(kernel_name)}.json")
            return (Entry.OK if group else Entry.MISSING), ""
    except (OSError, ValueError, AttributeError):  # the cache cannot be reached: a miss, as Triton sees it
        return Entry.MISSING, ""
    _read_checked(os.path.dirname(folder))
    known = _sound.get((folder, kernel_name, arch))
    if known is not None and _identity([path for path, *_ in known]) == known:
        return Entry.OK, ""
    try:
        paths = _group_paths(folder, kernel_name)
        if paths is None:
            return Entry.MISSING, ""
        missing = [name for name, path in paths.items() if not os.path.isfile(path)]
        if missing:
            raise ValueError(f"files of its group are missing: {', '.join(sorted(missing))}")
        metadata_name = f"{cache_file_stem(kernel_name)}.json"
        if metadata_name not in paths:
            raise ValueError("its group names no metadata")
        try:
            with open(paths[metadata_name], encoding="utf-8") as f:
                metadata = json.load(f)
        except (ValueError, UnicodeDecodeError):
            raise ValueError("its metadata does not parse") from None
        if not isinstance(metadata, dict) or metadata.get("hash") != predicted_hash:
            raise ValueError("its metadata names another entry")
        _check_manifest(folder, paths, thorough)
        if not thorough:
            return Entry.OK, ""
        binaries = [p for name, p in paths.items() if name.endswith(".cubin")]
        for path in binaries:
            with open(path, "rb") as f:
                built_for = cuda_elf_arch(f.read())
            if arch is not None and built_for is not None and built_for != arch:
                raise ValueError(f"its binary is for sm_{built_for}, not sm_{arch}")
        identity = _identity(_files_of(folder, kernel_name, paths))
        settled = time.time_ns() - int(SETTLED_S * 1e9)
        # None: no manifest (an entry Triton wrote, cheap to check), checked each time
        if identity is not None and all(0 < mtime <= settled for _, _, mtime, _ in identity):
            _sound[(folder, kernel_name, arch)] = identity
            _verified_here.add((folder, kernel_name, arch))
            _unsaved.add(os.path.dirname(folder))
    except OSError as exc:
        return Entry.DAMAGED, f"cannot be read ({exc})"
    except (ValueError, TypeError, KeyError) as exc:  # TypeError, KeyError: a manifest of another shape
        return Entry.DAMAGED, str(exc) or type(exc).__name__
    return Entry.OK, ""


def _check_manifest(folder: str, paths: dict[str, str], digests: bool = True) -> None:
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return
    except (ValueError, UnicodeDecodeError):
        raise ValueError("its manifest does not parse") from None
    if not isinstance(manifest, dict) or set(manifest) != set(paths):
        raise ValueError("its files are not the ones its manifest records")
    for name, path in paths.items():
        size, digest = manifest[name]
        if os.path.getsize(path) != size:
            raise ValueError(f"{name} has {os.path.getsize(path)} bytes, not the {size} it was written with")
        if digests and _digest(path) != digest:
            raise ValueError(f"{name} is not the file it was written as (its SHA-256 differs)")


def write_manifest(predicted_hash: str, kernel_name: str) -> bool:
    """Record the entry's files as they are now (just built or just loaded by ``compile()``); an entry
    with a manifest already keeps it. Returns whether one was written."""
    folder = folder_of(predicted_hash)
    if folder is None or os.path.exists(os.path.join(folder, MANIFEST)):
        return False
    paths = _group_paths(folder, kernel_name)
    if not paths:
        return False
    manifest = {name: [os.path.getsize(path), _digest(path)] for name, path in paths.items()}
    write_json(folder, MANIFEST, manifest, sort_keys=True)
    return True


def remove(predicted_hash: str) -> None:
    """Remove the entry (moved aside first, so no reader sees half of it), for it to be built again."""
    folder = folder_of(predicted_hash)
    if folder is None or not os.path.isdir(folder):
        return
    for key in [k for k in list(_sound) if k[0] == folder]:
        _sound.pop(key, None)
        _verified_here.discard(key)
    remove_entry(folder, f"{folder}.damaged.{os.getpid()}.{uuid.uuid4().hex[:8]}")


# -- what earlier processes found sound (CHECKED) ------------------------------------------------------------
def _read_checked(root: str) -> None:
    """Once per process and cache: add the entries its CHECKED file holds to those found sound. A file
    that cannot be used is named in one line and ignored (the next save replaces it)."""
    if root in _roots_read:
        return
    with _checked_lock:
        if root in _roots_read:
            return
        _roots_read.add(root)
        try:
            loaded = _load_checked(root)
        except Exception:  # an optimisation: every entry is checked in full instead
            log.exception("triton: %s could not be read; its entries are checked in full", os.path.join(root, CHECKED))
            return
        for key, identity in loaded.items():
            _sound.setdefault(key, identity)


def _load_checked(root: str, report: bool = True) -> dict[tuple[str, str, int | None], tuple]:
    """The entries the cache's CHECKED file holds; ``report``: name a file that cannot be used (once per
    process: the save that replaces it reads it again quietly)."""
    path = os.path.join(root, CHECKED)
    try:
        data = read_json(path, MAX_CHECKED_BYTES)
        return _checked_entries(root, data) if data is not None else {}
    except Unusable as exc:
        if report:
            log.warning("triton: %s %s (%s); ignored, its entries are checked in full%s", path,
                        "is damaged" if exc.damaged else "cannot be read", exc,
                        " and it is written again" if exc.damaged else "")
        return {}


def _checked_entries(root: str, data) -> dict[tuple[str, str, int | None], tuple]:
    """A CHECKED file's entries; Unusable where it has another shape."""
    try:
        if not isinstance(data, dict) or data.get("jit_ahead_checked") != 1:
            raise ValueError("not a list of checked entries")
        out = {}
        for name, kernel_name, arch, files in data["entries"]:
            if not (_plain_name(name) and isinstance(kernel_name, str) and (arch is None or type(arch) is int)
                    and isinstance(files, list) and _names_its_group_and_manifest(kernel_name, files)):
                raise ValueError("an entry of another shape")
            folder = os.path.join(root, name)
            out[(folder, kernel_name, arch)] = tuple(
                (os.path.join(folder, file), size, mtime, inode) for file, size, mtime, inode in files)
        return out
    except Exception as exc:  # noqa: BLE001 - whatever the shape: KeyError, TypeError, ValueError, OverflowError
        raise Unusable(str(exc) or type(exc).__name__, damaged=True) from None


def _plain_name(name: object) -> bool:
    """A name inside one folder: no path, no parent."""
    return (isinstance(name, str) and name not in ("", ".", "..") and os.sep not in name
            and (os.altsep is None or os.altsep not in name))


def _names_its_group_and_manifest(kernel_name: str, files: list) -> bool:
    """Each file a plain name with integer size, time and inode; the group file and the manifest among
    them, as ``check`` records every sound entry (so an entry of no files can answer nothing)."""
    for item in files:
        if not (isinstance(item, list) and len(item) == 4 and _plain_name(item[0])
                and all(type(v) is int and v >= 0 for v in item[1:])):
            return False
    names = {item[0] for item in files}
    return {os.path.basename(_group_file("", kernel_name)), MANIFEST} <= names


def save_checked() -> None:
    """Keep what this process checked in full and found sound for the next processes on each cache it
    checked: merged into what the cache's CHECKED file holds now (another process may have written newer
    identities of the entries this one only read from it), written aside and moved in place. Entries whose
    folder is gone are dropped. A cache that cannot be written (read-only, full) keeps what it had."""
    with _checked_lock:
        roots = set(_unsaved)
        _unsaved.clear()
        found = {key: _sound.get(key) for key in list(_verified_here)}  # other threads go on checking
        for root in roots:
            merged = _load_checked(root, report=False)
            merged.update((key, identity) for key, identity in found.items()
                          if identity is not None and os.path.dirname(key[0]) == root)
            entries = []
            for (folder, kernel_name, arch), identity in merged.items():
                if not os.path.isdir(folder) or any(os.path.dirname(path) != folder for path, *_ in identity):
                    continue  # removed, or a file outside its folder: not kept
                entries.append([os.path.basename(folder), kernel_name, arch,
                                [[os.path.basename(path), size, mtime, inode] for path, size, mtime, inode in identity]])
            try:
                write_json(root, CHECKED, {"jit_ahead_checked": 1, "entries": entries}, separators=(",", ":"))
            except OSError as exc:
                log.debug("triton: %s not written (%s)", os.path.join(root, CHECKED), exc)
