"""What "ready" means at the moment an engine asks: how much of the plan is listed and built, what is left,
and the rule that decides how long ``Session.wait_ready`` holds (``JIT_AHEAD_READY``).

Pure bookkeeping over the planning runs and the families' pools: it starts and waits for nothing."""
from __future__ import annotations

from dataclasses import dataclass

from .. import knobs
from ..priority import Priority

# JIT_AHEAD_READY: what wait_ready holds for. ``warmup``: the WARMUP variants listed and built (planning may
# still list BACKGROUND ones, which a request then waits for); ``plan``: the whole plan listed, WARMUP built;
# ``all``: the whole plan listed and every variant built.
READY_RULES = ("warmup", "plan", "all")
DEFAULT_READY_RULE = "plan"


@dataclass(frozen=True)
class ReadyRule:
    """What ``wait_ready`` waits for: planning's listing (all of it, or up to ``priority``) and the builds
    up to ``priority``."""

    priority: Priority
    whole_plan: bool

    @classmethod
    def named(cls, name: str) -> "ReadyRule":
        if name == "warmup":
            return cls(Priority.WARMUP, False)
        if name == "plan":
            return cls(Priority.WARMUP, True)
        if name == "all":
            return cls(Priority.BACKGROUND, True)
        raise ValueError(f"JIT_AHEAD_READY={name!r} is not one of {'|'.join(READY_RULES)}")

    @classmethod
    def from_knob(cls) -> "ReadyRule":
        return cls.named(knobs.env_choice("JIT_AHEAD_READY", READY_RULES, DEFAULT_READY_RULE))

    @property
    def name(self) -> str:
        """The knob's word for this rule, or what it waits for where no word names it (API arguments)."""
        for word in READY_RULES:
            if ReadyRule.named(word) == self:
                return word
        listed = "whole plan" if self.whole_plan else f"{self.priority.name} launches"
        return f"{listed} listed, {self.priority.name} built"


@dataclass(frozen=True)
class Readiness:
    """The plan at one moment. ``listed``: distinct variants planning has found so far; ``built``: those on
    disk (found built, or built since); ``pending``: queued or building; ``failed``: builds that failed
    (their launches compile as without jit_ahead). ``estimate_s``: the pending builds' time on the
    helpers that build while serving, from the builds measured so far (None before the first)."""

    models: int
    planning_done: bool
    planning_s: float
    groups_done: int
    groups: int
    listed: int
    built: int
    pending: int
    pending_warmup: int
    failed: int
    estimate_s: float | None
    helpers: int
    rule: str

    @property
    def complete(self) -> bool:
        return self.planning_done and self.pending == 0

    def line(self) -> str:
        """The one line said at ready."""
        if self.models == 0:
            return "jit_ahead ready: no model planned"
        failed = f", {self.failed} failed (those compile at their first launch)" if self.failed else ""
        if self.complete:
            return (f"jit_ahead ready: the plan is complete: {self.listed} variants, all built or on disk"
                    f"{failed} (planning took {self.planning_s:.1f}s)")
        parts = []
        if not self.planning_done:
            parts.append(f"planning still running after {self.planning_s:.1f}s ({self.groups_done} of "
                         f"{self.groups} launch groups done), {self.listed} variants listed so far")
        else:
            parts.append(f"planning done ({self.planning_s:.1f}s), {self.listed} variants")
        left = f"{self.built} built or on disk, {self.pending} queued or building"
        if self.pending:
            eta = (f"about {self.estimate_s:.0f}s on {self.helpers} helper{'s' if self.helpers != 1 else ''}"
                   if self.estimate_s is not None else "no build measured yet")
            left += f" ({eta})"
        parts.append(left + failed)
        return ("jit_ahead ready with the plan unfinished: " + "; ".join(parts)
                + f". A request that needs a variant not built yet waits for its build. Ready rule "
                  f"JIT_AHEAD_READY={self.rule}; 'all' holds ready until the whole plan is built")

    def fields(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def readiness(runs: list, families: dict, rule: ReadyRule) -> Readiness:
    """The plan of ``runs`` (PlanningRun) and the builds of ``families`` now."""
    progress = [run.progress() for run in runs]
    listed = sum(p.listed for p in progress)
    pending = sum(p.pending for p in progress)
    failed = sum(p.failed for p in progress)
    estimate, helpers = None, 0
    for family in families.values():
        count, per_build = family.helper_estimate()
        helpers += count
        if per_build is not None and count:
            family_pending = sum(p.pending_by_family.get(family.name, 0) for p in progress)
            estimate = (estimate or 0.0) + family_pending * per_build / count
    return Readiness(models=len(runs), planning_done=all(run.done for run in runs),
                     planning_s=max((p.seconds for p in progress), default=0.0),
                     groups_done=sum(p.groups_done for p in progress), groups=sum(p.groups for p in progress),
                     listed=listed, built=listed - pending - failed, pending=pending,
                     pending_warmup=sum(p.pending_warmup for p in progress), failed=failed,
                     estimate_s=estimate if pending else 0.0, helpers=helpers, rule=rule.name)
