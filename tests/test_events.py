"""Stats events are declared once (core/observing/events.py): what a log line says is read back into its class."""
import json

import pytest

from jit_ahead.core.observing import events
from jit_ahead.core.observing.stats import Stats


def test_an_emitted_event_is_stamped_and_read_back_as_itself():
    stats, seen = Stats(), []
    stats.subscribe(seen.append)
    miss = events.ExecutorMiss(family="triton", key="k" * 64, label="add[k]", outcome="ready", seconds=0.1234567,
                               kernel="m.add", planned=True, siblings_raised=2)
    stats.phase = "serving"
    stats.emit(miss)
    (record,) = seen
    assert record["event"] == "executor_miss" and record["phase"] == "serving" and record["seconds"] == 0.123457
    assert "spec" not in record and "waited" not in record  # unset optional fields are not written
    stamp, back = events.parse(json.loads(json.dumps(record)))
    assert stamp.phase == "serving" and back == events.ExecutorMiss(**{**miss.fields(), "seconds": 0.123457})
    assert stats.count("executor_miss") == 1 and abs(stats.seconds("executor_miss") - 0.1234567) < 1e-9


def test_a_summary_keeps_its_counts_as_fields_of_their_own():
    stats, seen = Stats(), []
    stats.subscribe(seen.append)
    stats.emit(events.Summary({"planned": 3, "built in helpers": 2}))
    assert seen[0]["planned"] == 3 and seen[0]["built in helpers"] == 2 and "counts" not in seen[0]
    assert events.parse(seen[0])[1] == events.Summary({"planned": 3, "built in helpers": 2})


def test_lines_of_no_declared_event_or_missing_a_field_are_passed_over():
    assert events.parse({"event": "no_such_event", "time": 1.0}) is None
    assert events.parse({"event": "build_start", "time": 1.0, "family": "triton"}) is None  # no key, label...
    assert events.parse({"event": "phase", "time": "not a time"}) is None
    stamp, phase = events.parse({"event": "phase", "time": 2.0, "phase": "serving", "extra": 1})
    assert isinstance(phase, events.Phase) and stamp.time == 2.0


def test_every_event_has_one_name_and_subclasses_keep_their_own():
    assert sorted(events.EVENTS) == sorted([
        "phase", "summary", "planned", "plan_saved", "plan_loaded", "variant", "replay", "replay_autotune",
        "queued", "helper_ready", "forkserver_ready", "helper_preloaded", "forkserver_preloaded",
        "forkserver_idle_exit", "helper_retired", "build_start", "build_finish", "helper_crash", "executor_miss",
        "compile", "cache_damaged", "guard", "autotune_bench", "tune_ahead", "ready", "wait", "own_cpu"])
    assert events.ForkServerReady.name == "forkserver_ready" and events.HelperReady.name == "helper_ready"
    assert events.ForkServerReady._fields == events.HelperReady._fields
    with pytest.raises(TypeError, match="two stats events are named 'guard'"):
        class AnotherGuard(events.Event, name="guard"):
            label: str
    with pytest.raises(TypeError, match="needs the field 'key'"):
        events.BuildStart(family="triton", label="x", helper="h", priority="URGENT")
    with pytest.raises(AttributeError, match="frozen"):
        events.Phase().x = 1
