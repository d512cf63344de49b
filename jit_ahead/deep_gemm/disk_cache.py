"""DeepGEMM's JIT disk cache, laid out and published as its runtime does, so that what a helper writes is
what the server's DeepGEMM finds.

Roots: ``DG_JIT_CACHE_DIR`` (else ``DJ_JIT_CACHE_DIR``, else ``~/.dj``), colon-separated: the first is
written to, the others are read-only lookup roots. An entry is ``<root>/cache/<kernel name>.<key>/`` holding
``kernel.cu``, ``kernel.cubin`` and ``meta.json``; it counts only once its ``.committed`` marker exists. A
build happens in ``<first root>/tmp/<random>/`` and is published by renaming that whole folder into place
after the marker is written and synced: a reader sees no entry or a complete one, and a build killed
midway leaves only its private folder under ``tmp/``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from ..core.building import cuda_elf
from ..core.building.shared_files import remove_entry

log = logging.getLogger("jit_ahead.deep_gemm")

COMMITTED = ".committed"
CUBIN = "kernel.cubin"
META = "meta.json"
_NAME = re.compile(r"[A-Za-z0-9_]+")


def cache_roots(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The roots DeepGEMM reads, the writable one first."""
    value = environ.get("DG_JIT_CACHE_DIR", environ.get("DJ_JIT_CACHE_DIR"))
    if value is None:
        return [Path(environ.get("HOME", "~")).expanduser() / ".dj"]
    roots = value.split(":")
    if any(not root for root in roots):
        raise ValueError(f"DG_JIT_CACHE_DIR holds an empty path: {value!r}")
    return [Path(root) for root in roots]


def entry_name(kernel_name: str, key: str) -> str:
    if not _NAME.fullmatch(kernel_name):
        raise ValueError(f"a DeepGEMM kernel name has letters, digits and underscores only: {kernel_name!r}")
    return f"{kernel_name}.{key}"


def committed_entries(root: Path) -> set[str]:
    """The names of the committed entries under ``root`` (none when it has no cache folder)."""
    try:
        return {entry.name for entry in (root / "cache").iterdir() if (entry / COMMITTED).exists()}
    except OSError:
        return set()


def damage(entry: Path) -> str | None:
    """Why a committed entry cannot be what DeepGEMM loads (its cubin missing, not a CUDA ELF or cut short;
    its meta.json missing or not a JSON object), or None."""
    try:
        binary = (entry / CUBIN).read_bytes()
    except OSError as exc:
        return f"its {CUBIN} cannot be read ({exc.strerror or exc})"
    try:
        short = cuda_elf.cut_short(binary)
    except ValueError as exc:
        return f"its {CUBIN}: {exc}"
    if short:
        return f"its {CUBIN}: {short}"
    try:
        meta = json.loads((entry / META).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"its {META} cannot be read ({type(exc).__name__})"
    if not isinstance(meta, dict):
        return f"its {META} is not a JSON object"
    return None


def find(roots: list[Path], kernel_name: str, key: str) -> Path | None:
    """The committed entry of that kernel and key in the first root that has one. A damaged committed
    entry is one line; in the writable root it is removed (so that it is built again), in a read-only
    lookup root it is passed over."""
    name = entry_name(kernel_name, key)
    for index, root in enumerate(roots):
        path = root / "cache" / name
        if not (path / COMMITTED).exists():
            continue
        why = damage(path)
        if why is None:
            return path
        if index == 0:
            _remove(path)
            log.warning("DeepGEMM cache entry %s is damaged (%s); removed, it is built again", path, why)
        else:
            log.warning("DeepGEMM cache entry %s is damaged (%s); passed over", path, why)
    return None


def _remove(entry: Path) -> None:
    """Out of readers' way at once (renamed aside into ``tmp/``, a reader sees no entry), then deleted."""
    aside = entry.parent.parent / "tmp" / f"damaged-{uuid.uuid4().hex}"
    with contextlib.suppress(OSError):  # no tmp/: removed where it is
        aside.parent.mkdir(parents=True, exist_ok=True)
    remove_entry(entry, aside)


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(root: Path, kernel_name: str, key: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` fills a private folder under ``root/tmp``; then it is committed and renamed to its
    entry. Another process that published the same entry first wins (its folder stays, ours goes). On any
    error the private folder is removed and the error raised."""
    final = root / "cache" / entry_name(kernel_name, key)
    scratch = root / "tmp" / uuid.uuid4().hex
    scratch.mkdir(parents=True)
    try:
        build(scratch)
        marker = scratch / COMMITTED
        marker.touch()
        for path in (*sorted(p for p in scratch.iterdir() if p.is_file()), scratch):
            _sync(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() and not (final / COMMITTED).exists():
            shutil.rmtree(final, ignore_errors=True)  # no entry to anyone (no marker): a leftover in the way
        try:
            os.rename(scratch, final)
        except OSError:
            if not (final / COMMITTED).exists():
                raise
            shutil.rmtree(scratch, ignore_errors=True)  # published by another process meanwhile
        _sync(final.parent)
        return final
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
