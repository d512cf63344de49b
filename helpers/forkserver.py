"""The fork server: ``python -m jit_ahead_helpers.forkserver SOCKET_FD``.

Starting fifteen helpers that each import torch, Triton and a kernel library costs fifteen imports at
the moment the server is loading its own model. The fork server imports once (Configure, then each
Preload) and forks ready helpers on request (Fork): each is ready in milliseconds and shares the
imported pages copy-on-write. The server's control socket carries framed messages both ways, each
new helper's two pipe ends (SCM_RIGHTS), and Exited notices for the helpers this process reaps.

The fork server keeps no threads of its own, so forking is safe; a helper starts with the same nice 19,
hidden GPU and device view, and runs the same loop as a spawned one (``worker.serve``). Helpers end with
the pool's process, not with the fork server.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
import time
import traceback

from jit_ahead.core import processes
from jit_ahead.core.building.protocol import (Configure, Exited, Fork, Forked, Preload, Ready, Shutdown, read_message,
                                     write_message)
from jit_ahead_helpers import worker

log = logging.getLogger("jit_ahead.helper.forkserver")

_POLL_S = 0.2  # how often the server checks its own parent while idle


class _ChildExits:
    """Wakes the server's select when a helper exits (SIGCHLD through a wakeup pipe), so its Exited
    notice goes out at once rather than at the next poll: the pool waits for it when it stops helpers."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        for fd in (self.read_fd, self._write_fd):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler, so the wakeup fd is written
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except BlockingIOError:
            pass

    def close_in_child(self) -> None:
        """In a forked helper: its own children (compilers) are none of this server's business."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.read_fd)
        os.close(self._write_fd)


class _Control:
    """The fork server's end of its socket: exact reads (so the byte carrying a helper's descriptors is
    never read as data) and whole-message writes."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.inbox = self.sock.makefile("rb", buffering=0)
        self.outbox = self.sock.makefile("wb")

    def receive(self):
        return read_message(self.inbox)

    def close(self) -> None:
        for part in (self.inbox, self.outbox, self.sock):  # the descriptor closes with the last of them
            part.close()

    def send(self, message) -> None:
        write_message(self.outbox, message)

    def receive_fds(self, count: int) -> list[int]:
        _, fds, _, _ = socket.recv_fds(self.sock, 1, count)
        if len(fds) != count:
            for fd in fds:
                os.close(fd)
            raise RuntimeError(f"expected {count} descriptors with a Fork, got {len(fds)}")
        return fds


def _reap(control: _Control) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(Exited(pid, os.waitstatus_to_exitcode(status)))


def _run_helper(control: _Control, exits: _ChildExits, inbox_fd: int, outbox_fd: int, builder,
                prepared: dict, pool_pid: int) -> int:
    """In the forked child: become an ordinary helper on the two pipes the pool made for it. It lives as
    long as the pool's process, not as long as the fork server: a fork server that dies (killed, out of
    memory) must not take builds in progress with it, which would charge their variants with a crash."""
    t0 = time.perf_counter()
    control.close()  # the fork server's channel is not the helper's business
    exits.close_in_child()
    worker.set_up_logging(force=True)
    worker.exit_with_parent(pool_pid)
    inbox = os.fdopen(inbox_fd, "rb", buffering=0)
    outbox = os.fdopen(outbox_fd, "wb", buffering=0)
    write_message(outbox, Ready(os.getpid(), time.perf_counter() - t0,
                                {**worker.describe_self(), **prepared, "forked_from": os.getppid()}))
    return worker.serve(inbox, outbox, builder)


def os_threads() -> list[str]:
    """This process's OS threads by name. The fork server starts none; a library's import may (a thread
    pool of a native library): they are not copied into a fork, and a helper only compiles."""
    try:
        return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    except OSError:
        return []


def _fork(control: _Control, exits: _ChildExits, builder, prepared: dict, pool_pid: int) -> None:
    inbox_fd, outbox_fd = control.receive_fds(2)
    prepared = {**prepared, "forkserver_threads": os_threads()}
    pid = processes.fork_quietly()  # the threads a library's import started are reported in Ready instead
    if pid == 0:
        code = 1
        try:
            code = _run_helper(control, exits, inbox_fd, outbox_fd, builder, prepared, pool_pid)
        except SystemExit as exc:  # a start-up failure that explains itself in one line
            print(exc, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - a helper must never return into the fork server's loop
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(inbox_fd)
    os.close(outbox_fd)
    control.send(Forked(pid))


def main(argv: list[str]) -> int:
    return serve(int(argv[1]))


def serve(fd: int, forked_from_server: bool = False) -> int:
    """The fork server's loop on control socket ``fd``; ``forked_from_server``: this process is a fork of
    the server (jit_ahead.core.building.forkserver), which already has the builder and the libraries imported."""
    worker.set_up_logging(force=forked_from_server)
    # An import can keep the loop below from checking its parent for seconds: the kernel ends the fork
    # server when the pool's spawner thread (or the whole server) ends, and its helpers with it.
    processes.die_with_parent()
    worker.lower_priority()
    parent = os.getppid()
    if parent == 1:
        return 0  # the server ended before the signal was armed
    control = _Control(fd)
    config = control.receive()
    if not isinstance(config, Configure):
        log.error("expected Configure first, got %r", type(config).__name__)
        return 2
    t0 = time.perf_counter()
    builder, prepared = worker.configure(config, pinned=forked_from_server)
    prepared = {**prepared, "forked_from_server": forked_from_server}
    control.send(Ready(os.getpid(), time.perf_counter() - t0, {**worker.describe_self(), **prepared}))
    exits = _ChildExits()
    while True:
        readable, _, _ = select.select([control.sock, exits.read_fd], [], [], _POLL_S)
        exits.drain()
        _reap(control)
        if os.getppid() != parent:
            return 0  # the server is gone; our helpers watch it too and end with it
        if control.sock not in readable:
            continue
        message = control.receive()
        if message is None or isinstance(message, Shutdown):
            return 0
        if isinstance(message, Preload):
            control.send(worker.preload(message.modules))
        elif isinstance(message, Fork):
            _fork(control, exits, builder, prepared, parent)
        else:
            log.error("ignoring unexpected message %r", type(message).__name__)


if __name__ == "__main__":
    # No interpreter teardown (a second or more with torch and a kernel library imported): a helper has
    # nothing to flush but its stderr, and the pool is waiting for it to go.
    status = main(sys.argv)
    sys.stderr.flush()
    os._exit(status)
