"""How long builds take, as measured, and what a launch that misses does with it: wait for a helper, or
build in place on its own thread. Pure arithmetic over what the pool reports; it starts nothing."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass


class Ewma:
    """Exponentially weighted mean of build seconds."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.value: float | None = None
        self.samples = 0

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else self.alpha * sample + (1 - self.alpha) * self.value
        self.samples += 1


@dataclass(frozen=True)
class HelperLoad:
    """The pool as one waiting launch sees it."""

    live_helpers: int  # helpers running now
    may_get_helpers: bool  # a helper runs, or a slot is starting one or backing off to retry
    busy_for: Sequence[float]  # seconds each helper that is building has been at its build
    queued_ahead: int  # queued requests a helper takes before this one


class BuildCost:
    """Build times measured in helpers and on the executor, and the choice between waiting and building
    in place that follows from them."""

    def __init__(self) -> None:
        self.helper = Ewma()  # per build in a helper
        self.local = Ewma()  # per in-place build on the executor
        self._lock = threading.Lock()

    def helper_build(self, seconds: float) -> None:
        with self._lock:
            self.helper.add(seconds)

    def local_build(self, seconds: float) -> None:
        with self._lock:
            self.local.add(seconds)

    def expected_helper_wait(self, load: HelperLoad) -> float | None:
        """Seconds until a helper would finish the request if the launch waits; None if unknown (no helper,
        or no helper build measured yet)."""
        per_build = self.helper.value
        if load.live_helpers == 0 or per_build is None:
            return None
        if len(load.busy_for) < load.live_helpers:
            free_in = 0.0
        else:
            free_in = min(max(0.0, per_build - busy) for busy in load.busy_for)
        rounds = load.queued_ahead // load.live_helpers
        return free_in + rounds * per_build + per_build

    def prefer_in_place(self, load: HelperLoad, crashed_before: bool) -> bool:
        """Whether building on the calling thread now beats waiting for a helper. A request that crashed a
        helper is built in place: a helper could crash on it again."""
        if not load.may_get_helpers or crashed_before:
            return True
        helper_wait = self.expected_helper_wait(load)
        if helper_wait is None:
            # No helper measurement yet: waiting costs a full build at worst; prefer a free helper.
            return load.live_helpers == 0
        local = self.local.value if self.local.value is not None else helper_wait
        return local < helper_wait
