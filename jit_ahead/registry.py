"""Which kernel families exist, and what starts them: the built-in ones and those installed packages
declare under the entry-point group ``jit_ahead.families`` (each entry point names a ``FamilyInfo``).

This module is read by the ``JIT_AHEAD=1`` start-up hook in every process, before anything else of
jit_ahead: it imports nothing at module level but ``frozen.py`` (which imports nothing), and an installed
package's entry point is read only when its name is asked for (all of them only for ``known_families``).
A family's implementation (``core/family.py``'s contract) is imported only when a session asks for it,
since it imports its DSL.
"""
from .frozen import Frozen

ENTRY_POINT_GROUP = "jit_ahead.families"


class FamilyInfo(Frozen):
    """A family as the registry knows it, before its DSL is imported.

    implementation: "module:Class" of the Family. triggers: modules whose import starts a ``JIT_AHEAD=1``
    session naming this family. misses_are_calls: the coverage report's reading, True when the family has
    no compilation listener, so each executor miss is itself what happened to a call (loaded, waited, built
    in place, or compiled by the DSL). first_use: "module:function" that puts off the ``JIT_AHEAD=1``
    session until the DSL's first compile (see ``arm_first_use``); empty: the session starts at the trigger
    import."""

    name: str
    implementation: str
    triggers: tuple
    misses_are_calls: bool = False
    first_use: str = ""

    def __init__(self, name: str, implementation: str, triggers, misses_are_calls: bool = False,
                 first_use: str = "") -> None:
        super().__init__(name, implementation, tuple(triggers), bool(misses_are_calls), str(first_use))

    def load(self) -> type:
        return _resolve(self.implementation)

    def arm_first_use(self, start):
        """Have ``start()`` called just before the DSL first compiles in this process. ``first_use`` names
        ``arm(start)``, which returns a ``disarm()`` that undoes the arrangement (called when the session
        starts some other way), or None when it cannot arm; None here too without one."""
        return _resolve(self.first_use)(start) if self.first_use else None


def _resolve(target: str):
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def workers_knob(family: str) -> str:
    """The knob of a family's helper count: ``JIT_AHEAD_<NAME>_WORKERS``."""
    return f"JIT_AHEAD_{family.upper()}_WORKERS"


BUILTIN = (
    FamilyInfo("triton", "jit_ahead.triton.family:TritonFamily", ("triton",),
               first_use="jit_ahead.triton.first_use:arm"),
    FamilyInfo("cute", "jit_ahead.cute.family:CuteFamily", ("cutlass",), misses_are_calls=True),
    FamilyInfo("deep_gemm", "jit_ahead.deep_gemm.family:DeepGemmFamily", ("deep_gemm",)),
    FamilyInfo("tilelang", "jit_ahead.tilelang.family:TileLangFamily", ("tilelang",), misses_are_calls=True),
    FamilyInfo("flashinfer", "jit_ahead.flashinfer.family:FlashInferFamily", ("flashinfer",), misses_are_calls=True),
)
_registered: dict = {}  # name -> FamilyInfo: register() and the entry points, once read
_entry_points_read = False
_unloadable: set = set()  # entry point names that failed to load (said once)


def register(info: FamilyInfo) -> None:
    """Add a family in this process (for an installed package, the entry-point group is the way)."""
    if not isinstance(info, FamilyInfo):
        raise TypeError(f"register() takes a FamilyInfo, not {type(info).__name__}")
    _registered[info.name] = info


def _read_entry_points(only: str | None = None) -> None:
    """Load the group's entry points (``only``: the one of that name; each package's module is imported
    when its entry point is loaded)."""
    global _entry_points_read
    if _entry_points_read:
        return
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        if (only is not None and point.name != only) or point.name in _registered or point.name in _unloadable:
            continue
        try:
            info = point.load()
        except Exception as exc:  # one broken package must not take the others with it
            _unloadable.add(point.name)
            _log_error("jit_ahead family entry point %s (%s) cannot be loaded (%s: %s); left out",
                       point.name, point.value, type(exc).__name__, exc)
            continue
        if not isinstance(info, FamilyInfo) or info.name != point.name:
            _unloadable.add(point.name)
            _log_error("jit_ahead family entry point %s (%s) is not a FamilyInfo named %r; left out",
                       point.name, point.value, point.name)
            continue
        _registered.setdefault(info.name, info)
    if only is None:
        _entry_points_read = True  # after the scan: a thread asking meanwhile scans too, it never finds less


def _log_error(message: str, *args) -> None:
    import logging

    logging.getLogger("jit_ahead.registry").error(message, *args)


def family_info(name: str):
    """The FamilyInfo of ``name``, or None when no family has that name."""
    for info in BUILTIN:
        if info.name == name:
            return info
    if name not in _registered:
        _read_entry_points(only=name)
    return _registered.get(name)


def known_families() -> dict:
    """Every family by name: built-in, registered in this process, and declared by installed packages (a
    built-in name is always the built-in family, as ``family_info`` finds it)."""
    _read_entry_points()
    return {**_registered, **{info.name: info for info in BUILTIN}}


def family_class(name: str) -> type:
    """The Family class of ``name`` (importing it, and its DSL); ValueError for an unknown name."""
    info = family_info(name)
    if info is None:
        raise ValueError(f"unknown jit_ahead family {name!r}; known: {', '.join(sorted(known_families()))}")
    return info.load()


def requested(environ) -> list:
    """The family names ``JIT_AHEAD_FAMILIES`` lists (lower-case, empty entries dropped; default triton)."""
    return [n.strip().lower() for n in environ.get("JIT_AHEAD_FAMILIES", "triton").split(",") if n.strip()]


def families_to_start(environ) -> tuple:
    """JIT_AHEAD_FAMILIES: the families a ``JIT_AHEAD=1`` session starts (default ``triton``;
    ``triton,cute`` adds the CuTe DSL family, which needs ``jit_ahead[cute-dsl]``; a package's own family
    by the name it registers). Unknown names are dropped with one line."""
    names = requested(environ)
    unknown = [n for n in names if family_info(n) is None]
    if unknown:
        import logging

        logging.getLogger("jit_ahead.knobs").error("JIT_AHEAD_FAMILIES: unknown %s (known: %s); ignored",
                                                   ", ".join(unknown), ", ".join(sorted(known_families())))
    return tuple(dict.fromkeys(n for n in names if n not in unknown)) or ("triton",)


def triggers(names) -> tuple:
    """The modules whose import starts a session with the families ``names`` (unknown names skipped)."""
    found = []
    for name in names:
        info = family_info(name)
        if info is not None:
            found.extend(info.triggers)
    return tuple(dict.fromkeys(found))

