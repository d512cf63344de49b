"""The pool's side of the fork server (``jit_ahead_helpers.forkserver``).

One helper-like process has the builder and the kernel libraries imported; every helper is then forked
from it, ready in milliseconds, instead of fifteen interpreters importing torch and a kernel library
while the server loads its model. By default the fork server is itself a fork of the server, made
before serving starts: it has everything the server imported (the kernel libraries planning ran), so
the first build starts at once instead of after seconds of imports. It touches nothing of the
server's: no GPU (the device view is pinned), none of its descriptors, threads or signal handlers.
Otherwise (``JIT_AHEAD_HELPER_START=fork``, after serving started, or if that fork failed) it is a
fresh interpreter that imports what helpers need. The pool still talks to each helper over its own two
pipes, exactly as with a spawned one; only starting, waiting and killing go through ``ForkedProcess``.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import threading
import time
import traceback

from .helper_env import start_helper_process
from ..observing.own_cpu import OwnThread
from ..processes import ForkedChild, Spawner, detach_from_server, fork_quietly
from .protocol import (Configure, Exited, Fork, Forked, Preload, PreloadDone, ProtocolError, Ready, Shutdown,
                       read_message, write_message)

log = logging.getLogger("jit_ahead.pool")

FORKSERVER_ENTRY = "jit_ahead_helpers.forkserver"


class ForkServerGone(RuntimeError):
    pass


class ForkedProcess:
    """A helper forked by the fork server: the part of ``subprocess.Popen`` the pool uses. The fork
    server reaps it and reports its exit status. It is also held by a pidfd, opened when the fork server
    says it forked it: once the fork server is gone, the helper is reaped by someone else and its pid may
    be given to another process, which the pidfd tells apart (it refers to this helper alone)."""

    def __init__(self, pid: int, server: "ForkServer") -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._server = server
        self._exited = threading.Event()
        self._pidfd = _open_pidfd(pid)
        self._opened_by = os.getpid()  # a fork of this process has the object, not the descriptor's number
        self._pidfd_lock = threading.Lock()

    def _set_exit(self, returncode: int) -> None:
        self.returncode = returncode
        self._exited.set()
        self._close_pidfd()

    def __del__(self) -> None:  # a helper whose exit nobody saw: its descriptor goes with this object
        if os.getpid() == self._opened_by:  # in a fork, that number was closed at the fork and may be reused
            self._close_pidfd()

    def _close_pidfd(self) -> None:
        with self._pidfd_lock:
            fd, self._pidfd = self._pidfd, None
        if fd is not None:
            os.close(fd)

    def _gone_unreported(self) -> bool:
        """Its reaper (the fork server) is gone, and so is it."""
        with self._pidfd_lock:
            if self._pidfd is not None:
                return _pidfd_exited(self._pidfd)
        return not _pid_running(self.pid)  # no pidfd (an old kernel): the pid is all there is

    def poll(self) -> int | None:
        if not self._exited.is_set() and not self._server.alive and self._gone_unreported():
            self._set_exit(-signal.SIGKILL)  # its reaper is gone; the status is lost with it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"forked helper {self.pid}", timeout)
            self._exited.wait(0.1 if left is None else min(0.1, left))
        return self.returncode

    def kill(self) -> None:
        if self.poll() is not None:
            return
        with self._pidfd_lock:
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)  # this helper, whoever has its pid
                else:
                    os.kill(self.pid, signal.SIGKILL)  # still unreaped (poll said so), so still this helper's
            except ProcessLookupError:
                pass


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux 5.3 and later), or None. Opened as the fork server reports the fork, while
    the helper is its unreaped child, so the descriptor is the helper's."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _pidfd_exited(fd: int) -> bool:
    """A pidfd polls readable once its process has exited."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _pid_running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _fork_from_server(fd: int, env: dict[str, str]) -> int:
    """Fork this process into a fork server on socket ``fd``; returns its pid. Runs on the pool's
    spawner thread, so the child's parent-death signal follows that thread (and the server)."""
    pid = fork_quietly()
    if pid:
        return pid
    code = 1
    try:
        detach_from_server(keep=(fd,))
        os.dup2(2, 1)  # helpers print to stderr, never to the server's stdout (as spawned ones do)
        os.environ.clear()
        os.environ.update(env)
        # the helpers' entry point by name, as a spawned fork server runs it (``-m``): helpers build on
        # the core, never the other way round
        code = importlib.import_module(FORKSERVER_ENTRY).serve(fd, forked_from_server=True)
    except BaseException:  # noqa: BLE001 - it must never return into the server's code
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        os._exit(code)


class ForkServer:
    """Start with ``start()``; ``preload()`` and ``fork()`` may be called from any slot thread.
    ``from_server``: the fork server is a fork of this process, else a fresh interpreter."""

    def __init__(self, *, python: str, env: dict[str, str], start_timeout: float, build_timeout: float,
                 spawner: Spawner | None = None, from_server: bool = False) -> None:
        self._spawner = spawner or Spawner("jit_ahead-forkserver-spawner")
        self.from_server = from_server
        self._python = python
        self._env = env
        self._start_timeout = start_timeout
        self._build_timeout = build_timeout
        self._request_lock = threading.Lock()  # one request at a time; its reply comes through _replies
        self._replies: queue.Queue = queue.Queue()
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}  # Exited that came before the Forked reply was handled
        self._children_lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._outbox = None
        self._gone = threading.Event()
        self._closing = False  # set once close() asks it to exit

    @property
    def process(self) -> subprocess.Popen | None:
        return self._proc

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._gone.is_set() and self._proc.poll() is None

    def start(self, config: Configure) -> Ready:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.from_server:
                self._proc = ForkedChild(self._spawner.run(_fork_from_server, theirs.fileno(), self._env))
            else:
                self._proc = self._spawner.run(start_helper_process, self._python, FORKSERVER_ENTRY,
                                               (theirs.fileno(),), self._env)
        except OSError as exc:
            ours.close()
            raise ForkServerGone(f"could not be started ({exc})") from exc
        finally:
            theirs.close()
        self._sock = ours
        self._outbox = ours.makefile("wb")
        OwnThread(target=self._read_loop, args=(ours.makefile("rb", buffering=0),), daemon=True,
                  name="jit_ahead-forkserver-reader").start()
        try:
            ready = self._request(config, self._start_timeout)
        except ForkServerGone:
            self.close(0.0)  # a server killed for its silence is reaped here, not left a zombie child
            raise
        if not isinstance(ready, Ready):
            self.close(0.0)
            raise ForkServerGone(f"no handshake (got {type(ready).__name__})")
        return ready

    def preload(self, modules: tuple[str, ...]) -> PreloadDone:
        reply = self._request(Preload(modules), self._build_timeout)
        if not isinstance(reply, PreloadDone):
            raise ForkServerGone(f"unexpected {type(reply).__name__} to Preload")
        return reply

    def fork(self, name: str):
        """A new helper: (ForkedProcess, pipe to it, pipe from it). It sends Ready on its own pipe."""
        to_helper_r, to_helper_w = os.pipe()
        from_helper_r, from_helper_w = os.pipe()
        try:
            reply = self._request(Fork(name), self._start_timeout, fds=(to_helper_r, from_helper_w))
        except ForkServerGone:
            os.close(to_helper_w)
            os.close(from_helper_r)
            raise
        finally:
            os.close(to_helper_r)
            os.close(from_helper_w)
        if not isinstance(reply, Forked):
            raise ForkServerGone(f"unexpected {type(reply).__name__} to Fork")
        child = ForkedProcess(reply.pid, self)
        with self._children_lock:
            early = self._early_exits.pop(reply.pid, None)
            if early is None:
                self._children[reply.pid] = child
        if early is not None:  # it died before its Forked reply was read
            child._set_exit(early)
        return child, os.fdopen(to_helper_w, "wb", buffering=0), os.fdopen(from_helper_r, "rb", buffering=0)

    def close(self, grace: float) -> None:
        """Ask the fork server to exit (its helpers are stopped first by the pool); kill it after grace."""
        if self._proc is None:
            return
        self._closing = True
        if self._proc.poll() is None:
            # A request in flight (an import) holds the lock: then there is nothing to wait for; kill.
            if self._request_lock.acquire(timeout=0.1):
                try:
                    write_message(self._outbox, Shutdown())
                except (OSError, ValueError):
                    grace = 0.0
                finally:
                    self._request_lock.release()
            else:
                grace = 0.0
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                # the server only: its helpers outlive it (the pool stops those it knows itself, and one
                # whose Forked reply was lost ends when its pipes close or the pool's process goes)
                self._proc.kill()
                self._proc.wait()
        self._gone.set()
        for part in (self._outbox, self._sock):
            try:
                part.close()
            except OSError:
                pass

    # -- internals --------------------------------------------------------------------------------------
    def _request(self, message, timeout: float, fds: tuple[int, ...] = ()):
        with self._request_lock:
            if self._gone.is_set():
                raise ForkServerGone("it has exited")
            try:
                write_message(self._outbox, message)
                if fds:
                    socket.send_fds(self._sock, [b"F"], list(fds))
            except (OSError, ValueError) as exc:
                raise ForkServerGone(f"its socket is closed ({exc})") from exc
            try:
                reply = self._replies.get(timeout=timeout)
            except queue.Empty:
                self._proc.kill()
                raise ForkServerGone(f"no reply to {type(message).__name__} within {timeout:.0f}s; killed")
            if reply is None:
                raise ForkServerGone(f"exited ({self._describe_exit()})")
            return reply

    def _read_loop(self, inbox) -> None:
        try:
            while True:
                message = read_message(inbox)
                if message is None:
                    break
                if isinstance(message, Exited):
                    with self._children_lock:
                        child = self._children.pop(message.pid, None)
                        if child is None:
                            self._early_exits[message.pid] = message.returncode
                    if child is not None:
                        child._set_exit(message.returncode)
                else:
                    self._replies.put(message)
        except (ProtocolError, OSError, ValueError) as exc:
            if self._closing:  # it exits on our Shutdown; a reset then is its socket closing, not a fault
                log.debug("fork server: control stream closed while shutting down (%s)", exc)
            else:
                log.error("fork server: broken control stream (%s)", exc)
        finally:
            self._gone.set()
            self._replies.put(None)  # wakes a request waiting for its reply

    def _describe_exit(self) -> str:
        return describe_exit(self._proc)


def describe_exit(proc) -> str:
    """How a helper process (spawned or forked) ended, waiting a little for it."""
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
