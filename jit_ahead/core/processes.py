"""Process plumbing shared by helpers and planners: priority, dying with the parent, ending a process tree.

A jit_ahead child must never outlive the process it works for, however that process ends (return from
main, ``sys.exit``, SIGTERM, SIGKILL): on Linux the kernel delivers a signal to a child whose parent
thread exits (``PR_SET_PDEATHSIG``), and ``end_tree`` kills a child with everything it started (a
compiler it is waiting for).
"""
from __future__ import annotations

import ctypes
import errno
import gc
import logging
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
import warnings


from .unfinished_imports import forget_unfinished_imports
from .observing.own_cpu import OwnThread

log = logging.getLogger("jit_ahead.processes")

_PR_SET_PDEATHSIG = 1


def lower_priority(level: int = 19) -> None:
    try:
        os.nice(level - os.nice(0))
    except OSError as exc:
        log.warning("could not lower this process's priority to nice %d: %s", level, exc)


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when the thread that created it ends (Linux; a
    no-op elsewhere). Call it only in a process whose creating thread lives as long as it is needed:
    the signal follows that thread, not the whole parent process. Returns whether it is armed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return True


def detach_descriptors(keep: tuple[int, ...] = ()) -> None:
    """In a process forked from the server without exec: point every inherited descriptor but stdin,
    stdout, stderr and ``keep`` at /dev/null. A copy of a pipe's write end held here would keep the
    server's reader from ever seeing its end (``subprocess.Popen`` waits on such a pipe for its child's
    exec), and a listening socket held here would keep the server's port after it exits. The
    descriptors stay open (on /dev/null), so an inherited object that closes its own later closes
    nothing of ours. Character devices are kept: a GPU driver's (``/dev/nvidia*``) pointed elsewhere makes
    NVML fail in this process (NVML_ERROR_OPERATING_SYSTEM, where a plain fork of the server answers), and
    a device holds no pipe's end or port."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            if fd > 2 and fd != null and fd not in keep:
                try:
                    if not stat.S_ISCHR(os.fstat(fd).st_mode):
                        os.dup2(null, fd)
                except OSError:
                    pass  # not open (the directory listing's own descriptor, or a range guess)
    finally:
        os.close(null)


def reset_signals() -> None:
    """In a process forked from the server: the server's signal handlers are not its own. A terminal's
    Ctrl-C reaches the whole process group, and the server decides what it means; the child dies with
    the server anyway."""
    import contextlib

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def single_threaded_torch() -> None:
    """In a process forked from the server: torch's CPU thread pools sized for the server (one thread per
    CPU, spinning between ops) would make every planner compete with every other for all CPUs."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(1)
        except RuntimeError:
            pass


def _arm_compiler_child() -> None:  # runs between fork and exec in a compiler the helper starts
    die_with_parent(signal.SIGKILL)


_original_popen_init = subprocess.Popen.__init__


def compilers_die_with_this_process() -> None:
    """In a helper: every subprocess it starts from now on (Triton's ptxas, gcc for a host launcher) is
    killed by the kernel if the helper dies, so killing a helper never leaves a compiler running.
    Helpers run their builds on one thread, so the ``preexec_fn`` this adds is safe there."""
    if not sys.platform.startswith("linux") or subprocess.Popen.__init__ is not _original_popen_init:
        return

    def popen_init(self, *args, **kwargs):
        if kwargs.get("preexec_fn") is None:
            kwargs["preexec_fn"] = _arm_compiler_child
        _original_popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = popen_init


class Spawner:
    """Starts a pool's child processes from one thread that outlives all of them.

    A child arms its parent-death signal (``die_with_parent``) when it starts; the kernel sends it when
    the thread that created the child ends. Slot threads come and go (a helper retires, a slot gives up),
    so children are started from this thread instead, which lasts until ``close()`` (or the process)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._requests: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def run(self, start, *args, **kwargs):
        """``start(*args, **kwargs)`` on the spawner thread; its result, or its exception raised here."""
        with self._lock:
            if self._closed:
                raise OSError(errno.ESHUTDOWN, f"the {self._name} thread is closed")
            if self._thread is None:
                thread = OwnThread(target=self._loop, name=self._name, daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # at a thread or process limit: as a failed fork would say
                    raise OSError(errno.EAGAIN, f"cannot start the {self._name} thread ({exc})") from exc
                self._thread = thread
        done = threading.Event()
        box: dict = {}
        self._requests.put((start, args, kwargs, done, box))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _loop(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            start, args, kwargs, done, box = item
            try:
                box["value"] = start(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc
            done.set()

    def close(self) -> None:
        """End the thread: children still running get their parent-death signal; ``run`` raises OSError
        from now on."""
        with self._lock:
            self._closed = True
            if self._thread is not None:
                self._requests.put(None)


def fork_quietly() -> int:
    """``os.fork()`` without Python 3.12's warning that other threads exist: the callers' children run
    none of them, and hold none of their locks (module locks are fork_safe_lock; half-done imports are
    dropped by ``detach_from_server``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def detach_from_server(keep: tuple[int, ...]) -> None:
    """First steps of a process forked from the server without exec (a planner, the fork server): its
    inherited descriptors point at /dev/null (``keep`` aside), it dies with the thread that forked it,
    takes none of the server's signal handlers, leaves the server's objects to the server (no collection
    pass copies their pages), runs torch single-threaded, and imports afresh what other threads of the
    server were importing at the fork (``unfinished_imports``)."""
    forget_unfinished_imports()
    detach_descriptors(keep)
    die_with_parent()
    reset_signals()
    gc.freeze()
    single_threaded_torch()


class ForkedChild:
    """A child forked from this process without exec: the part of ``subprocess.Popen`` the pool uses.
    This process reaps it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = -signal.SIGKILL
            else:
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def end_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (children first listed, so none is re-parented
    unseen). Processes already gone are skipped."""
    import psutil

    try:
        root = psutil.Process(pid)
        victims = root.children(recursive=True) + [root]
    except psutil.Error:
        return
    for proc in victims:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def fork_safe_lock():
    """A lock that no other thread holds at the moment this process forks (``os.fork`` waits for it):
    a forked planner or fork server may take it without deadlocking on a copy held by a thread that does
    not exist there. For module-level locks held briefly; never fork while holding one."""
    import threading

    lock = threading.Lock()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=lock.acquire, after_in_parent=lock.release, after_in_child=lock.release)
    return lock
