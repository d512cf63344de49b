"""Planning -> helpers -> a fresh process whose normal launch path finds every variant on disk."""
import pytest

from jit_ahead.triton import capture

from .conftest import run_consumer, wait_all
from .scenarios import run_scenario


def plan(scenario: str):
    with capture() as planned:
        run_scenario(scenario)
    return planned


def test_planning_compiles_nothing_and_dedups(triton_cache):
    planned = plan("basic")
    # 7 launches; the autotuned one requests its 3 configs: 9 variants, none built.
    assert planned.launches == 9 and len(planned) == 9
    assert not list(triton_cache.glob("*/__grp__*.json"))
    again = plan("basic")
    assert {r.predicted_hash for r in again.requests} == {r.predicted_hash for r in planned.requests}


def test_helpers_build_every_planned_variant_and_a_fresh_process_hits_disk(triton_cache, session_factory):
    planned = plan("basic")
    session = session_factory(workers=2)
    results = wait_all(session.families["triton"].submit(planned))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert {r.builder for r in results} <= {"helper-0", "helper-1"}
    assert all(r.details["hash"] == r.key for r in results)  # landed where the launch will look

    events = run_consumer("basic", triton_cache)
    assert {e["hash"] for e in events} == {r.predicted_hash for r in planned.requests}
    assert all(e["cache_hit"] for e in events), [e for e in events if not e["cache_hit"]]


def test_requests_already_on_disk_are_not_queued(triton_cache, session_factory):
    planned = plan("basic")
    session = session_factory(workers=1)
    wait_all(session.families["triton"].submit(planned))
    assert planned.missing() == []
    assert session.families["triton"].submit(planned) == []


def test_repeated_launches_in_a_capture_hit_its_private_cache_which_is_dropped_after():
    import torch

    from .kernels import basic as k

    x = torch.empty(1 << 14, device="meta", dtype=torch.float32)
    with capture() as planned:
        for n in range(1, 2049):  # n == 1 and n % 16 == 0 are the only classes of a plain int
            k.add_kernel[(1,)](x[:n], x, x, n, BLOCK=128)
        device = planned.device
        assert device in k.add_kernel.device_caches
    # classes: n == 1 (constexpr), n % 16 == 0, other; each with x[:n] aligned: 3 variants, 3 hook calls.
    assert len(planned) == 3 and planned.launches == 3
    assert device not in k.add_kernel.device_caches
    # A real launch afterwards is untouched by the capture: it misses in memory and compiles.
    assert k.add_kernel[(1,)](x, x, x, 4096, BLOCK=128) is not None


def test_plan_launch_returns_every_pruned_autotune_config():
    import torch

    from jit_ahead.triton import plan_launch

    from .kernels import basic as k

    x = torch.empty(4096, device="meta", dtype=torch.float16)
    requests = plan_launch(k.tuned_copy_kernel, x, x, 4096)
    assert len(requests) == 3 and {r.qualname for r in requests} == {"tuned_copy_kernel"}


def test_planning_an_autotuned_launch_leaves_the_autotuner_a_serving_thread_runs_alone():
    # Autotuner.run keeps the arguments of the launch in progress in ``nargs`` (its pruning and hooks read
    # them there); a capture in a planning thread must not write them while the executor runs the kernel
    import torch

    from jit_ahead.triton import plan_launch

    from .kernels import basic as k

    autotuner = k.tuned_copy_kernel
    serving_args = {"in progress": "of the executor"}
    autotuner.nargs = serving_args
    try:
        x = torch.empty(4096, device="meta", dtype=torch.float16)
        assert len(plan_launch(autotuner, x, x, 4096)) == 3  # no choice yet: every config requested
        assert autotuner.nargs is serving_args
    finally:
        autotuner.nargs = None


@pytest.mark.parametrize("name, variants, repeats", [("width_tuned_kernel", 6, 126), ("width_tuned_even_kernel", 8, 0),
                                                     ("width_tuned_pruned_kernel", 5, 124)])
def test_an_autotuned_launch_at_many_counts_plans_what_separate_launches_do(name, variants, repeats):
    # One capture skips an autotuned launch whose configs and argument specialization it has already
    # requested in full: with fixed configs before computing the tuning key, with a pruning function
    # (which reads the count's value) only after it pruned; where heuristics inside the autotuner read the
    # count's value (EVEN), it cannot know that up front and launches every config.
    import torch

    from jit_ahead.triton import capture, plan_launch

    from .kernels import basic as k

    kernel = getattr(k, name)
    x = torch.empty(4096, device="meta", dtype=torch.float16)
    counts = range(1, 130)
    separately = {r.predicted_hash for n in counts for r in plan_launch(kernel, x, n, 64)}
    with capture() as plan:
        for n in counts:
            kernel.run(x, n, 64, grid=(1,), warmup=True)
    assert {r.predicted_hash for r in plan.requests} == separately
    assert len(separately) == variants
    assert plan.autotune_repeats == repeats
