"""One running helper process (spawned, or forked by the fork server), the parent's ends of its pipes, and
how a pool slot's time with one helper ended."""
from __future__ import annotations

import enum
import logging
import os
import select
import signal
import subprocess

from .forkserver import describe_exit
from ..processes import end_tree
from .protocol import Shutdown, read_message, write_message

log = logging.getLogger("jit_ahead.pool")


class HelperEnding(enum.Enum):
    """How a slot's time with one helper ended."""

    WORKED = "worked"  # it built, then had nothing left: the slot waits for work, then starts a fresh one
    IDLE = "idle"  # nothing was queued for it (or serving needs fewer helpers): no backoff either
    REFRESH = "refresh"  # a fresh fork that has the newly preloaded modules takes its place at once
    DIED = "died"  # it died starting, importing or idle: the next start comes after a growing backoff
    CRASHED = "crashed"  # it died building: charged to that request (quarantine bounds the repeats), so
    # the next helper starts after the initial backoff only: other requests are not held up for long


class HelperProcess:
    """One running helper process (spawned, or forked by the fork server) and the parent's pipe ends."""

    def __init__(self, name: str, proc, to_helper, from_helper, *, forked: bool = False,
                 sent_preload: int = 0) -> None:
        self.name = name
        self.proc = proc  # subprocess.Popen or forkserver.ForkedProcess
        self.to_helper = to_helper
        self.from_helper = from_helper
        self.forked = forked
        self.sent_preload = sent_preload  # how many of the pool's preload modules this helper has
        self.modules: set[str] = set()  # modules it has imported (preloads, earlier jobs')

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: object) -> bool:
        try:
            write_message(self.to_helper, message)
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def ask_to_exit(self) -> bool:
        """Shutdown: an idle helper exits at once, a busy one after its build."""
        return self.send(Shutdown())

    def receive(self, timeout: float | None) -> object:
        """The next message; None at end of stream; TimeoutError if nothing came within ``timeout``."""
        if timeout is not None:
            readable, _, _ = select.select([self.from_helper], [], [], timeout)
            if not readable:
                raise TimeoutError
        return read_message(self.from_helper)

    def describe_exit(self) -> str:
        return describe_exit(self.proc)

    def wait_or_kill(self, timeout: float) -> None:
        """Wait for the process to exit; kill it with the compiler it may be running after ``timeout`` (a
        half-built entry is never published: Triton writes each cache entry atomically)."""
        if not self.exited_within(timeout):
            self.kill_tree()
            self.reap()

    def exited_within(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill_tree(self) -> None:
        end_tree(self.proc.pid)

    def reap(self) -> None:
        """After ``kill_tree``: wait for the exit to be seen."""
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            log.warning("helper %s (pid %d) did not exit after SIGKILL", self.name, self.proc.pid)

    def stop(self, grace: float) -> None:
        if self.proc.poll() is None:
            self.ask_to_exit()
            self.wait_or_kill(grace)
        for stream in (self.to_helper, self.from_helper):
            try:
                stream.close()
            except OSError:
                pass


def pause(helper: HelperProcess) -> bool:
    """Stop ``helper`` (SIGSTOP) so that an urgent build gets the CPUs; True if it was stopped. Only the
    helper itself: a compiler it runs finishes its step, and the helper still dies with its parent (the
    parent-death signal is SIGKILL, which a stopped process receives)."""
    try:
        os.kill(helper.pid, signal.SIGSTOP)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def resume(helper: HelperProcess) -> None:
    """Undo ``pause`` (SIGCONT); a helper that is gone meanwhile is left to its slot."""
    try:
        os.kill(helper.pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass
