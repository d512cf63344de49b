"""Every stats event, declared once: its name, what it says and its fields.

An event is a frozen record. ``Stats.emit(event)`` stamps it with the time, the session's phase and the
thread, and hands subscribers and the stats log one JSON object per event: ``{"event": name, "time": ...,
"phase": ..., "thread": ..., **fields}``. The coverage report reads log lines back into these classes
(``parse``). A field listed in a class's ``omitted_when_none`` is left out of the object when it is None
(the reader tells "no such field" from None there); every other field is always written.

Events are ``Frozen`` records (``jit_ahead/frozen.py``): declared as dataclasses are, without the cost of
generating each class's methods, which every ``JIT_AHEAD=1`` process would pay at start.
"""
from __future__ import annotations

from typing import Any, ClassVar

from ...frozen import Factory, Frozen

EVENTS: dict[str, type["Event"]] = {}
STAMP_FIELDS = ("time", "phase", "thread")


class Stamp(Frozen):
    """What ``Stats.emit`` adds to every event."""

    time: float
    phase: str  # "startup" or "serving"
    thread: str


class Event(Frozen):
    name: ClassVar[str] = ""
    omitted_when_none: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, name: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if name:
            if name in EVENTS:
                raise TypeError(f"two stats events are named {name!r}: {EVENTS[name].__name__}, {cls.__name__}")
            cls.name = name
            EVENTS[name] = cls

    @classmethod
    def from_fields(cls, record: dict) -> "Event | None":
        """The event from a stats-log object's fields; None if one it declares without a default is missing."""
        if any(key not in record and key not in cls._defaults for key in cls._fields):
            return None
        return cls(**{key: record[key] for key in cls._fields if key in record})

    def fields(self) -> dict[str, Any]:
        """The event's fields as the stats log writes them."""
        out = {}
        for key, value in self.__dict__.items():
            if value is None and key in self.omitted_when_none:
                continue
            out[key] = round(value, 6) if key == "seconds" and isinstance(value, float) else value
        return out


def parse(record: dict) -> tuple[Stamp, Event] | None:
    """A stats-log object read back: its stamp and its event, or None when it names no declared event or
    lacks a field the event declares (a log of another jit_ahead version). Fields the class does not
    declare are ignored."""
    cls = EVENTS.get(record.get("event"))
    if cls is None:
        return None
    try:
        stamp = Stamp(float(record["time"]), str(record.get("phase", "startup")), str(record.get("thread", "")))
        event = cls.from_fields(record)
    except (KeyError, TypeError, ValueError):
        return None
    return None if event is None else (stamp, event)


# -- the session ------------------------------------------------------------------------------------------------
class Phase(Event, name="phase"):
    """The session's phase changed (to serving: the stamp's phase)."""


class DictEvent(Event):
    """An event whose one field is a dict, written out as fields of their own."""

    items: dict = Factory(dict)

    @classmethod
    def from_fields(cls, record: dict) -> "DictEvent":
        return cls({k: v for k, v in record.items() if k not in ("event", *STAMP_FIELDS)})

    def fields(self) -> dict[str, Any]:
        return dict(self.items)


class Ready(DictEvent, name="ready"):
    """The ready line's figures (the fields of ``core/readiness.Readiness``), once per session: at the
    first ``wait_ready`` that succeeds, else when serving starts."""


class OwnCpu(DictEvent, name="own_cpu"):
    """When serving starts: jit_ahead's CPU seconds in the server's process so far (``own_s``), and by
    thread or call (``by_where``, with what a process without it does too) (``core/observing/own_cpu.py``)."""


class Summary(DictEvent, name="summary"):
    """At close: the counts of the one-line summary (``Session.summary``)."""


# -- planning ---------------------------------------------------------------------------------------------------
class Planned(Event, name="planned"):
    """A provider's launch group was enumerated: its kernels (name -> new variants) and counts."""

    family: str
    priority: str
    provider: str
    kernels: dict
    launches: int
    variants: int
    queued: int
    seconds: float


class PlanSaved(Event, name="plan_saved"):
    path: str
    launches: int
    variants: int
    seconds: float


class PlanLoaded(Event, name="plan_loaded"):
    path: str
    launches: int
    variants: int
    queued: int
    planned_seconds: float


class Variant(Event, name="variant"):
    """A planned (``source="plan"``) or recorded (``"record"``) variant, once; ``spec``: Triton's
    specialization JSON, for naming what an unplanned variant differs in."""

    omitted_when_none: ClassVar[tuple[str, ...]] = ("spec",)
    family: str
    key: str
    kernel: str
    label: str
    source: str
    spec: str | None = None


class Replay(Event, name="replay"):
    """A family's records were read and their variants queued."""

    omitted_when_none: ClassVar[tuple[str, ...]] = ("benchmark_only", "file")
    family: str
    variants: int
    queued: int
    folder: str | None = None
    benchmark_only: int | None = None
    file: str | None = None


class ReplayAutotune(Event, name="replay_autotune"):
    family: str
    choices: int
    file: str


# -- the pool ---------------------------------------------------------------------------------------------------
class Queued(Event, name="queued"):
    family: str
    key: str
    label: str
    priority: str
    raised: bool


class HelperReady(Event, name="helper_ready"):
    family: str
    helper: str
    pid: int
    seconds: float
    info: dict


class ForkServerReady(HelperReady, name="forkserver_ready"):
    """The fork server answered its handshake (``helper`` is "forkserver")."""


class HelperPreloaded(Event, name="helper_preloaded"):
    family: str
    helper: str
    modules: int
    failed: list
    seconds: float


class ForkServerPreloaded(HelperPreloaded, name="forkserver_preloaded"):
    pass


class ForkServerIdleExit(Event, name="forkserver_idle_exit"):
    family: str


class HelperRetired(Event, name="helper_retired"):
    family: str
    helper: str


class BuildStart(Event, name="build_start"):
    family: str
    key: str
    label: str
    helper: str
    priority: str


class BuildFinish(Event, name="build_finish"):
    """A build ended, in a helper or on the executor (``helper="executor"``). ``found``: nothing was
    compiled, the entry was on disk when its lock was taken (another process sharing the cache built it)."""

    family: str
    key: str
    label: str
    helper: str
    ok: bool
    error: str | None
    seconds: float
    found: bool = False


class HelperCrash(Event, name="helper_crash"):
    family: str
    key: str
    label: str
    helper: str
    how: str
    state: str
    seconds: float


# -- the executor -----------------------------------------------------------------------------------------------
class ExecutorMiss(Event, name="executor_miss"):
    """A launch found its variant not loaded. ``outcome``: disk, ready (a helper's build, after a wait of
    ``waited`` seconds), built_here, fallback (the DSL compiles it), damaged, unsupported. ``seconds``: the
    whole miss, from the call's description to its load; ``waited``: the part spent obtaining the build
    (waiting, or building in place). ``spec``: an unplanned Triton variant's specialization JSON."""

    omitted_when_none: ClassVar[tuple[str, ...]] = ("kernel", "planned", "siblings_raised", "spec", "waited",
                                                    "reason")
    family: str
    key: str | None
    label: str
    outcome: str
    seconds: float
    kernel: str | None = None
    planned: bool | None = None
    siblings_raised: int | None = None
    spec: str | None = None
    waited: float | None = None
    reason: str | None = None


class Wait(Event, name="wait"):
    """A launch blocked on its variant's build for over ``pool.LONG_WAIT_S``: ``cause`` says what
    held it when it started waiting (queued behind others, a helper's build in flight, helpers
    starting), ``outcome`` how it ended (ready, built_here, fallback)."""

    family: str
    key: str
    label: str
    seconds: float
    cause: str
    outcome: str


class Compile(Event, name="compile"):
    """A compile() of this process (Triton's compilation listener): a disk hit or a real compile."""

    family: str
    kernel: str
    key: str | None
    cache_hit: bool
    seconds: float


class CacheDamaged(Event, name="cache_damaged"):
    family: str
    key: str
    label: str
    reason: str
    rebuilt: bool


class Guard(Event, name="guard"):
    """A variant needed a build after serving started (JIT_AHEAD_MODE)."""

    family: str
    key: str | None
    label: str
    mode: str
    message: str


# -- tuning -----------------------------------------------------------------------------------------------------
class AutotuneBench(Event, name="autotune_bench"):
    """An autotuner timed one config on this process's GPU; ``ahead``: in tune-ahead."""

    family: str
    ahead: bool
    kernel: str
    tuning_key: str


class TuneAhead(Event, name="tune_ahead"):
    """What tune-ahead did: counts, the reasons keys were left, per kernel [tuned, left]."""

    tuned_ahead: int
    chosen_already: int
    left: int
    seconds: float = 0.0
    left_why: dict = Factory(dict)
    kernels: dict = Factory(dict)
