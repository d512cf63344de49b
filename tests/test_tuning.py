"""Tuning tasks: planning finds every (autotuner, tuning key) that real calls reach, with Triton's own
tuning key, the arguments as metadata and each config's grid; tasks whose timings would read values
planning does not have say so."""
import copy
import functools
import random

import torch

from jit_ahead import demo_models
from jit_ahead.core.planning import plan_cache
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.providers.fla import FlaGatedDeltaNetProvider
from jit_ahead.triton import capture, plan, tuning

from .kernels import basic as k
from .test_providers import planned_keys


def tritons_own_key(autotuner, args, kwargs) -> tuple:
    """The key Triton's Autotuner.run computes, read where it looks its cache up."""
    probe = copy.copy(autotuner)
    probe.cache = plan._ChoicesOf({})
    try:
        plan._original_autotuner_run(probe, *args, **kwargs)
    except plan._NoChoiceYet as missing:
        return missing.tuning_key
    raise AssertionError("Triton's run did not look a tuning key up")


def test_the_tuning_key_is_tritons_own_for_every_autotuned_fla_launch(monkeypatch):
    compared = []

    def both(autotuner, args, kwargs):
        mine = hand(autotuner, args, kwargs)
        compared.append((autotuner.base_fn.__name__, mine, tritons_own_key(autotuner, args, dict(kwargs))))
        return mine

    hand = tuning.tuning_key
    monkeypatch.setattr(tuning, "tuning_key", both)
    model = demo_models.fla_gated_deltanet(layers=1)
    on_cpu = demo_models.fla_gated_deltanet(layers=1, device="cpu")  # a padded batch unpads with real values
    with capture():
        demo_models.serve(model, 2, 70, 2, device="meta")
        demo_models.serve(on_cpu, 3, 9, 1, device="cpu", lengths=(9, 4, 1))
    assert len({name for name, _, _ in compared}) >= 5
    assert [c for c in compared if c[1] != c[2]] == []


def test_planning_meets_every_tuning_key_real_calls_reach():
    limits = EngineLimits(max_num_tokens=160, max_batch_size=3, max_seq_len=128, cuda_graph_batch_sizes=(1, 2))
    model = demo_models.fla_gated_deltanet(layers=1)
    planned = {t.identity for t in planned_keys(FlaGatedDeltaNetProvider(), model, limits).tuning_tasks}
    assert planned
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(5):
        batch = rng.randint(1, 3)
        prompt = rng.randint(1, min(125, 160 // batch))
        with capture() as real:
            demo_models.serve(model, batch, prompt, rng.randint(0, 3), device="meta")
        reached = {t.identity for t in real.tuning_tasks}
        assert reached and reached <= planned, f"seed {seed}: {batch}x{prompt}: {sorted(reached - planned)}"


def test_a_task_holds_the_arguments_and_every_configs_grid():
    x = torch.empty(1000, device="meta")
    with capture() as plan_:
        k.tuned_copy_kernel[lambda meta: (triton_cdiv(1000, meta["BLOCK"]),)](x, torch.empty_like(x), 1000)
        k.tuned_copy_kernel[lambda meta: (triton_cdiv(1000, meta["BLOCK"]),)](x, torch.empty_like(x), 1000)
    (task,) = plan_.tuning_tasks  # the second launch met the same key
    assert task.unsupported is None and task.key == (1000, "torch.float32", "torch.float32")
    assert task.args[0] == tuning.TensorSpec((1000,), (1,), "torch.float32") and task.args[2] == 1000
    assert dict((dict(c)["BLOCK"], g) for c, g in task.grids) == {128: (8, 1, 1), 256: (4, 1, 1), 512: (2, 1, 1)}
    assert task.nbytes == 2 * 4000


def triton_cdiv(a, b):
    return -(-a // b)


def test_an_integer_tensor_on_meta_is_named_and_a_host_one_travels_with_its_values():
    with capture() as plan_:
        k.width_tuned_kernel[(1,)](torch.empty(64, dtype=torch.int32, device="meta"), 64, 3)
    (task,) = plan_.tuning_tasks
    assert "integer tensor x_ptr" in task.unsupported
    with capture() as plan_:
        k.width_tuned_kernel[(1,)](torch.arange(64, dtype=torch.int32), 64, 3)
    (task,) = plan_.tuning_tasks
    assert task.unsupported is None and task.args[0].values == tuple(range(64))


def test_a_launch_with_a_known_choice_or_one_config_makes_no_task():
    x = torch.empty(300, device="meta")
    with capture() as plan_:
        k.add_kernel[(1,)](x, x, x, 300, BLOCK=128)  # not autotuned
    assert plan_.tuning_tasks == []
    # a pruning function that reads a value: below 64 one config is left, and Triton benchmarks nothing
    with capture() as plan_:
        k.width_tuned_pruned_kernel[(1,)](torch.empty(128, device="meta"), 40, 3)
    assert plan_.tuning_tasks == []
    with capture() as plan_:
        k.width_tuned_pruned_kernel[(1,)](torch.empty(128, device="meta"), 100, 3)
    (task,) = plan_.tuning_tasks
    assert task.key == (3, "torch.float32") and len(task.grids) == 2


# -- tune-ahead: the autotuner's own benchmark, run from the tasks (the stand-in driver times nothing: the
# test kernel's do_bench counts its calls and prefers the last config) -------------------------------------
def planned_stored_tuning(n: int):
    x = torch.empty(n, device="meta")
    with capture() as plan_:
        k.stored_tuning_kernel[lambda meta: (triton_cdiv(n, meta["BLOCK"]),)](x, torch.empty_like(x), n)
    return plan_


def test_tune_ahead_runs_the_autotuners_own_benchmark_on_builds_helpers_made(session_factory):
    from jit_ahead.core.priority import Priority
    from jit_ahead.triton.tune_ahead import tune

    from .conftest import wait_all

    session = session_factory(workers=1)
    events = []
    session.stats.subscribe(events.append)
    n = 7101  # a tuning key no other test chose a config for
    plan_ = planned_stored_tuning(n)
    wait_all(session.families["triton"].submit(plan_, Priority.WARMUP))
    before = len(k.BENCHMARKED)
    result = tune(plan_.tuning_tasks, torch.device("meta"), budget_bytes=1 << 20)
    assert [t.key for t in result.tuned] == [(n, "torch.float32", "torch.float32")] and not result.left
    assert len(k.BENCHMARKED) - before == 3  # every config timed by the autotuner's own do_bench
    key = result.tuned[0].key
    assert str(k.stored_tuning_kernel.cache[key]) == str(k.stored_tuning_kernel.configs[-1])
    # each config's variant was loaded from the helper's build, none compiled here
    assert [e["outcome"] for e in events if e["event"] == "executor_miss"] == ["disk"] * 3
    assert [e for e in events if e["event"] == "compile" and not e.get("cache_hit")] == []
    # the launch that meets the key later runs the choice at once, as on a warm cache
    k.stored_tuning_kernel[(1,)](torch.empty(n, device="meta"), torch.empty(n, device="meta"), n)
    assert len(k.BENCHMARKED) - before == 3
    # again: the choice is held, nothing runs
    again = tune(plan_.tuning_tasks, torch.device("meta"), budget_bytes=1 << 20)
    assert again.chosen_already == 1 and not again.tuned and len(k.BENCHMARKED) - before == 3


def test_tune_ahead_skips_a_key_whose_choice_an_earlier_start_recorded(session_factory):
    # Before, every recorded key still ran on the GPU at each warm start: its tensors made and its chosen
    # config launched once (254 keys of the Qwen3.5 hybrid at the large limits), for nothing the first
    # launch would not do by itself.
    from jit_ahead.triton import autotune
    from jit_ahead.triton.tune_ahead import tune

    session = session_factory(workers=0)
    events = []
    session.stats.subscribe(events.append)
    tuner = k.stored_tuning_kernel
    recorded, other = 7201, 7202  # tuning keys no other test chose a config for
    best = tuner.configs[-1]
    owner = object()
    choice = autotune.TuningChoice(*autotune._identity(tuner, (recorded, "torch.float32", "torch.float32"),
                                                       tuner.configs)[:5], str(best))
    # a choice recorded over other configs than the autotuner prunes to does not answer the key
    stale = autotune.TuningChoice(*choice.identity[:3], (other, "torch.float32", "torch.float32"),
                                  tuple(str(c) for c in tuner.configs[:2]), str(tuner.configs[0]))
    # an autotuner whose pruning reads an argument's value: pruned on meta as the first launch will prune
    pruned_tuner = k.width_tuned_pruned_kernel
    width = 7203
    with capture() as pruned_plan:
        pruned_tuner[(1,)](torch.empty(128, device="meta"), 100, width)
    pruned_choice = autotune.TuningChoice(*autotune._identity(pruned_tuner, (width, "torch.float32"),
                                                              pruned_tuner.configs)[:5], str(pruned_tuner.configs[1]))
    # the tasks of the plan a cold start saved (it had no choices yet), read back by a warm start
    tasks = planned_stored_tuning(recorded).tuning_tasks + planned_stored_tuning(other).tuning_tasks
    tasks += pruned_plan.tuning_tasks
    assert len(tasks) == 3
    autotune.KNOWN.add([choice, stale, pruned_choice], owner=owner)  # and the choices the cold start recorded
    try:
        before = len(k.BENCHMARKED)
        result = tune(tasks, torch.device("meta"), budget_bytes=1 << 20)
        assert result.chosen_already == 2 and [t.key[0] for t in result.tuned] == [other]
        assert len(k.BENCHMARKED) - before == 3  # only the stale key's configs were timed
        assert (recorded, "torch.float32", "torch.float32") not in tuner.cache  # left to the first launch
        x = torch.empty(recorded, device="meta")
        tuner[(1,)](x, x, recorded)  # the first launch takes the recorded choice: no benchmark
        assert len(k.BENCHMARKED) - before == 3
        assert str(tuner.cache[(recorded, "torch.float32", "torch.float32")]) == str(best)
    finally:
        autotune.KNOWN.forget(owner)


def test_tune_ahead_times_each_config_over_its_own_window_and_leaves_the_autotuner_as_it_was(monkeypatch, caplog):
    from jit_ahead.core import knobs
    from jit_ahead.triton import standin
    from jit_ahead.triton.tune_ahead import tune

    n = 7309  # a tuning key no other test chose a config for
    x = torch.empty(n, device="meta")
    with capture() as plan_:
        k.tuned_copy_kernel[lambda meta: (triton_cdiv(n, meta["BLOCK"]),)](x, torch.empty_like(x), n)
    (task,) = plan_.tuning_tasks
    autotuner = k.tuned_copy_kernel
    cached_before = vars(autotuner).get("do_bench")
    asked = len(standin.asked_windows)
    result = tune([task], torch.device("meta"), budget_bytes=1 << 20, rep_ms=8)
    assert [t.key for t in result.tuned] == [task.key]
    # Triton's default benchmark timed each of the three configs over 8 ms after 2 of warmup, not 100 after 25
    assert list(standin.asked_windows)[asked:] == [(2, 8)] * 3
    assert vars(autotuner).get("do_bench") is cached_before  # the autotuner's own benchmark again afterwards
    # wrapped, the stand-in's benchmark is still known as one that times nothing: no choice of it is kept
    from jit_ahead.triton.tune_ahead import windowed_benchmark

    assert standin.times_nothing(windowed_benchmark(8)) and standin.times_nothing(functools.partial(standin._launch_once))
    assert not standin.times_nothing(k._bench_prefers_later)
    autotuner.do_bench(lambda: None, quantiles=(0.5,))
    assert standin.asked_windows[-1] == (25, 100)

    # an autotuner given a do_bench of its own keeps it
    (own,) = planned_stored_tuning(7311).tuning_tasks
    before, asked = len(k.BENCHMARKED), len(standin.asked_windows)
    assert tune([own], torch.device("meta"), budget_bytes=1 << 20, rep_ms=8).tuned
    assert len(k.BENCHMARKED) - before == 3 and len(standin.asked_windows) == asked

    # the knob: its default, a value, and absurd ones, which log one line and keep the default
    monkeypatch.delenv("JIT_AHEAD_TUNE_AHEAD_REP_MS", raising=False)
    assert knobs.tune_ahead_rep_ms() == 20
    monkeypatch.setenv("JIT_AHEAD_TUNE_AHEAD_REP_MS", "100")
    assert knobs.tune_ahead_rep_ms() == 100
    for bad in ("0", "1000000000", "fast"):
        monkeypatch.setenv("JIT_AHEAD_TUNE_AHEAD_REP_MS", bad)
        caplog.clear()
        assert knobs.tune_ahead_rep_ms() == 20
        assert any("JIT_AHEAD_TUNE_AHEAD_REP_MS" in r.getMessage() for r in caplog.records)


def test_tune_ahead_names_what_it_leaves_and_why():
    import dataclasses

    from jit_ahead.triton.tune_ahead import tune

    (task,) = planned_stored_tuning(7203).tuning_tasks
    gone = dataclasses.replace(task, module="jit_ahead_no_such_module")
    other = dataclasses.replace(task, configs=task.configs[:1])  # another autotuner of the same kernel
    with capture() as plan_:
        k.width_tuned_kernel[(1,)](torch.empty(64, dtype=torch.int32, device="meta"), 64, 3)
    (reads,) = plan_.tuning_tasks
    before = len(k.BENCHMARKED)
    result = tune([task, gone, other, reads, task], torch.device("meta"), budget_bytes=task.nbytes - 1)
    why = {left.task.identity: left.why for left in result.left}
    assert "exceed the tune-ahead memory budget" in why[task.identity]
    assert why[gone.identity] == why[other.identity] == "its autotuner is not imported in this process"
    assert "integer tensor x_ptr" in why[reads.identity]
    assert not result.tuned and len(result.left) == 4 and len(k.BENCHMARKED) == before
    assert result.summary()["left"] == 4


def test_planner_processes_hand_their_tuning_tasks_to_the_session(session_factory, monkeypatch):
    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "2")
    limits = EngineLimits(max_num_tokens=96, max_batch_size=2, max_seq_len=64, cuda_graph_batch_sizes=(1, 2))
    model = demo_models.fla_gated_deltanet(layers=1)
    here = {t.identity for t in planned_keys(FlaGatedDeltaNetProvider(), model, limits).tuning_tasks}
    session = session_factory(workers=0)
    run = session.plan_model(model, limits, [FlaGatedDeltaNetProvider()])
    assert run.wait(600) and not run.errors
    assert {t.identity for t in session.families["triton"].tuning_tasks} == here
    # no GPU in this process: nothing is tuned, and the summary says why
    (summary,) = session.tune_ahead().values()
    assert summary["tuned_ahead"] == 0 and summary["left_why"] == {"no GPU in this process": len(here)}


def test_tasks_are_saved_with_the_plan_and_read_back_by_the_next_start(session_factory):
    import json

    from jit_ahead.core.planning import plan_cache
    from jit_ahead.triton.tuning import decode_task, encode_task

    limits = EngineLimits(max_num_tokens=64, max_batch_size=2, max_seq_len=48, cuda_graph_batch_sizes=(1, 2))
    model = demo_models.fla_gated_deltanet(layers=1)
    first = session_factory(workers=0)
    run = first.plan_model(model, limits, [FlaGatedDeltaNetProvider()])
    assert run.wait(600) and not run.read_saved and run.saved_plan
    planned = first.families["triton"].tuning_tasks
    assert planned
    for task in planned:  # JSON and back: the same task
        assert decode_task(json.loads(json.dumps(encode_task(task)))) == task
    second = session_factory(workers=0)
    again = second.plan_model(model, limits, [FlaGatedDeltaNetProvider()])
    assert again.wait(600) and again.read_saved
    assert second.families["triton"].tuning_tasks == planned


def test_a_saved_task_that_is_not_one_makes_the_plan_unusable_not_the_start(session_factory, caplog):
    import json
    from pathlib import Path

    from jit_ahead.triton.tuning import decode_task, encode_task

    (task,) = planned_stored_tuning(7305).tuning_tasks
    entry = encode_task(task)
    for broken in ({**entry, "module": "os; rm"}, {**entry, "key": [{"x": 1}]},
                   {**entry, "args": [{"tensor": [[4], [1], "torch.float32; x", 0, None]}]},
                   {**entry, "grids": [[[], ["x"]]]}):
        try:
            decode_task(broken)
        except (ValueError, TypeError, KeyError):
            continue
        raise AssertionError(f"accepted {broken}")
    # a saved plan whose task does not decode (its digest matches: written so, not damaged since): one
    # line, and the start plans again
    limits = EngineLimits(max_num_tokens=48, max_batch_size=1, max_seq_len=48, cuda_graph_batch_sizes=(1,))
    model = demo_models.fla_gated_deltanet(layers=1)
    run = session_factory(workers=0).plan_model(model, limits, [FlaGatedDeltaNetProvider()])
    assert run.wait(600) and run.saved_plan
    path = Path(run.saved_plan)
    lines = path.read_text().splitlines()
    bodies = [json.loads(line) for line in lines[1:]]
    (triton,) = [b for b in bodies if b.get("extras", {}).get("tuning_tasks")]
    triton["extras"]["tuning_tasks"][0][1]["module"] = "not a module"
    body = [json.dumps(b) for b in bodies]
    header = {**json.loads(lines[0]), "body": plan_cache._body_digest(body)}
    path.write_text("\n".join([json.dumps(header)] + body) + "\n")
    again = session_factory(workers=0).plan_model(model, limits, [FlaGatedDeltaNetProvider()])
    assert again.wait(600) and not again.read_saved
    assert "is unusable (ValueError: not a kernel name" in caplog.text


def test_the_stats_log_and_the_report_show_what_tune_ahead_did(monkeypatch, tmp_path, capsys):
    from jit_ahead.cli import main
    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session

    from .conftest import wait_all

    monkeypatch.setenv("JIT_AHEAD_STATS", str(tmp_path / "logs") + "/")
    session = Session(triton={"workers": 1}).start()
    try:
        plan_ = planned_stored_tuning(7407)
        with capture() as reads:
            k.width_tuned_kernel[(1,)](torch.empty(64, dtype=torch.int32, device="meta"), 64, 5)
        wait_all(session.families["triton"].submit(plan_, Priority.WARMUP))
        session.families["triton"].note_tuning(plan_.tuning_tasks + reads.tuning_tasks, Priority.WARMUP)
        summary = session.families["triton"].tune_ahead(device=torch.device("meta"))
        session.mark_serving(tune_ahead=False)
        n = 7409  # a key nobody planned, met after serving started: its autotuner benchmarks it there
        k.stored_tuning_kernel[(1,)](torch.empty(n, device="meta"), torch.empty(n, device="meta"), n)
    finally:
        session.close()
    assert summary["tuned_ahead"] == 1 and summary["left"] == 1
    (path,) = (tmp_path / "logs").glob("jit_ahead_stats.*.jsonl")
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    header = next(line.split("  ") for line in out.splitlines() if line.startswith("kernel"))
    assert [h.strip() for h in header if h.strip()][-4:] == ["tuned ahead", "tune left", "tuned warmup", "tuned serving"]
    # tuned ahead, left, tuned by a launch in warmup, after serving started
    row = next(line.split() for line in out.splitlines() if line.startswith("tests.kernels.basic.stored_tuning_kernel"))
    assert row[-4:] == ["1", "0", "0", "1"]
    row = next(line.split() for line in out.splitlines() if line.startswith("tests.kernels.basic.width_tuned_kernel"))
    assert row[-4:] == ["0", "1", "0", "0"]
    assert "tuning keys benchmarked by a launch after serving started: 1" in out
    assert "tune-ahead: 1 tuning keys given a choice (benchmarked, or a stored choice read) in" in out and "1 left to their first launch" in out
    assert "integer tensor x_ptr" in out


def test_mark_serving_tunes_ahead_unless_the_knob_or_the_caller_says_not(session_factory, monkeypatch, caplog):
    session = session_factory(workers=0)
    calls = []
    monkeypatch.setattr(session.families["triton"], "tune_ahead", lambda budget=None: calls.append(budget) or {})
    monkeypatch.setenv("JIT_AHEAD_TUNE_AHEAD", "0")
    session.mark_serving()
    assert calls == [] and session.phase == "serving"
    for value, expected in (("1", 1), ("yes please", 1)):  # a bad value: one line, the default (on)
        other = session_factory(workers=0)
        monkeypatch.setattr(other.families["triton"], "tune_ahead", lambda budget=None: calls.append(budget) or {})
        monkeypatch.setenv("JIT_AHEAD_TUNE_AHEAD", value)
        other.mark_serving()
        assert len(calls) == expected
        calls.clear()
    assert "JIT_AHEAD_TUNE_AHEAD='yes please' is not one of 1|0|on|off; using 1" in caplog.text
    quiet = session_factory(workers=0)
    monkeypatch.setattr(quiet.families["triton"], "tune_ahead", lambda budget=None: calls.append(budget) or {})
    quiet.mark_serving(tune_ahead=False)  # as the JIT_AHEAD_WARMUP_S timer calls it
    assert calls == []


def test_autotuners_with_value_hooks_under_value_heuristics_are_tuned_with_what_planning_passed():
    # reset_to_zero / restore_value run on the tuning inputs; the heuristics' value (EVEN, from n) is the
    # one planning computed, passed to the autotuner as the launch passed it
    from jit_ahead.triton.tune_ahead import tune

    n = 7510
    x = torch.empty(n, device="meta")
    with capture() as plan_:
        k.hooked_tuning_kernel[lambda meta: (triton_cdiv(n, meta["BLOCK"]),)](x, torch.empty_like(x), n)
    (task,) = plan_.tuning_tasks
    assert dict(task.kwargs) == {"EVEN": True}
    autotuner = k.hooked_tuning_kernel.fn
    before = len(k.BENCHMARKED)
    result = tune([task], torch.device("meta"), budget_bytes=1 << 20)
    assert [t.key for t in result.tuned] == [task.key] and len(k.BENCHMARKED) - before == 2
    assert str(autotuner.cache[task.key]) == str(autotuner.configs[-1])


def test_an_argument_a_task_cannot_hold_is_named():
    class Boxed(torch.Tensor):
        pass

    x = torch.empty(256, device="meta").as_subclass(Boxed)
    with capture() as plan_:
        k.tuned_copy_kernel[(1,)](x, torch.empty(256, device="meta"), 256)
    (task,) = plan_.tuning_tasks
    assert task.unsupported == "it takes a tensor subclass (Boxed), which a tuning task cannot hold"


def test_tune_ahead_inputs_hold_values_like_activations_and_indices_stay_valid():
    # Timings on zeros rank configs otherwise than on the requests' data (the GPU clocks differently on
    # zero operands, kernels may skip work on them): floating-point inputs are drawn in [-1, 1], the same
    # for the same seed; integer tensors are zeros, or the values planning had.
    from jit_ahead.triton import tune_ahead

    def made(spec, seed=0):
        return tune_ahead._tensor(spec, torch.device("cpu"), torch.Generator().manual_seed(seed))

    floats = made(tuning.TensorSpec((64, 32), (1, 64), "torch.bfloat16"))
    assert floats.shape == (64, 32) and floats.stride() == (1, 64) and floats.dtype == torch.bfloat16
    values = floats.float()
    assert (values != 0).float().mean() > 0.99 and values.min() >= -1 and values.max() <= 1
    assert values.std() > 0.4  # spread over the range, not a constant
    assert torch.equal(floats, made(tuning.TensorSpec((64, 32), (1, 64), "torch.bfloat16")))
    offset = made(tuning.TensorSpec((4, 4), (8, 1), "torch.float32", offset=3))
    assert offset.storage_offset() == 3 and (offset != 0).all()
    assert not made(tuning.TensorSpec((16,), (1,), "torch.int32")).any()
    assert not made(tuning.TensorSpec((16,), (1,), "torch.bool")).any()
    fp8 = made(tuning.TensorSpec((64,), (1,), "torch.float8_e4m3fn")).float()
    assert (fp8 != 0).float().mean() > 0.9 and fp8.abs().max() <= 1
    index = made(tuning.TensorSpec((4,), (1,), "torch.int64", values=(3, 1, 2, 0)))
    assert index.tolist() == [3, 1, 2, 0]
