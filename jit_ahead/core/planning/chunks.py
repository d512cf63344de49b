"""The work of a planning run and what is reported of it: groups of launches, cut into chunks of consecutive
launches that planners claim one at a time; the messages a planner sends back (what it found, what failed,
how far it ran); the ``Sink`` the planning thread hands them to; and the ranges not run yet."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..priority import Priority


MAX_CHUNK = 64  # launches a planner claims at a time, at most
CHUNKS_PER_PLANNER = 32  # at least this many chunks per planner, so that planners end together

@dataclass(frozen=True)
class LaunchGroup:
    """Launches of one family at one priority, in the order they are run."""

    priority: Priority
    family: str
    items: Sequence  # (provider, PlannedLaunch)


@dataclass(frozen=True)
class Failure:
    provider: str
    error: str  # exception type name
    message: str
    launch: str


@dataclass(frozen=True)
class Found:
    """Requests a planner captured since its last message, for launches of group ``group``."""

    group: int
    requests: tuple
    extras: tuple = ()  # (kind, items): what the family's capture found besides variants (Family.extra_kinds)
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True)
class RangeDone:
    """Every launch of ``Range(chunk, first, last)`` has run and what it found was sent."""

    chunk: int
    first: int
    last: int


@dataclass(frozen=True)
class Finished:
    launches: int
    seconds: float


class Sink(ABC):
    """What the planning thread does with results; called on that thread only."""

    @abstractmethod
    def found(self, group: int, requests: list, extras: dict[str, list]) -> None:
        """Requests captured by launches of ``group``, in first-seen order, and by kind what the family's
        capture found besides them (``Family.extra_kinds``, read by the family alone)."""

    @abstractmethod
    def group_done(self, group: int) -> None:
        """Every launch of ``group`` has run (groups are reported in order)."""

    @abstractmethod
    def failed(self, failure: Failure) -> None:
        """A launch raised, or its planner died in it."""

    @abstractmethod
    def lost(self, group: int, count: int, why: str) -> None:
        """``count`` launches from ``group`` on will not run (serving started before they could)."""

    def ran(self, group: int, first: int, last: int) -> None:
        """Launches ``first`` to ``last`` (excluded) of ``group`` have run and what they found was handed
        over: progress a later start may skip."""


@dataclass(frozen=True)
class Position:
    group: int
    item: int


@dataclass(frozen=True)
class Chunk:
    """Launches ``first`` to ``last`` (excluded) of group ``group``: what a planner claims at a time."""

    group: int
    first: int
    last: int


@dataclass(frozen=True)
class Range:
    """Launches ``first`` to ``last`` (excluded) of chunk ``chunk``: a whole chunk, or what is left of one
    whose planner died in it."""

    chunk: int
    first: int
    last: int

    def __len__(self) -> int:
        return self.last - self.first


def chunks_from(groups: Sequence[LaunchGroup], start: Position, planners: int) -> list[Chunk]:
    """The launches from ``start`` on, in order, cut into chunks of one group each: small enough that
    ``planners`` planners claiming them one after another end close together."""
    total = sum(len(g.items) for g in groups[start.group:]) - (start.item if start.group < len(groups) else 0)
    size = max(1, min(MAX_CHUNK, total // max(1, planners * CHUNKS_PER_PLANNER)))
    chunks = []
    for g in range(start.group, len(groups)):
        for first in range(start.item if g == start.group else 0, len(groups[g].items), size):
            chunks.append(Chunk(g, first, min(first + size, len(groups[g].items))))
    return chunks


class RangesLeft:
    """The ranges not run yet; tells the sink each group done, in order, once none of its ranges is
    left."""

    def __init__(self, groups: Sequence[LaunchGroup], chunks: list[Chunk], sink: Sink, first_group: int) -> None:
        self._groups = groups
        self._chunks = chunks
        self._sink = sink
        self.open: set[Range] = {Range(k, c.first, c.last) for k, c in enumerate(chunks)}
        self._left = Counter(c.group for c in chunks)
        self._next = first_group  # groups below this were reported done

    def group_of(self, part: Range) -> int:
        return self._chunks[part.chunk].group

    def done(self, part: Range) -> None:
        if part in self.open:
            self._drop(part)
            self._sink.ran(self.group_of(part), part.first, part.last)
        self._advance()

    def _drop(self, part: Range) -> None:
        self.open.discard(part)
        self._left[self.group_of(part)] -= 1

    def split(self, part: Range, culprit: int) -> list[Range]:
        """``part`` is replaced by what is left of it without launch ``culprit``; returns the new ranges.
        The culprit is not progress a later start may skip: that start runs it again, and plans around it
        again if it kills planners there too."""
        if part not in self.open:
            return []
        self._drop(part)
        rest = [r for r in (Range(part.chunk, part.first, culprit), Range(part.chunk, culprit + 1, part.last)) if len(r)]
        for r in rest:
            self.open.add(r)
            self._left[self.group_of(r)] += 1
        self._advance()
        return rest

    def finish(self) -> None:
        """Nothing more will run: report every group left."""
        self._left.clear()
        self._advance()

    def _advance(self) -> None:
        while self._next < len(self._groups) and self._left[self._next] <= 0:
            self._sink.group_done(self._next)
            self._next += 1
