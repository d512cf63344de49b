"""Planning a model in the background: providers' launches run in captures, requests go to the pools.

Started at model construction, it overlaps weight loading; what warmup and CUDA-graph capture need is
captured and queued first (WARMUP), the rest of the reachable space after it (BACKGROUND). A provider
that fails is reported in one log line and skipped; planning never raises into the engine.
"""
from __future__ import annotations

import difflib
import logging
import threading
import time
from collections import defaultdict

from .limits import EngineLimits
from .priority import Priority

log = logging.getLogger("jit_ahead.planning")

SUBMIT_EVERY_S = 1.0


class PlanningRun:
    def __init__(self, families: dict, stats, model, limits: EngineLimits, providers: list) -> None:
        self._families = families
        self._stats = stats
        self._model = model
        self._limits = limits
        self._providers = providers
        self._done = threading.Event()
        # set once every launch of that priority and above is captured and queued: an engine's warmup
        # waits for WARMUP, not for the BACKGROUND enumeration (minutes for large limits)
        self._queued = {priority: threading.Event() for priority in Priority}
        self.tickets: list = []
        self.variants: dict[Priority, int] = defaultdict(int)  # distinct variants, by the first priority
        self._seen: set = set()  # requests already counted and queued by this run
        self.errors: list[str] = []
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="jit_ahead-planning", daemon=True)

    def start(self) -> "PlanningRun":
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None, priority: Priority | None = None) -> bool:
        """True once every provider's launches were captured and queued; with ``priority``, once those of
        that priority and above were (lower priorities may still be enumerating)."""
        return (self._done if priority is None else self._queued[priority]).wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _fail(self, provider, what: str, exc: BaseException) -> None:
        message = f"provider {provider.name}: {what} failed ({type(exc).__name__}: {exc}); skipped"
        self.errors.append(message)
        log.warning(message)

    def _check_extra_limits(self) -> None:
        """One log line for EngineLimits.extra keys no provider of this run reads (a misspelt knob would
        otherwise be ignored without a word), with the closest known key."""
        known = {key: provider.name for provider in self._providers
                 for key in getattr(provider, "extra_limits", {})}
        for key in sorted(set(self._limits.extra) - set(known)):
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r} ({known[close[0]]})?" if close else ""
            log.warning("EngineLimits.extra[%r] is read by none of the providers planning this model (%s), "
                        "so it is ignored%s Keys they read: %s", key,
                        ", ".join(p.name for p in self._providers) or "none",
                        hint or ".", ", ".join(sorted(known)) or "none")

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._check_extra_limits()
            groups: dict[tuple[Priority, str], list] = defaultdict(list)
            for provider in self._providers:
                try:
                    layers = provider.find_layers(self._model)
                    family = self._families.get(provider.family)
                    if layers and family is not None and provider.modules:
                        # Helpers import the library while its launches are enumerated; a library the
                        # model does not use is never imported there.
                        family.pool.preload(provider.modules)
                    launches = list(provider.launches(layers, self._limits)) if layers else []
                except Exception as exc:
                    self._fail(provider, "enumeration", exc)
                    continue
                for launch in launches:
                    groups[(launch.priority, provider.family)].append((provider, launch))
            for (priority, family_name), items in sorted(groups.items(), key=lambda kv: kv[0][0]):
                self._mark_queued(above=priority)
                self._capture_and_queue(self._families[family_name], priority, items)
        except Exception as exc:  # a bug guard: planning must never take the engine down
            log.exception("planning stopped early")
            self.errors.append(f"planning stopped: {exc!r}")
        finally:
            self.seconds = time.perf_counter() - t0
            self._mark_queued(above=None)
            self._done.set()

    def _mark_queued(self, above: Priority | None) -> None:
        """Every priority higher than ``above`` (all: None) has been captured and queued."""
        for priority, event in self._queued.items():
            if above is None or priority < above:
                event.set()

    def _capture_and_queue(self, family, priority: Priority, items: list) -> None:
        """Capture ``items`` and queue what they need, in slices of SUBMIT_EVERY_S seconds: helpers start
        on the first variants while a long enumeration is still running."""
        t0 = time.perf_counter()
        failed: set[tuple[str, str]] = set()
        queued = submitted = 0
        with family.capture() as plan:
            last_submit = time.perf_counter()
            for index, (provider, launch) in enumerate(items):
                try:
                    launch.run()
                except Exception as exc:
                    if (provider.name, type(exc).__name__) not in failed:  # one line per provider and error
                        failed.add((provider.name, type(exc).__name__))
                        self._fail(provider, f"launch {launch.label}", exc)
                if index == len(items) - 1 or time.perf_counter() - last_submit > SUBMIT_EVERY_S:
                    fresh = plan.requests[submitted:]  # captures keep requests in first-seen order
                    submitted += len(fresh)
                    new = [r for r in fresh if r not in self._seen]  # a WARMUP variant recurs in BACKGROUND
                    self._seen.update(new)
                    self.variants[priority] += len(new)
                    tickets = family.submit(new, priority)
                    queued += len(tickets)
                    self.tickets.extend(tickets)
                    last_submit = time.perf_counter()
        self._stats.emit("planned", family=family.name, priority=priority.name, launches=len(items),
                         variants=len(plan), queued=queued, seconds=time.perf_counter() - t0)
