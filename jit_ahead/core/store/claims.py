"""This process's claims on the deployment's store: a node about to build what the store lacks claims it, so
that nodes starting together build each variant once between them; the others wait for its entry.

A claim lives ``JIT_AHEAD_STORE_CLAIM_S`` seconds (default 30) and is renewed by a thread of its holder every
third of that while the build runs, at most ``JIT_AHEAD_BUILD_TIMEOUT_S`` (a build that long is killed
anyway). A holder that dies stops renewing, and its claims lapse within their lifetime: the nodes waiting on
them take them over and build.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time

from .base import Store, StoreDown, StoreError

log = logging.getLogger("jit_ahead.store")

CLAIM_KNOB = "JIT_AHEAD_STORE_CLAIM_S"


class Claims:
    def __init__(self, store: Store, seconds: float, longest: float) -> None:
        self.store = store
        self.seconds = seconds  # a claim's lifetime, renewed while held
        self.longest = longest  # no claim is renewed past this: its build would have been stopped
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}  # name -> when taken (monotonic)
        self._renewer: threading.Thread | None = None
        self._owner = ""
        self._pid = -1

    @property
    def owner(self) -> str:
        if self._pid != os.getpid():  # a forked helper is a claimant of its own, holding nothing yet
            self._pid = os.getpid()
            self._owner = f"{socket.gethostname()}:{self._pid}:{secrets.token_hex(4)}"
            self._held = {}
            self._renewer = None
        return self._owner

    def take(self, name: str) -> str | None:
        """None when this process holds ``name`` now (build it, then ``release``), else who does. A store
        that cannot be asked answers None: the node builds as without a store."""
        owner = self.owner
        if self.store.writes_off:
            return None
        try:
            holder = self.store.claim(name, owner, self.seconds)
        except StoreDown:
            return None
        except (StoreError, ValueError) as exc:
            self.store.writes_failed(f"a claim on {name}", exc)
            return None
        if holder is None:
            with self._lock:
                self._held.setdefault(name, time.monotonic())
                if self._renewer is None:
                    self._renewer = threading.Thread(target=self._renew, name="jit_ahead-claims", daemon=True)
                    self._renewer.start()
        return holder

    def release(self, name: str) -> None:
        with self._lock:
            held = self._held.pop(name, None)
        if held is None:
            return
        try:
            self.store.release(name, self.owner)
        except (StoreError, ValueError):
            pass  # it lapses by itself

    def _renew(self) -> None:
        me = threading.current_thread()
        while True:
            time.sleep(self.seconds / 3)
            with self._lock:
                if self._renewer is not me:
                    return  # forked away from the process that started it
                now = time.monotonic()
                for name in [n for n, since in self._held.items() if now - since > self.longest]:
                    del self._held[name]  # its build failed or hangs: let the claim lapse
                names = list(self._held)
            for name in names:
                try:
                    self.store.claim(name, self.owner, self.seconds)
                except (StoreError, ValueError):
                    pass  # the claim lapses; another node may build it too, no worse than without claims


_lock = threading.Lock()
_claims: dict[int, Claims] = {}


def claims_on(store: Store) -> Claims:
    """The process's claims on ``store``, with the lifetime the knobs give."""
    with _lock:
        found = _claims.get(id(store))
        if found is None or found.store is not store:
            from .. import knobs

            found = _claims[id(store)] = Claims(store, knobs.env_seconds(CLAIM_KNOB, 30.0, minimum=0.5),
                                                knobs.build_timeout_s())
        return found
