"""A helper subprocess: ``python -m jit_ahead_helpers.worker READ_FD WRITE_FD``.

It lowers its own priority to nice 19, reads a Configure message, imports and warms up the family's
builder, answers Ready, then builds one job at a time until Shutdown or until the pool's end of the
pipe closes. A failed build is reported in its reply and never ends the helper.
"""
from __future__ import annotations

import importlib
import logging
import os
import select
import sys
import threading
import time
import traceback

from jit_ahead.core import device_view, processes
from jit_ahead.core.building.helper_env import SINGLE_THREADED, is_scrubbed
from jit_ahead.core.building.protocol import (Configure, Job, JobDone, JobTaken, Preload, PreloadDone, Ready, Shutdown, read_message,
                                     write_message)
from jit_ahead.core.requests import BuildResult

log = logging.getLogger("jit_ahead.helper")


def lower_priority() -> None:
    processes.lower_priority(19)


def exit_with_parent(pool_pid: int) -> None:
    """Exit as soon as the pool's process ``pool_pid`` is gone, even while a long build keeps us from
    reading the pipe. A forked helper watches the pool's process, not its own parent (the fork server):
    a fork server that dies leaves its helpers building, and their results still reach the pool."""
    def watch() -> None:
        try:
            pidfd = os.pidfd_open(pool_pid)
        except ProcessLookupError:
            os._exit(0)
        except (AttributeError, OSError):  # no pidfd (old kernel): look once a second
            pidfd = None
        if pidfd is not None:
            try:
                watcher = select.poll()  # not select(): the descriptor may be above 1023
                watcher.register(pidfd, select.POLLIN)
                watcher.poll()  # readable once the process has exited
                os._exit(0)
            except (OSError, ValueError):
                pass  # look once a second instead
        while True:
            time.sleep(1.0)
            try:
                os.kill(pool_pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # the pid is someone else's now: ours is gone
                os._exit(0)

    try:
        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    except RuntimeError as exc:  # at a thread or process limit: this helper could outlive its server
        raise SystemExit(f"jit_ahead helper {os.getpid()}: cannot start its parent watch ({exc}); exiting") from None


def preload(modules) -> PreloadDone:
    failed = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken kernel module fails its own builds, not the helper
            failed[name] = f"{type(exc).__name__}: {exc}"
    return PreloadDone(failed)


def describe_self() -> dict:
    """What the pool and tests check about a helper's isolation."""
    view = device_view.installed()
    return {"nice": os.nice(0), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "launcher_vars": sorted(k for k in os.environ if is_scrubbed(k)),
            "thread_pools": {k: os.environ.get(k) for k in SINGLE_THREADED},
            "device_view": view.name if view else None}


def _build(builder, job: Job) -> JobDone:
    key = job.request.key
    t0 = time.perf_counter()
    try:
        details = builder.build(job.request.payload) or {}
        return JobDone(job.job_id, BuildResult(key, True, time.perf_counter() - t0, "", None, details))
    except Exception as exc:
        error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8)).rstrip()
        return JobDone(job.job_id, BuildResult(key, False, time.perf_counter() - t0, "", error))


def set_up_logging(force: bool = False) -> None:
    """Log lines name this helper's pid; ``force`` replaces a forked parent's set-up (and its pid)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=force,
                        format=f"[jit_ahead helper {os.getpid()}] %(levelname)s %(name)s: %(message)s")


def configure(config: Configure, pinned: bool = False):
    """Take on the server's import path and GPU view, import the family's builder and warm it up.
    ``pinned``: this process is a fork of the server, whose GPU it must not touch: the view is pinned.
    Returns the builder module and what Ready reports."""
    sys.path[:] = list(config.sys_path)
    processes.compilers_die_with_this_process()  # a killed helper leaves no ptxas or gcc behind
    if config.device_view is not None:  # before any kernel library is imported: they read it at import
        (device_view.pin if pinned else device_view.install)(config.device_view)
    builder = importlib.import_module(config.builder)
    prepare = getattr(builder, "prepare", None)  # optional: a builder with no fixed costs has none
    return builder, (prepare(config.device_view) if prepare is not None else None) or {}


def serve(inbox, outbox, builder) -> int:
    """Answer Preload and Job messages until Shutdown or until the pool's end of the pipe closes."""
    while True:
        message = read_message(inbox)
        if message is None or isinstance(message, Shutdown):
            return 0
        try:
            if isinstance(message, Preload):
                write_message(outbox, preload(message.modules))
            elif isinstance(message, Job):
                write_message(outbox, JobTaken(message.job_id))
                write_message(outbox, _build(builder, message))
            else:
                log.error("ignoring unexpected message %r", type(message).__name__)
        except BrokenPipeError:  # the server is gone (exited or crashed): its own error is the one to read
            return 0


def main(argv: list[str]) -> int:
    set_up_logging()
    processes.die_with_parent()  # started by the pool's spawner thread, which outlives it
    lower_priority()
    exit_with_parent(os.getppid())
    inbox = os.fdopen(int(argv[1]), "rb", buffering=0)
    outbox = os.fdopen(int(argv[2]), "wb", buffering=0)
    config = read_message(inbox)
    if not isinstance(config, Configure):
        log.error("expected Configure first, got %r", type(config).__name__)
        return 2
    t0 = time.perf_counter()
    builder, prepared = configure(config)
    write_message(outbox, Ready(os.getpid(), time.perf_counter() - t0, {**describe_self(), **prepared}))
    return serve(inbox, outbox, builder)


if __name__ == "__main__":
    # No interpreter teardown (a second or more with torch and a kernel library imported): a helper has
    # nothing to flush but its stderr, and the pool is waiting for it to go.
    status = main(sys.argv)
    sys.stderr.flush()
    os._exit(status)
