"""How a pool's helper processes come to exist: forked from a fork server (started on first need, fed the
preload list, replaced when it dies, closed when idle), or spawned as fresh interpreters when forking is off
or failed; and the list of modules every helper imports before it builds."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from ..observing import events
from ..device_view import DeviceView, ViewOnDemand
from .forkserver import ForkServer, ForkServerGone, describe_exit
from .helper_env import start_helper_process
from .helper_process import HelperProcess, HelperEnding
from ..processes import Spawner
from .protocol import Configure, Preload, PreloadDone, ProtocolError, Ready
from ..observing.stats import Stats

log = logging.getLogger("jit_ahead.pool")

HELPER_ENTRY = "jit_ahead_helpers.worker"
# The fork server exits once no helper has run for this long (it holds the imported libraries); the next
# build starts a new one.
FORKSERVER_IDLE_S = 30.0


class HelperStarter:
    """Starts helpers for one family's pool. ``start_mode``: "server" forks them from a fork server that is a
    fork of this process (made before serving starts; everything the server imported is there already),
    "fork" from a fork server started as a fresh interpreter, "spawn" starts each as its own interpreter
    (also the fallback once the fork server fails; the pool checks the mode). ``closed`` and ``serving``
    are the pool's: no helper starts once it closes, and no fork of the server is made once serving
    started."""

    def __init__(self, family_name: str, builder: str, stats: Stats, *, env: dict[str, str],
                 device_view: DeviceView | ViewOnDemand | None, start_mode: str, start_timeout: float,
                 build_timeout: float, closed: threading.Event, serving: threading.Event,
                 python: str = sys.executable, max_forkserver_deaths: int = 3,
                 preloads: Callable[[], tuple[str, ...]] = tuple) -> None:
        self._family = family_name
        self._builder = builder
        self._stats = stats
        self._env = env
        self._device_view = device_view
        self._python = python
        self._start_timeout = start_timeout
        self._build_timeout = build_timeout
        self._closed = closed
        self._serving = serving
        self._lock = threading.Lock()
        self._preloads = preloads  # the modules every helper imports, in the order asked: the pool's
        self._bad_preloads: set[str] = set()
        self._forking = start_mode in ("server", "fork") and hasattr(os, "fork")
        self._fork_from_server = start_mode == "server"  # off after serving starts, or if it failed
        self._forkserver: ForkServer | None = None
        self._forkserver_lock = threading.Lock()  # held while it starts or imports
        self._forkserver_preloaded = 0  # how many of self._preload the fork server has imported
        self._forkserver_deaths = 0
        self._max_forkserver_deaths = max_forkserver_deaths  # then every helper is spawned
        self._spawner = Spawner(f"jit_ahead-{family_name}-spawner")  # starts every process of this pool

    # -- the preload list -------------------------------------------------------------------------------
    def missing_modules(self, helper: HelperProcess, modules) -> set[str]:
        """Of ``modules``, those the helper has not imported and that may still be preloaded."""
        with self._lock:
            return set(modules) - helper.modules - self._bad_preloads

    def forks_with(self, modules) -> bool:
        """Whether a helper forked now has ``modules`` imported: the fork server runs and imported them."""
        with self._lock:
            server = self._forkserver
            imported = set(self._preloads()[:self._forkserver_preloaded]) - self._bad_preloads
        return server is not None and server.alive and set(modules) <= imported

    def bring_up_to_date(self, helper: HelperProcess) -> HelperEnding | None:
        """Bring the helper's imports up to the preload list. A forked helper is replaced by a fresh fork
        once the fork server has imported the new modules (REFRESH); a spawned one imports them itself.
        DIED if it died importing them; None when it is up to date."""
        names = self._preloads()
        with self._lock:
            new = tuple(m for m in names[helper.sent_preload:] if m not in self._bad_preloads)
            if not helper.forked:
                helper.sent_preload = len(names)
        if not new:
            return None
        if helper.forked:
            self.refresh_forkserver()
            return HelperEnding.REFRESH
        t0 = time.perf_counter()
        failed: dict[str, str] = {}
        for module in new:  # one at a time: a module whose import kills the helper is the only one blamed
            reply = None
            if helper.send(Preload((module,))):
                try:
                    reply = helper.receive(self._build_timeout)
                except (TimeoutError, ProtocolError):
                    helper.proc.kill()
            if not isinstance(reply, PreloadDone):
                # It died importing this one: never preload it again; a build that needs it imports it
                # inside the job, where a crash is charged to that request (and can quarantine it).
                with self._lock:
                    self._bad_preloads.add(module)
                log.warning("%s %s (pid %d) died while preloading %s (%s); it will not be preloaded",
                            self._family, helper.name, helper.pid, module, helper.describe_exit())
                return HelperEnding.DIED
            failed.update(reply.failed)
            if module not in reply.failed:
                helper.modules.add(module)
        self._report_preload(helper.name, new, PreloadDone(failed), t0)
        return None

    # -- helpers ----------------------------------------------------------------------------------------
    def start(self, name: str) -> HelperProcess | None:
        """A new helper that has said Ready; None (logged) if none could be started."""
        if self._forking and not self._closed.is_set():
            try:
                return self._fork_helper(name)
            except ForkServerGone as exc:
                self.stop_forking(f"the fork server {exc}")
        if self._closed.is_set():  # closing (the fork server is gone for that reason): no new helper
            return None
        return self._spawn_helper(name)

    def _spawn_helper(self, name: str) -> HelperProcess | None:
        t0 = time.perf_counter()
        try:
            config = self._configure_message()  # before the process exists: nothing to clean up if it fails
        except OSError as exc:
            log.error("%s %s could not be started (%s); retrying with backoff", self._family, name, exc)
            return None
        to_parent_r, to_parent_w = os.pipe()
        to_helper_r, to_helper_w = os.pipe()
        try:
            proc = self._spawner.run(start_helper_process, self._python, HELPER_ENTRY, (to_helper_r, to_parent_w),
                                     self._env)
        except OSError as exc:
            for fd in (to_parent_r, to_parent_w, to_helper_r, to_helper_w):
                os.close(fd)
            log.error("%s %s could not be started (%s); retrying with backoff", self._family, name, exc)
            return None
        os.close(to_helper_r)
        os.close(to_parent_w)
        helper = HelperProcess(name, proc, os.fdopen(to_helper_w, "wb", buffering=0),
                               os.fdopen(to_parent_r, "rb", buffering=0))
        if not helper.send(config):
            return self._handshake(helper, t0, None)
        return self._handshake(helper, t0, self._start_timeout)

    def _fork_helper(self, name: str) -> HelperProcess | None:
        """A helper forked from the fork server, which has imported everything preloaded so far."""
        with self._forkserver_lock:
            server = self._forkserver_with_preloads()
            t0 = time.perf_counter()
            proc, to_helper, from_helper = server.fork(name)
            helper = HelperProcess(name, proc, to_helper, from_helper, forked=True,
                                   sent_preload=self._forkserver_preloaded)
            names = self._preloads()
            with self._lock:
                helper.modules = set(names[:self._forkserver_preloaded]) - self._bad_preloads
        return self._handshake(helper, t0, self._start_timeout)

    def _handshake(self, helper: HelperProcess, t0: float, timeout: float | None) -> HelperProcess | None:
        """Wait for the helper's Ready; None (and the helper stopped) if it does not come."""
        ready = None
        if timeout is not None:
            try:
                ready = helper.receive(timeout)
            except (TimeoutError, ProtocolError, EOFError):
                ready = None
        if self._closed.is_set():  # closing began while it started: it takes no work, and says nothing
            helper.stop(0.0)
            return None
        if not isinstance(ready, Ready):
            reason = "no handshake" if ready is None else f"unexpected {type(ready).__name__}"
            log.error("%s %s (pid %d) failed to start: %s, %s", self._family, helper.name, helper.pid, reason,
                      helper.describe_exit() if helper.proc.poll() is not None else "killed")
            helper.stop(0.0)
            return None
        self._stats.emit(events.HelperReady(family=self._family, helper=helper.name, pid=helper.pid,
                                            seconds=time.perf_counter() - t0, info=ready.info))
        log.debug("%s %s ready (pid %d) in %.2fs", self._family, helper.name, helper.pid, time.perf_counter() - t0)
        return helper

    def _configure_message(self) -> Configure:
        """Raises OSError when the GPU's view cannot be read (it is read the first time it is needed)."""
        try:
            view = self._device_view.get() if isinstance(self._device_view, ViewOnDemand) else self._device_view
        except Exception as exc:  # a GPU in an error state, a broken driver: a start failure, retried
            raise OSError(f"cannot read the GPU's properties for helpers ({type(exc).__name__}: {exc})") from exc
        return Configure(sys_path=tuple(sys.path), builder=self._builder, device_view=view)

    # -- the fork server --------------------------------------------------------------------------------
    def _forkserver_with_preloads(self) -> ForkServer:
        """The running fork server, started if need be, having imported every module preloaded so far.
        Called with _forkserver_lock held; raises ForkServerGone."""
        server = self._forkserver
        if self._closed.is_set() or not self._forking:
            raise ForkServerGone("is not started: the pool is closing or retired")
        if server is not None and not server.alive:
            log.warning("%s: the fork server (pid %d) exited (%s)", self._family, server.process.pid,
                        describe_exit(server.process))
            self._forkserver_died(server)
            server = None
        if server is None:
            self._forkserver_preloaded = 0  # a new fork server imports every (good) preload module again
            server, ready, t0 = self._start_forkserver()
            self._stats.emit(events.ForkServerReady(family=self._family, helper="forkserver", pid=ready.pid,
                                                    seconds=time.perf_counter() - t0, info=ready.info))
            with self._lock:
                keep = self._forking
                if keep:
                    self._forkserver = server
            if not keep:  # closed while it started
                server.close(0.0)
                raise ForkServerGone("is not needed any more: the pool is closing or retired")
        names = self._preloads()
        with self._lock:
            upto = len(names)
            new = tuple(m for m in names[self._forkserver_preloaded:upto] if m not in self._bad_preloads)
        if new:
            t0 = time.perf_counter()
            failed: dict[str, str] = {}
            for module in new:  # one at a time: a module whose import kills it is the only one blamed
                try:
                    failed.update(server.preload((module,)).failed)
                except ForkServerGone as exc:
                    # It died importing this one: never preload it again (a build that needs it imports it
                    # inside the job, where a crash is charged to that request); start a new fork server.
                    with self._lock:
                        self._bad_preloads.add(module)
                    log.warning("%s: the fork server died while preloading %s (%s); it will not be preloaded",
                                self._family, module, exc)
                    self._forkserver_died(server)
                    return self._forkserver_with_preloads()
            self._report_preload("forkserver", new, PreloadDone(failed), t0, event=events.ForkServerPreloaded)
        self._forkserver_preloaded = upto
        return server

    def _start_forkserver(self) -> tuple[ForkServer, object, float]:
        """A fork of this process while serving has not started (a fork then copies the serving
        process's page tables with its GIL held), else, or if that fails, a fresh interpreter. Called
        with _forkserver_lock held; raises ForkServerGone."""
        try:
            config = self._configure_message()
        except OSError as exc:
            raise ForkServerGone(f"could not be started ({exc})") from exc
        from_server = self._fork_from_server and not self._serving.is_set()
        server = ForkServer(python=self._python, env=self._env, start_timeout=self._start_timeout,
                            build_timeout=self._build_timeout, spawner=self._spawner, from_server=from_server)
        t0 = time.perf_counter()
        try:
            return server, server.start(config), t0
        except ForkServerGone as exc:
            if not from_server:
                raise
            self._fork_from_server = False
            log.warning("%s: a fork of this process could not become the fork server (%s); a fresh "
                        "interpreter takes its place", self._family, exc)
        server = ForkServer(python=self._python, env=self._env, start_timeout=self._start_timeout,
                            build_timeout=self._build_timeout, spawner=self._spawner)
        t0 = time.perf_counter()
        return server, server.start(config), t0

    def _forkserver_died(self, server: ForkServer) -> None:
        """Count a fork server's death and forget it (its helpers run on; new ones come from a new fork
        server); raises ForkServerGone once it has died too often. Called with _forkserver_lock held."""
        self._forkserver_deaths += 1
        server.close(0.0)
        if self._forkserver_deaths >= self._max_forkserver_deaths:
            raise ForkServerGone(f"exited {self._forkserver_deaths} times")
        self._forkserver = None

    def refresh_forkserver(self) -> None:
        """Have the fork server import what was preloaded since; stop forking if it cannot."""
        try:
            with self._forkserver_lock:
                self._forkserver_with_preloads()
        except ForkServerGone as exc:
            self.stop_forking(f"the fork server {exc}")

    def stop_forking(self, why: str) -> None:
        with self._forkserver_lock:
            if not self._forking:
                return
            self._forking = False
        if not self._closed.is_set():
            log.error("%s: %s; starting each helper as its own process from now on", self._family, why)
        self.close_forkserver(0.0)

    def close_forkserver(self, grace: float) -> None:
        """Close the fork server for good: helpers are spawned from now on (the pool is closing, no slot
        is left, or forking failed). Not under _forkserver_lock, which a slot holds while the fork server
        imports: a slot still using this server sees its requests fail."""
        with self._lock:
            server, self._forkserver = self._forkserver, None
            self._forking = False
        if server is not None:
            server.close(grace)

    def close_idle_forkserver(self, pool_idle: Callable[[], bool]) -> None:
        """The fork server exits while ``pool_idle()`` (no helper running or starting, none for
        FORKSERVER_IDLE_S): its imports go with it; the next build starts a new one."""
        with self._lock:
            if self._forkserver is None:
                return
        if not pool_idle() or not self._forkserver_lock.acquire(blocking=False):  # a slot is using it
            return
        try:
            if not pool_idle():
                return
            with self._lock:
                server, self._forkserver = self._forkserver, None
            if server is not None:
                log.info("%s: no helper for %.0fs; the fork server exits", self._family, FORKSERVER_IDLE_S)
                self._stats.emit(events.ForkServerIdleExit(family=self._family))
                server.close(1.0)
        finally:
            self._forkserver_lock.release()

    def close_spawner(self) -> None:
        """The thread every process of this pool was started from ends (after the pool's slots: a process
        started later would have none to start it)."""
        self._spawner.close()

    def _report_preload(self, who: str, modules: tuple[str, ...], reply: PreloadDone, t0: float,
                        event: type[events.HelperPreloaded] = events.HelperPreloaded) -> None:
        for module, error in reply.failed.items():
            log.warning("%s %s could not preload %s (%s); its builds will report the error",
                        self._family, who, module, error)
        self._stats.emit(event(family=self._family, helper=who, modules=len(modules),
                               failed=sorted(reply.failed), seconds=time.perf_counter() - t0))
