"""Triton's installation key (``triton_key()``: a hash of its sources and its compiled library), which the
records' header and the plan key name, remembered across processes.

Triton computes it by reading and hashing its whole install, the compiled library included, once per
process at its first compile or load. jit_ahead needs it earlier, while the server builds its model: the
records' replay thread reads it there, and its hashing, done in many short steps that each take the GIL
back, makes the model-building thread wait for the GIL each time. So the key Triton computed is kept in
``jit_ahead_installation_key.json`` at the top of Triton's cache, under the identity of every file in
Triton's package (path, size, modification time, inode): a later process whose install still has those
files reads the key with a walk of ``stat`` calls instead, and Triton computes its own at its first
compile as it would without jit_ahead. The key kept is Triton's own result, never derived here; a file
changed in place keeping its size, time and inode is not noticed (Triton's cache trusts the same).
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading

import triton

from ..core.building.shared_files import Unusable, read_json, write_json
from ..core.observing.own_cpu import OwnTimer, spent
from ..core.processes import fork_safe_lock

KEPT = "jit_ahead_installation_key.json"
MAX_KEPT = 8  # installs (one per Triton and Python) sharing one cache
MAX_KEPT_BYTES = 1 << 20
# Triton's own work, which a process without jit_ahead does at its first compile or load: counted apart
INSTALLATION_KEY = "Triton's installation key (computed without jit_ahead too)"
log = logging.getLogger("jit_ahead.triton.installation_key")

_lock = fork_safe_lock()
_known: list[str] = []  # this process's key, once found


def installation_key() -> str:
    """Triton's ``triton_key()``, once per process: the key kept for this install when its files are
    unchanged, else Triton's own (then kept). A caller arriving while another thread finds it waits."""
    with _lock:
        if not _known:
            _known.append(_find())
        return _known[0]


def compute_installation_key_in_background(delay: float) -> threading.Timer:
    """Find ``installation_key()`` in a thread ``delay`` seconds from now: planning's first step, the plan
    key, needs it, and a server builds its model meanwhile; a process that is gone by then (a script that
    only imports Triton) never pays for it. Cancel the timer to skip it."""
    timer = OwnTimer(delay, installation_key)
    timer.name, timer.daemon = "jit_ahead-triton-key", True
    timer.start()
    return timer


def install_identity(package: str | None = None) -> str:
    """A digest of every file under Triton's package (relative path, size, modification time, inode) and
    Triton's version: it changes whenever a file ``triton_key()`` reads could have."""
    package = package or os.path.dirname(os.path.abspath(triton.__file__))
    digest = hashlib.sha256(f"{triton.__version__}\0{package}\0".encode())
    for root, dirs, files in os.walk(package, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:  # a dangling link: part of the identity as such
                digest.update(f"{os.path.relpath(path, package)}\0-\n".encode())
                continue
            digest.update(f"{os.path.relpath(path, package)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return digest.hexdigest()


def _find() -> str:
    from triton.runtime.cache import triton_key

    try:
        identity, folder = install_identity(), _cache_root()
    except Exception as exc:  # noqa: BLE001 - an optimisation: Triton's own key is always right
        log.debug("triton: the install's identity could not be taken (%s); its key is computed", exc)
        identity = folder = None
    kept = _read(folder) if folder else {}
    key = kept.get(identity) if identity else None
    if key is not None:
        return key
    with spent(INSTALLATION_KEY, also_without=True):
        key = triton_key()
    if identity and folder:
        kept.pop(identity, None)
        kept[identity] = key  # newest last; the oldest installs are dropped
        _write(folder, dict(list(kept.items())[-MAX_KEPT:]))
    return key


def _cache_root() -> str | None:
    """The top of Triton's file cache (``TRITON_CACHE_DIR``), or None where Triton keeps its cache
    elsewhere (a remote cache manager)."""
    from triton import knobs

    folder = knobs.cache.dir
    return folder if folder and os.path.isdir(folder) else None


def _read(folder: str) -> dict[str, str]:
    """The keys kept in ``folder``; a file that cannot be used is one line, and is replaced."""
    path = os.path.join(folder, KEPT)
    try:
        data = read_json(path, MAX_KEPT_BYTES)
        if data is None:
            return {}
        if not (isinstance(data, dict) and data.get("jit_ahead_installation_key") == 1
                and isinstance(data.get("keys"), dict)
                and all(isinstance(k, str) and isinstance(v, str) and v for k, v in data["keys"].items())):
            raise Unusable("not a table of installation keys", damaged=True)
        return dict(data["keys"])
    except Unusable as exc:
        log.warning("triton: %s %s (%s); ignored, Triton's installation key is computed and kept again", path,
                    "is damaged" if exc.damaged else "cannot be read", exc)
        return {}


def _write(folder: str, keys: dict[str, str]) -> None:
    """A cache that cannot be written (read-only, full) keeps what it had."""
    try:
        write_json(folder, KEPT, {"jit_ahead_installation_key": 1, "keys": keys})
    except OSError as exc:
        log.debug("triton: %s not written (%s)", os.path.join(folder, KEPT), exc)
