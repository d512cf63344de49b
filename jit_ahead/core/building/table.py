"""The request table: one priority queue plus the in-flight table, deduplicated by artifact key.

Every state change happens under one lock and wakes every waiter, so any thread (a helper slot, a
launch on the executor, a readiness check) can wait on a ticket with a timeout.
"""
from __future__ import annotations

import enum
import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

from ..priority import Priority
from ..requests import BuildRequest, BuildResult

log = logging.getLogger("jit_ahead.table")


class State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    QUARANTINED = "quarantined"


SETTLED = frozenset({State.DONE, State.FAILED, State.QUARANTINED})


@dataclass(eq=False)
class Ticket:
    """The table's record of one artifact key. Fields change only under the table's lock."""

    request: BuildRequest
    priority: Priority
    state: State = State.QUEUED
    owner: str | None = None  # who builds it while RUNNING: "helper-N" or "executor"
    crashes: int = 0  # helpers that died while building it
    started_at: float | None = None
    result: BuildResult | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    _table: "RequestTable | None" = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return self.request.key

    def wait(self, timeout: float | None = None) -> State:
        """Block until the ticket is settled (done, failed or quarantined) or ``timeout`` passes."""
        assert self._table is not None
        return self._table.wait_until(self, lambda t: t.state in SETTLED, timeout)


class RequestTable:
    def __init__(self, *, quarantine_after: int = 2) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._tickets: dict[str, Ticket] = {}
        # Heap of (priority, sequence, key). Raising a priority pushes a new entry; stale entries are
        # skipped when popped (lazy deletion), which keeps every operation O(log n).
        self._heap: list[tuple[int, int, str]] = []
        self._seq = itertools.count()
        self._quarantine_after = quarantine_after
        self._closed = False

    # -- submission ---------------------------------------------------------------------------
    def submit(self, request: BuildRequest, priority: Priority) -> Ticket:
        """Queue ``request`` unless its key is known; a queued key is raised to ``priority``."""
        return self.submit_reporting(request, priority)[0]

    def submit_reporting(self, request: BuildRequest, priority: Priority) -> tuple[Ticket, str | None]:
        """``submit`` that also says what it did: "new", "raised", or None for a plain duplicate."""
        with self._cond:
            return self._submit_locked(request, priority)

    def submit_claimed(self, request: BuildRequest, priority: Priority, owner: str) -> tuple[Ticket, str | None, bool]:
        """``submit_reporting``, then claim the ticket for ``owner`` in the same step if it is queued, so
        that no helper takes it in between; the last item says whether the claim was made."""
        with self._cond:
            ticket, change = self._submit_locked(request, priority)
            return ticket, change, self._claim_locked(ticket, owner)

    def _submit_locked(self, request: BuildRequest, priority: Priority) -> tuple[Ticket, str | None]:
        """Called with the lock held."""
        ticket = self._tickets.get(request.key)
        if ticket is None:
            ticket = Ticket(request=request, priority=priority, _table=self)
            self._tickets[request.key] = ticket
            self._push(ticket)
            self._cond.notify_all()
            return ticket, "new"
        if not self._raise_locked(ticket, priority):
            return ticket, None
        self._cond.notify_all()
        return ticket, "raised"

    def _raise_locked(self, ticket: Ticket, priority: Priority) -> bool:
        """Raise ``ticket`` to ``priority`` if that is higher; a queued one goes into the heap again
        (its old entry is skipped when popped). Called with the lock held; True if it was raised."""
        if priority >= ticket.priority:
            return False
        ticket.priority = priority
        if ticket.state is State.QUEUED:
            self._push(ticket)
        return True

    def raise_queued(self, keys, priority: Priority) -> int:
        """Raise the queued tickets among ``keys`` to ``priority``, in the order given (a helper takes the
        first one first); unknown, running and finished keys are left alone. Returns how many were raised."""
        raised = 0
        with self._cond:
            for key in keys:
                ticket = self._tickets.get(key)
                if ticket is not None and ticket.state is State.QUEUED and self._raise_locked(ticket, priority):
                    raised += 1
            if raised:
                self._cond.notify_all()
        return raised

    def _push(self, ticket: Ticket) -> None:
        heapq.heappush(self._heap, (int(ticket.priority), next(self._seq), ticket.key))

    # -- taking work ----------------------------------------------------------------------------
    def take_next(self, owner: str, timeout: float, up_to: Priority | None = None) -> Ticket | None:
        """Pop the highest-priority queued ticket (one at ``up_to`` or higher, if given) and mark it
        RUNNING for ``owner``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                while self._heap and (up_to is None or self._heap[0][0] <= int(up_to)):
                    prio, _, key = heapq.heappop(self._heap)
                    ticket = self._tickets.get(key)  # None: forgotten (forget_done) since it was queued
                    if ticket is not None and ticket.state is State.QUEUED and int(ticket.priority) == prio:
                        self._mark_running(ticket, owner)
                        return ticket
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return None

    def claim(self, ticket: Ticket, owner: str) -> bool:
        """Take a queued ticket out of the queue to build it elsewhere (in place on the executor)."""
        with self._cond:
            return self._claim_locked(ticket, owner)

    def _claim_locked(self, ticket: Ticket, owner: str) -> bool:
        if ticket.state is not State.QUEUED:
            return False
        self._mark_running(ticket, owner)
        return True

    def _mark_running(self, ticket: Ticket, owner: str) -> None:
        ticket.state = State.RUNNING
        ticket.owner = owner
        ticket.started_at = time.monotonic()
        self._cond.notify_all()

    # -- completion -----------------------------------------------------------------------------
    def finish(self, ticket: Ticket, result: BuildResult) -> None:
        with self._cond:
            ticket.result = result
            ticket.state = State.DONE if result.ok else State.FAILED
            ticket.owner = None
            self._cond.notify_all()

    def release(self, ticket: Ticket, *, crashed: bool) -> State:
        """Give a RUNNING ticket back at once: its builder died (``crashed``) or gave up.

        A ticket whose builders died ``quarantine_after`` times is quarantined: reported, never
        handed to a helper again.
        """
        with self._cond:
            if ticket.state is not State.RUNNING:
                return ticket.state
            ticket.owner = None
            ticket.started_at = None
            if crashed:
                ticket.crashes += 1
            if ticket.crashes >= self._quarantine_after:
                ticket.state = State.QUARANTINED
                log.error("quarantined %s: it killed %d helpers; it will not be built ahead again",
                          ticket.request.label, ticket.crashes)
            else:
                ticket.state = State.QUEUED
                self._push(ticket)
            self._cond.notify_all()
            return ticket.state

    # -- waiting and inspection -------------------------------------------------------------------
    def wait_until(self, ticket: Ticket, predicate, timeout: float | None) -> State:
        with self._cond:
            self._cond.wait_for(lambda: predicate(ticket) or self._closed, timeout)
            return ticket.state

    def wait_for_change(self, ticket: Ticket, timeout: float) -> State:
        """Wait until the ticket's (state, owner) differs from now, or ``timeout`` passes."""
        with self._cond:
            before = (ticket.state, ticket.owner)
            self._cond.wait_for(lambda: (ticket.state, ticket.owner) != before or self._closed, timeout)
            return ticket.state

    def get(self, key: str) -> Ticket | None:
        with self._cond:
            return self._tickets.get(key)

    def forget_done(self, key: str) -> bool:
        """Drop a DONE ticket, so that the key can be submitted and built again (its build was found
        damaged on disk); a ticket in any other state stays. Returns whether one was dropped."""
        with self._cond:
            ticket = self._tickets.get(key)
            if ticket is None or ticket.state is not State.DONE:
                return False
            del self._tickets[key]
            return True

    def running(self) -> list[Ticket]:
        with self._cond:
            return [t for t in self._tickets.values() if t.state is State.RUNNING]

    def queued_ahead(self, ticket: Ticket) -> int:
        """Queued tickets a helper would take before ``ticket``."""
        with self._cond:
            return sum(1 for t in self._tickets.values()
                       if t.state is State.QUEUED and t is not ticket and
                       (t.priority, t.submitted_at) < (ticket.priority, ticket.submitted_at))

    def counts(self) -> dict[str, int]:
        with self._cond:
            out = {s.value: 0 for s in State}
            for t in self._tickets.values():
                out[t.state.value] += 1
            return out

    def has_queued(self, up_to: Priority | None = None) -> bool:
        """Whether a helper would find something to take now (at ``up_to`` or higher, if given)."""
        with self._cond:
            return self._has_queued_locked(up_to)

    def _has_queued_locked(self, up_to: Priority | None = None) -> bool:
        # the heap may hold stale entries (raised or claimed tickets); drop them from the top
        while self._heap:
            prio, _, key = self._heap[0]
            ticket = self._tickets.get(key)
            if ticket is not None and ticket.state is State.QUEUED and int(ticket.priority) == prio:
                return up_to is None or prio <= int(up_to)
            heapq.heappop(self._heap)
        return False

    def wait_queued(self, timeout: float, up_to: Priority | None = None) -> bool:
        """Wait until something is queued (at ``up_to`` or higher, if given), the table closes, or
        ``timeout`` passes."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._has_queued_locked(up_to), timeout)
            return self._has_queued_locked(up_to)

    def pending(self) -> int:
        with self._cond:
            return sum(1 for t in self._tickets.values() if t.state in (State.QUEUED, State.RUNNING))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or running; True if that happened within ``timeout``."""
        return self.wait_settled(max(Priority), timeout)

    def notify(self) -> None:
        """Wake every waiter so it re-evaluates (the pool's helper count changed)."""
        with self._cond:
            self._cond.notify_all()

    def wait_settled(self, priority: Priority, timeout: float | None = None) -> bool:
        """Wait until every ticket at ``priority`` or higher is settled; True if so within ``timeout``."""
        def settled() -> bool:
            return all(t.state in SETTLED for t in self._tickets.values() if t.priority <= priority)

        with self._cond:
            self._cond.wait_for(lambda: self._closed or settled(), timeout)
            return settled()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
