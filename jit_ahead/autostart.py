"""``JIT_AHEAD=1`` in any process: the start-up hook (``jit_ahead.pth``, run by Python's ``site``).

The ``.pth`` line only reads the variable; when it is set, ``install()`` adds an import watcher and
returns: nothing else is imported but the family registry. The session comes after the process imports
the DSL of one of the families ``JIT_AHEAD_FAMILIES`` names (default ``triton``; ``cute``: ``cutlass``; a
package's family: the modules its ``FamilyInfo`` names), so a process that never uses them never pays for
jit_ahead (and never starts helpers). Where nothing needs the session before the DSL first compiles (no
record folder to replay, and every family can tell its first compile: ``FamilyInfo.first_use``), it
starts at that first compile, or when something asks for it (``jit_ahead.current()``, a model to plan);
a process that imports Triton and compiles nothing pays only for the line that says jit_ahead is on.
Otherwise it starts right after the import.

Warmup and serving, without an engine calling the lifecycle API: serving is taken to start
``JIT_AHEAD_WARMUP_S`` seconds (default 300) after that line; ``0`` never switches by time. An engine (or
a script) overrides the rule by calling ``jit_ahead.current().mark_serving()`` itself, which also cancels
the timer.

Models: once ``transformers.modeling_utils`` is imported, models returned by ``from_pretrained`` and
``from_config`` are planned within the ``JIT_AHEAD_MAX_*`` limits (``engines/transformers.py``;
``JIT_AHEAD_PLAN_MODELS=off`` turns that off).
"""
import _thread
import os
import sys

# Only os and sys at import: this module runs in every process that has JIT_AHEAD set, and importlib.abc
# or logging alone would add tens of milliseconds to each interpreter start (scripts/bench/startup_hook.py).
_installed = False


class _AfterImport:  # a meta path finder: anything with find_spec
    """Finds nothing itself: when one of ``names`` is about to be imported it wraps the real loader so
    that ``then`` runs once that import has finished, then takes itself off ``sys.meta_path``."""

    def __init__(self, names: tuple[str, ...], then) -> None:
        self.names = names
        self.then = then

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from finding us again
        spec = None
        for finder in sys.meta_path:  # whoever would have found it (site-packages, an editable finder...)
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module
        then = self.then

        def exec_module(module):
            original(module)
            then()

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called from ``jit_ahead.pth`` when JIT_AHEAD is set; cheap, idempotent, never raises."""
    global _installed
    if _installed or os.environ.get("JIT_AHEAD_HELPER") == "1":  # helpers never start sessions
        return
    _installed = True
    try:
        from . import registry  # imports nothing itself: it only knows which module starts which family

        names = registry.triggers(registry.requested(os.environ)) or registry.triggers(["triton"])
        if any(name in sys.modules for name in names):
            _after_trigger()
        else:
            sys.meta_path.insert(0, _AfterImport(names, _after_trigger))
        # transformers models are planned as from_pretrained/from_config return them (engines/transformers.py)
        if os.environ.get("JIT_AHEAD_PLAN_MODELS", "on").strip().lower() != "off":
            if "transformers.modeling_utils" in sys.modules:
                _hook_transformers()
            else:
                sys.meta_path.insert(0, _AfterImport(("transformers.modeling_utils",), _hook_transformers))
    except Exception as exc:  # a start-up hook must never stop the process
        sys.stderr.write(f"jit_ahead: JIT_AHEAD=1 start-up hook failed ({type(exc).__name__}: {exc}); "
                         "running without jit_ahead\n")


def _hook_transformers() -> None:
    try:
        from .engines import transformers

        transformers.install()
    except Exception as exc:  # a start-up hook must never stop the process
        sys.stderr.write(f"jit_ahead: transformers models will not be planned ({type(exc).__name__}: {exc})\n")


class _Deferred:
    """A session put off until the DSL's first compile: how to undo each family's arrangement, and when the
    line that said jit_ahead is on was said (serving is assumed JIT_AHEAD_WARMUP_S after it; the timer is
    set when the session starts, so that a process that never compiles starts no thread)."""

    def __init__(self, warmup_s: float) -> None:
        import time

        self.disarms: list = []
        self.warmup_s = warmup_s
        self.said_at = time.monotonic()
        self.said = False  # the line was said (not when arming failed: the session starting says it)


_deferred: _Deferred | None = None


def _after_trigger() -> None:
    """A trigger module was imported: start the session now, or at the first compile. Nothing to do where a
    session is starting (a family's module imported the trigger) or put off already."""
    if _starting or _deferred is not None:
        return
    try:
        from . import registry

        infos = [info for info in map(registry.family_info, registry.requested(os.environ)) if info is not None]
        can_wait = bool(infos) and all(i.first_use for i in infos)
        if can_wait and _jit_ahead_importing():
            _defer(infos)  # a jit_ahead module imported the trigger: the session would import it half-made
        elif not can_wait or os.environ.get("JIT_AHEAD_RECORD_DIR", "").strip():
            start_session()  # records to replay as soon as possible, or a family that cannot wait
        else:
            _defer(infos)
    except Exception as exc:
        sys.stderr.write(f"jit_ahead: could not put off the session ({type(exc).__name__}: {exc}); starting it now\n")
        start_session()


def _jit_ahead_importing() -> bool:
    """A module of jit_ahead's own is still being imported (it imported the trigger: a script that imports
    ``jit_ahead.triton.standin`` before Triton)."""
    return any(getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()) if name.startswith("jit_ahead."))


def _defer(infos) -> None:
    global _deferred
    import atexit

    from .core import knobs
    from .core.observing.user_lines import family_helpers, on_line, tell_user
    from .core.observing.stats_log import KNOB as STATS_KNOB, stats_log_path
    from .registry import workers_knob

    warmup_s = knobs.env_seconds("JIT_AHEAD_WARMUP_S", 300.0)
    deferred = _Deferred(warmup_s)
    _deferred = deferred
    for info in infos:
        disarm = info.arm_first_use(start_session)
        if disarm is None:  # this family cannot wait after all
            start_session()
            return
        deferred.disarms.append(disarm)
    # the counts as the pools will read them; a bad or capped value is said then, once
    families = ", ".join(family_helpers(info.name, knobs.worker_count(workers_knob(info.name), quiet=True))
                         for info in infos)
    stats = stats_log_path(os.environ.get(STATS_KNOB))
    tell_user(on_line(f"{families}, from the first compile", warmup_s, stats.absolute() if stats is not None else None))
    deferred.said = True
    atexit.register(_summary_if_never_started)


def _summary_if_never_started() -> None:
    """At exit, in a process that never compiled: the summary line (and the stats log's one event)."""
    session = sys.modules.get("jit_ahead.session")
    if _deferred is None or (session is not None and session.current() is not None):
        return  # started (by a compile, or by an engine's own jit_ahead.start()): its summary is said
    try:
        from .core.observing.user_lines import tell_user
        from .core.observing.stats_log import KNOB as STATS_KNOB, stats_log_path

        counts = {"planned": 0, "session": "not started (no compile in this process)"}
        if stats_log_path(os.environ.get(STATS_KNOB)) is not None:
            from .core.observing import events
            from .core.observing.stats import Stats
            from .core.observing.stats_log import open_stats_log

            stats = Stats()
            sink = open_stats_log(stats)
            if sink is not None:
                stats.emit(events.Summary(dict(counts)))
                sink.close()
                counts["stats log"] = str(sink.path)
        tell_user("jit_ahead: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    except Exception as exc:  # exit must not fail for a summary
        sys.stderr.write(f"jit_ahead: no summary ({type(exc).__name__}: {exc})\n")


def current():
    """The process's session. One put off until the first compile starts now: whoever asks for it is about
    to use it (an engine marking serving, planning a model)."""
    if _deferred is not None:
        return start_session()
    from .session import current as session_current

    return session_current()


_lock = _thread.RLock()  # the builtin module: threading is not imported at the start-up hook's time
_starting = False  # a session is being made: a trigger its families import must not start another


def start(families=("triton",), **options):
    """``jit_ahead.start()``: the process's session (``session.start``); in a ``JIT_AHEAD=1`` process
    whose session was put off until the first compile, that session, started now."""
    if _deferred is not None:
        start_session()
    from .session import start as session_start

    return session_start(families, **options)


def start_session():
    """The session of the ``JIT_AHEAD=1`` path, started now if it was not yet; None if it cannot start (or
    when called again while it starts, from an import the start makes)."""
    global _starting
    with _lock:
        if _starting:
            return None
        _starting = True
        try:
            return _start_session()
        finally:
            _starting = False


def _start_session():
    global _deferred
    import threading
    import time

    deferred, _deferred = _deferred, None
    if deferred is not None:
        for disarm in deferred.disarms:
            disarm()
    try:
        from . import registry
        from .core import knobs
        from .core.observing.own_cpu import OwnTimer
        from .session import current, start
        from .core.observing.user_lines import on_line, tell_user

        if current() is not None:
            return current()
        session = start(registry.families_to_start(os.environ), skip_unavailable=True, announce=True)
        if deferred is not None and not deferred.said:
            deferred = None  # arming failed before the line: it is said here, and serving counts from now
        if deferred is not None:  # the line was said at the trigger import: serving counts from there
            warmup_s = deferred.warmup_s
            left = warmup_s - (time.monotonic() - deferred.said_at)
            if warmup_s > 0 and left <= 0:
                _serving_by_time(session, warmup_s)  # before the compile that started it: that one is serving's
                return session
        else:
            warmup_s = left = knobs.env_seconds("JIT_AHEAD_WARMUP_S", 300.0)
        if warmup_s > 0:
            timer = OwnTimer(left, _serving_by_time, args=(session, warmup_s))
            timer.daemon = True
            timer.start()
            session.add_serving_listener(timer.cancel)
        if deferred is not None:
            return session
        tell_user(on_line(session.describe(), warmup_s, session.stats_log.path if session.stats_log is not None else None))
        return session
    except Exception as exc:
        sys.stderr.write(f"jit_ahead: could not start ({type(exc).__name__}: {exc}); running without it\n")
        return None


def _serving_by_time(session, warmup_s: float) -> None:
    import logging

    log = logging.getLogger("jit_ahead.autostart")
    if session.phase != "serving":
        log.info("jit_ahead: %.0fs since start and no engine marked serving: serving starts now "
                 "(JIT_AHEAD_WARMUP_S); no tune-ahead: from this timer thread it would benchmark beside the "
                 "server's own launches (an engine calling mark_serving() after its warmup gets it)", warmup_s)
        session.mark_serving(tune_ahead=False)
