"""Every stats event, declared once: its name, what it says and its fields.

An event is a frozen dataclass. ``Stats.emit(event)`` stamps it with the time, the session's phase and the
thread, and hands subscribers and the stats log one JSON object per event: ``{"event": name, "time": ...,
"phase": ..., "thread": ..., **fields}``. The coverage report reads log lines back into these classes
(``parse``). A field listed in a class's ``omitted_when_none`` is left out of the object when it is None
(the reader tells "no such field" from None there); every other field is always written.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

EVENTS: dict[str, type["Event"]] = {}
STAMP_FIELDS = ("time", "phase", "thread")


@dataclass(frozen=True)
class Stamp:
    """What ``Stats.emit`` adds to every event."""

    time: float
    phase: str  # "startup" or "serving"
    thread: str


@dataclass(frozen=True)
class Event:
    name: ClassVar[str]
    omitted_when_none: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_fields(cls, record: dict) -> "Event | None":
        """The event from a stats-log object's fields; None if one it declares without a default is missing."""
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in record:
                kwargs[f.name] = record[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return None
        return cls(**kwargs)

    def fields(self) -> dict[str, Any]:
        """The event's fields as the stats log writes them."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.omitted_when_none:
                continue
            out[f.name] = round(value, 6) if f.name == "seconds" and isinstance(value, float) else value
        return out


def _event(name: str):
    def register(cls):
        cls.name = name
        EVENTS[name] = cls
        return cls
    return register


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
@_event("phase")
@dataclass(frozen=True)
class Phase(Event):
    """The session's phase changed (to serving: the stamp's phase)."""


@_event("summary")
@dataclass(frozen=True)
class Summary(Event):
    """At close: the counts of the one-line summary (``Session.summary``), written as fields of their own."""

    counts: dict = field(default_factory=dict)

    @classmethod
    def from_fields(cls, record: dict) -> "Summary":
        return cls({k: v for k, v in record.items() if k not in ("event", *STAMP_FIELDS)})

    def fields(self) -> dict[str, Any]:
        return dict(self.counts)


# -- planning ---------------------------------------------------------------------------------------------------
@_event("planned")
@dataclass(frozen=True)
class Planned(Event):
    """A provider's launch group was enumerated: its kernels (name -> new variants) and counts."""

    family: str
    priority: str
    provider: str
    kernels: dict
    launches: int
    variants: int
    queued: int
    seconds: float


@_event("plan_saved")
@dataclass(frozen=True)
class PlanSaved(Event):
    path: str
    launches: int
    variants: int
    seconds: float


@_event("plan_loaded")
@dataclass(frozen=True)
class PlanLoaded(Event):
    path: str
    launches: int
    variants: int
    queued: int
    planned_seconds: float


@_event("variant")
@dataclass(frozen=True)
class Variant(Event):
    """A planned (``source="plan"``) or recorded (``"record"``) variant, once; ``spec``: Triton's
    specialization JSON, for naming what an unplanned variant differs in."""

    omitted_when_none: ClassVar[tuple[str, ...]] = ("spec",)
    family: str
    key: str
    kernel: str
    label: str
    source: str
    spec: str | None = None


@_event("replay")
@dataclass(frozen=True)
class Replay(Event):
    """A family's records were read and their variants queued."""

    omitted_when_none: ClassVar[tuple[str, ...]] = ("benchmark_only", "file")
    family: str
    variants: int
    queued: int
    folder: str | None = None
    benchmark_only: int | None = None
    file: str | None = None


@_event("replay_autotune")
@dataclass(frozen=True)
class ReplayAutotune(Event):
    family: str
    choices: int
    file: str


# -- the pool ---------------------------------------------------------------------------------------------------
@_event("queued")
@dataclass(frozen=True)
class Queued(Event):
    family: str
    key: str
    label: str
    priority: str
    raised: bool


@_event("helper_ready")
@dataclass(frozen=True)
class HelperReady(Event):
    family: str
    helper: str
    pid: int
    seconds: float
    info: dict


@_event("forkserver_ready")
@dataclass(frozen=True)
class ForkServerReady(HelperReady):
    """The fork server answered its handshake (``helper`` is "forkserver")."""


@_event("helper_preloaded")
@dataclass(frozen=True)
class HelperPreloaded(Event):
    family: str
    helper: str
    modules: int
    failed: list
    seconds: float


@_event("forkserver_preloaded")
@dataclass(frozen=True)
class ForkServerPreloaded(HelperPreloaded):
    pass


@_event("forkserver_idle_exit")
@dataclass(frozen=True)
class ForkServerIdleExit(Event):
    family: str


@_event("helper_retired")
@dataclass(frozen=True)
class HelperRetired(Event):
    family: str
    helper: str


@_event("build_start")
@dataclass(frozen=True)
class BuildStart(Event):
    family: str
    key: str
    label: str
    helper: str
    priority: str


@_event("build_finish")
@dataclass(frozen=True)
class BuildFinish(Event):
    """A build ended, in a helper or on the executor (``helper="executor"``)."""

    family: str
    key: str
    label: str
    helper: str
    ok: bool
    error: str | None
    seconds: float


@_event("helper_crash")
@dataclass(frozen=True)
class HelperCrash(Event):
    family: str
    key: str
    label: str
    helper: str
    how: str
    state: str
    seconds: float


# -- the executor -----------------------------------------------------------------------------------------------
@_event("executor_miss")
@dataclass(frozen=True)
class ExecutorMiss(Event):
    """A launch found its variant not loaded. ``outcome``: disk, ready (a helper's build, after a wait of
    ``seconds``), built_here, fallback (the DSL compiles it), damaged, unsupported. ``spec``: an unplanned
    Triton variant's specialization JSON."""

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


@_event("compile")
@dataclass(frozen=True)
class Compile(Event):
    """A compile() of this process (Triton's compilation listener): a disk hit or a real compile."""

    family: str
    kernel: str
    key: str | None
    cache_hit: bool
    seconds: float


@_event("cache_damaged")
@dataclass(frozen=True)
class CacheDamaged(Event):
    family: str
    key: str
    label: str
    reason: str
    rebuilt: bool


@_event("guard")
@dataclass(frozen=True)
class Guard(Event):
    """A variant needed a build after serving started (JIT_AHEAD_MODE)."""

    family: str
    key: str | None
    label: str
    mode: str
    message: str


# -- tuning -----------------------------------------------------------------------------------------------------
@_event("autotune_bench")
@dataclass(frozen=True)
class AutotuneBench(Event):
    """An autotuner timed one config on this process's GPU; ``ahead``: in tune-ahead."""

    family: str
    ahead: bool
    kernel: str
    tuning_key: str


@_event("tune_ahead")
@dataclass(frozen=True)
class TuneAhead(Event):
    """What tune-ahead did: counts, the reasons keys were left, per kernel [tuned, left]."""

    tuned_ahead: int
    chosen_already: int
    left: int
    seconds: float = 0.0
    left_why: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
