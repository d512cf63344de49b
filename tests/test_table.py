"""The request table alone: priorities, deduplication, raising, claims, crashes and quarantine."""
import threading
import time

from jit_ahead.core.priority import Priority
from jit_ahead.core.requests import BuildRequest, BuildResult
from jit_ahead.core.building.table import RequestTable, State


def req(key: str) -> BuildRequest:
    return BuildRequest(family="t", key=key, payload=None, label=key)


def test_priority_order_then_submission_order():
    table = RequestTable()
    for key, prio in [("bg1", Priority.BACKGROUND), ("rp", Priority.REPLAY), ("bg2", Priority.BACKGROUND),
                      ("wu", Priority.WARMUP), ("ur", Priority.URGENT)]:
        table.submit(req(key), prio)
    order = [table.take_next("h", 0).key for _ in range(5)]
    assert order == ["ur", "wu", "rp", "bg1", "bg2"]
    assert table.take_next("h", 0.01) is None


def test_duplicates_share_one_ticket_and_a_higher_priority_raises_it():
    table = RequestTable()
    first = table.submit(req("a"), Priority.BACKGROUND)
    table.submit(req("b"), Priority.BACKGROUND)
    again = table.submit(req("a"), Priority.WARMUP)
    lower = table.submit(req("a"), Priority.BACKGROUND)  # never lowers
    assert first is again is lower and first.priority is Priority.WARMUP
    assert table.counts()["queued"] == 2
    assert [table.take_next("h", 0).key for _ in range(2)] == ["a", "b"]
    assert table.take_next("h", 0.01) is None  # the stale heap entry of "a" is skipped


def test_raise_queued_moves_only_queued_tickets_ahead_in_the_order_given():
    table = RequestTable()
    for key in ("w", "a", "b", "c", "running"):
        table.submit(req(key), Priority.WARMUP if key == "w" else Priority.BACKGROUND)
    table.submit(req("u"), Priority.URGENT)
    assert table.take_next("h", 0).key == "u"
    assert table.take_next("h", 0).key == "w"
    running = table.take_next("h", 0)
    assert running.key == "a"
    assert table.raise_queued(["c", "unknown", "a", "b"], Priority.URGENT) == 2  # "a" is running already
    assert running.priority is Priority.BACKGROUND
    assert [table.take_next("h", 0).key for _ in range(3)] == ["c", "b", "running"]
    assert table.raise_queued(["c"], Priority.WARMUP) == 0  # taken: nothing to raise


def test_claim_only_takes_queued_tickets():
    table = RequestTable()
    ticket = table.submit(req("a"), Priority.BACKGROUND)
    assert table.claim(ticket, "executor") and ticket.owner == "executor"
    assert not table.claim(ticket, "executor")
    assert table.take_next("h", 0.01) is None


def test_waiters_wake_on_finish_from_another_thread():
    table = RequestTable()
    ticket = table.submit(req("a"), Priority.BACKGROUND)
    taken = table.take_next("helper-0", 0)
    threading.Timer(0.1, table.finish, args=(taken, BuildResult("a", True, 0.1, "helper-0"))).start()
    t0 = time.monotonic()
    assert ticket.wait(5) is State.DONE
    assert time.monotonic() - t0 < 2


def test_crash_requeues_then_quarantines():
    table = RequestTable(quarantine_after=2)
    ticket = table.submit(req("a"), Priority.BACKGROUND)
    table.take_next("helper-0", 0)
    assert table.release(ticket, crashed=True) is State.QUEUED and ticket.crashes == 1
    assert table.take_next("helper-1", 0) is ticket
    assert table.release(ticket, crashed=True) is State.QUARANTINED
    assert table.take_next("helper-1", 0.01) is None
    assert ticket.wait(0) is State.QUARANTINED


def test_wait_idle_reports_whether_everything_settled():
    table = RequestTable()
    ticket = table.submit(req("a"), Priority.BACKGROUND)
    assert not table.wait_idle(0.01)
    table.finish(table.take_next("h", 0), BuildResult("a", False, 0.0, "h", "boom"))
    assert table.wait_idle(0.01) and ticket.state is State.FAILED


def test_a_forgotten_ticket_leaves_no_entry_that_breaks_the_queue():
    # A claimed or raised ticket leaves a stale heap entry; once forget_done dropped the ticket, looking
    # that entry up raised KeyError in every slot polling the queue.
    table = RequestTable()
    claimed, change, ok = table.submit_claimed(req("a"), Priority.URGENT, "executor")
    assert ok and change == "new"
    table.finish(claimed, BuildResult("a", True, 0.1, "executor"))
    raised = table.submit(req("b"), Priority.BACKGROUND)
    table.submit(req("b"), Priority.URGENT)  # raised: its BACKGROUND entry is stale
    assert table.take_next("helper-0", 0.0) is raised
    table.finish(raised, BuildResult("b", True, 0.1, "helper-0"))
    assert table.forget_done("a") and table.forget_done("b") and not table.forget_done("missing")
    assert table.has_queued() is False
    assert table.take_next("helper-0", 0.0) is None
    again = table.submit(req("a"), Priority.WARMUP)  # built again, as a damaged entry is
    assert again is not claimed and table.take_next("helper-0", 0.0) is again
