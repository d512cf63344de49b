"""A store on a Redis server (``JIT_AHEAD_STORE=redis://host:port/db``; the ``[redis]`` extra). Each entry is
one key (``jit_ahead:<name>``) set in one command, so a reader sees no entry or a whole one.

Every command waits at most ``JIT_AHEAD_STORE_TIMEOUT_S`` (default 2 s) for the server, connecting
included: a server that is down, stopped or slow costs a node at most that once. From the first command
that fails so, the store is down for the rest of the process (one line): lookups miss at once and nothing
is published, and the node goes on as without a store.
"""
from __future__ import annotations

import logging
import threading

from .base import Store, StoreDown, StoreError, check_name, frame, unframe

log = logging.getLogger("jit_ahead.store")

PREFIX = "jit_ahead:"
CLAIMS = "jit_ahead-claim:"  # apart from entries: a prefix of names() never lists a claim
# KEYS[1] the claim, ARGV[1] the owner, ARGV[2] its lifetime in ms; returns nil when the owner holds it now,
# else who does. A claim whose holder stops renewing it lapses by Redis's own expiry.
_CLAIM = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return nil end
local held = redis.call('get', KEYS[1])
if held == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return nil end
return held
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
TIMEOUT_KNOB = "JIT_AHEAD_STORE_TIMEOUT_S"
MAX_ENTRY_BYTES = 512 << 20  # Redis's own limit for a value


class RedisStore(Store):
    def __init__(self, url: str, timeout: float) -> None:
        import redis  # the [redis] extra: asked for by JIT_AHEAD_STORE only

        self.url = url
        self._errors = (redis.RedisError, OSError)
        self._client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                            retry_on_timeout=False)
        self._down: str | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.url

    def _command(self, name: str, call):
        if self._down is not None:
            raise StoreDown(f"{name}: the store is down ({self._down})")
        try:
            return call()
        except self._errors as exc:
            with self._lock:
                first = self._down is None
                self._down = self._down or f"{type(exc).__name__}: {exc}"
            if first:
                log.warning("jit_ahead store %s did not answer (%s); it is not asked again by this process, which "
                            "goes on without it", self.url, self._down)
            raise StoreDown(f"{name}: the store is down ({self._down})") from None

    def get(self, name: str) -> bytes | None:
        key = PREFIX + check_name(name)
        if self._down is not None:
            return None  # one line said so: lookups miss at once
        data = self._command(name, lambda: self._client.get(key))
        return None if data is None else unframe(name, data)

    def claim(self, name: str, owner: str, seconds: float) -> str | None:
        key = CLAIMS + check_name(name)
        if self._down is not None:
            raise StoreDown(f"{name}: the store is down ({self._down})")
        ms = max(1, int(seconds * 1000))
        # taken when free (SET NX), renewed when ours: one script, so no other taker comes in between
        held = self._command(name, lambda: self._client.eval(_CLAIM, 1, key, owner, ms))
        return None if held is None else held.decode(errors="replace")

    def release(self, name: str, owner: str) -> None:
        key = CLAIMS + check_name(name)
        if self._down is None:
            self._command(name, lambda: self._client.eval(_RELEASE, 1, key, owner))

    def names(self, prefix: str) -> list[str]:
        pattern = PREFIX + check_name(prefix) + "/*"
        if self._down is not None:
            return []
        # SCAN, not KEYS: a large store is listed in steps without holding the server up for the others
        keys = self._command(prefix, lambda: list(self._client.scan_iter(match=pattern, count=1000)))
        return [key.decode()[len(PREFIX):] for key in keys if b"/" not in key[len(PREFIX) + len(prefix) + 1:]]

    def put(self, name: str, data: bytes) -> None:
        framed = frame(data)
        if len(framed) > MAX_ENTRY_BYTES:
            raise StoreError(f"{name}: {len(framed)} bytes, more than a Redis value holds")
        self._command(name, lambda: self._client.set(PREFIX + check_name(name), framed))
