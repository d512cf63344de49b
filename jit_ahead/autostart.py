"""``JIT_AHEAD=1`` in any process: the start-up hook (``jit_ahead.pth``, run by Python's ``site``).

The ``.pth`` line only reads the variable; when it is set, ``install()`` adds an import watcher and
returns: nothing else is imported but the family registry. The session starts right after the process
imports the DSL of one of the families ``JIT_AHEAD_FAMILIES`` names (default ``triton``; ``cute``:
``cutlass``; a package's family: the modules its ``FamilyInfo`` names), so a process that never uses them
never pays for jit_ahead (and never starts helpers).

Warmup and serving, without an engine calling the lifecycle API: serving is taken to start
``JIT_AHEAD_WARMUP_S`` seconds (default 300) after the session started; ``0`` never switches by time.
An engine (or a script) overrides the rule by calling ``jit_ahead.current().mark_serving()`` itself,
which also cancels the timer.

Models: once ``transformers.modeling_utils`` is imported, models returned by ``from_pretrained`` and
``from_config`` are planned within the ``JIT_AHEAD_MAX_*`` limits (``engines/transformers.py``;
``JIT_AHEAD_PLAN_MODELS=off`` turns that off).
"""
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
            start_session()
        else:
            sys.meta_path.insert(0, _AfterImport(names, start_session))
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


def start_session():
    """The session of the ``JIT_AHEAD=1`` path, started now if it was not yet; None if it cannot start."""
    import threading

    try:
        from .core import knobs
        from .core.session import current, say, start

        if current() is not None:
            return current()
        session = start(knobs.families(), skip_unavailable=True, announce=True)
        warmup_s = knobs.env_seconds("JIT_AHEAD_WARMUP_S", 300.0)
        if warmup_s > 0:
            timer = threading.Timer(warmup_s, _serving_by_time, args=(session, warmup_s))
            timer.daemon = True
            timer.start()
            session.add_serving_listener(timer.cancel)
        say(f"jit_ahead on (JIT_AHEAD=1): {session.describe()}; serving is assumed "
            + (f"{warmup_s:.0f}s after start" if warmup_s > 0 else "only when the engine says so (JIT_AHEAD_WARMUP_S=0)")
            + (f"; stats log {session.stats_log.path}" if session.stats_log is not None else ""))
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
