"""Triton's kernels shared through jit_ahead's store (``JIT_AHEAD_STORE``), by Triton's own plugin point: a
cache manager (``TRITON_CACHE_MANAGER``) that is Triton's file cache with the store behind it.

A kernel Triton looks up and does not find on local disk is fetched from the store (one entry per cache
group: the metadata and every file of the compiled kernel, all or nothing), checked against its frame,
and written into the local cache as Triton writes it; a kernel Triton puts in its local cache (compiled
here, or by a helper) is published to the store. The entry's name is Triton's own cache key, which names
Triton's version, the target, the source and the options: an entry of another Triton or GPU is never found.
A store that fails costs one line per kind of trouble; the kernel is compiled here as without a store.
Files Triton caches outside groups (its compiled launcher modules) stay local.

Nodes starting together compile each kernel once between them: a lookup that misses everywhere claims the
kernel in the store (``core/store/claims.py``) before Triton compiles it, and a node that finds it claimed
waits for the claimant's entry (at most ``JIT_AHEAD_WAIT_TIMEOUT_S``, as for a helper's build) or takes the
claim over once it lapses (its claimant died).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import time

from triton.runtime.cache import FileCacheManager

from ..core import knobs
from ..core.store import StoreDown, StoreError, configured, say_once
from ..core.store.claims import claims_on

log = logging.getLogger("jit_ahead.triton.store")

PLUGIN = f"{__name__}:StoreCacheManager"
CLAIM_POLL_S = 0.25  # how often a node waiting on another's build looks for its entry


def entry_name(key: str, filename: str) -> str:
    return f"triton/{key}/{filename}"


class StoreCacheManager(FileCacheManager):
    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self._store = None if (override or dump) else configured()

    def get_group(self, filename: str):
        """Triton's lookup before it compiles: the local cache, else the store; else, where another node has
        claimed this kernel, its entry once published (waited for, bounded), else a claim of this process's
        own, for the compile that follows (``put_group`` publishes it and lets go)."""
        group = super().get_group(filename)
        if group is not None or self._store is None:
            return group
        group = self.fetch(filename)
        return group if group is not None else self._claim_or_wait(filename)

    def fetch_if_missing(self, filename: str) -> None:
        """What a check of the local cache wants first: the store's group where the local cache has none."""
        if self._store is not None and FileCacheManager.get_group(self, filename) is None:
            self.fetch(filename)

    def fetch(self, filename: str):
        """The group from the store, written into the local cache as Triton writes it; None if the store has
        none (or none that is whole)."""
        name = entry_name(self.key, filename)
        try:
            payload = self._store.get(name)
            if payload is None:
                return None
            files = _unbundle(payload, filename)
        except StoreDown:  # the store said so itself
            return None
        except (StoreError, ValueError) as exc:  # ValueError: a name the store cannot hold
            say_once("triton-get", "jit_ahead store %s: %s; skipped, compiled here (each unusable entry is skipped "
                     "alike)", self._store.describe(), exc)
            return None
        paths = {child: FileCacheManager.put(self, data, child, binary=True) for child, data in files.items()}
        FileCacheManager.put_group(self, filename, paths)
        return paths

    def _claim_or_wait(self, filename: str):
        name = entry_name(self.key, filename)
        claims = claims_on(self._store)
        holder = claims.take(name)
        if holder is None:
            return None  # this process compiles it
        t0 = time.monotonic()
        deadline = t0 + knobs.wait_timeout_s()
        while time.monotonic() < deadline:
            time.sleep(CLAIM_POLL_S)
            group = self.fetch(filename)
            if group is not None:
                log.info("triton: %s was built by %s; fetched after %.1fs", filename, holder, time.monotonic() - t0)
                return group
            holder = claims.take(name)
            if holder is None:  # its claim lapsed (the builder died, or failed): this process compiles it
                log.warning("triton: the build of %s claimed by another node did not come; compiled here", filename)
                return None
        say_once("triton-claim-wait", "jit_ahead store %s: waited %.0fs for %s to publish %s; compiled here (a "
                 "build claimed by another node is waited for at most JIT_AHEAD_WAIT_TIMEOUT_S)",
                 self._store.describe(), time.monotonic() - t0, holder, filename)
        return None

    def put_group(self, filename: str, group):
        path = super().put_group(filename, group)
        if self._store is None:
            return path
        name = entry_name(self.key, filename)
        if not self._store.writes_off:
            try:
                self._store.put(name, _bundle(group))
            except StoreDown:
                pass  # the store said so itself
            except (StoreError, ValueError, OSError) as exc:
                self._store.writes_failed(f"kernel {filename}", exc)
        claims_on(self._store).release(name)
        return path


def _bundle(group: dict) -> bytes:
    files = {}
    for child, path in group.items():
        with open(path, "rb") as f:
            files[child] = base64.b64encode(f.read()).decode("ascii")
    return json.dumps({"files": files}, sort_keys=True).encode()


def _unbundle(payload: bytes, filename: str) -> dict[str, bytes]:
    try:
        files = json.loads(payload)["files"]
        decoded = {child: base64.b64decode(data, validate=True) for child, data in files.items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"a kernel group that does not decode ({type(exc).__name__})") from None
    if filename not in decoded or any(os.path.basename(child) != child or child.startswith(".") for child in decoded):
        raise StoreError(f"a kernel group without {filename} or with a file name that is not plain")
    return decoded


_NOT_SET = object()


def use_store():
    """Where a store is configured, Triton's cache manager becomes this one for this process and the helpers
    it starts (``TRITON_CACHE_MANAGER``, which Triton reads at each lookup); a manager the user set is kept,
    with one line. Returns what ``stop_using_store`` puts back (None: nothing was changed)."""
    store = configured()
    if store is None:
        return None
    current = os.environ.get("TRITON_CACHE_MANAGER")
    if current and current != PLUGIN:
        log.warning("TRITON_CACHE_MANAGER=%s is set: Triton's kernels are not shared through the jit_ahead store %s",
                    current, store.describe())
        return None
    os.environ["TRITON_CACHE_MANAGER"] = PLUGIN
    log.info("triton: kernels are fetched from and published to the jit_ahead store %s", store.describe())
    return _NOT_SET if current is None else current


def stop_using_store(previous) -> None:
    if previous is None or os.environ.get("TRITON_CACHE_MANAGER") != PLUGIN:
        return
    if previous is _NOT_SET:
        del os.environ["TRITON_CACHE_MANAGER"]
    else:
        os.environ["TRITON_CACHE_MANAGER"] = previous
