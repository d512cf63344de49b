"""Variants into memory before serving: after ``Session.load_into_memory`` the first launch of every planned,
built variant is an in-memory hit, so nothing reaches Triton's compile path while serving (what vLLM's JIT
monitor counts as a compile: its hook is Triton's ``jit_post_compile_hook``)."""
import random

import torch
from triton import knobs

from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core.priority import Priority

from .kernels import basic as k
from .layers import ScaleProvider, model

LIMITS = EngineLimits(max_num_tokens=48, max_batch_size=8, cuda_graph_batch_sizes=(1, 8))


def in_memory_misses(net, token_counts) -> list[str]:
    """Launch ``net`` at each token count; every launch that left the in-memory cache, by kernel."""
    misses = []
    previous = knobs.runtime.jit_post_compile_hook

    def count(*args, **kwargs):
        misses.append(kwargs.get("fn").name if kwargs.get("fn") is not None else "?")
        return previous(*args, **kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = count
    try:
        for tokens in token_counts:
            for layer in net:
                layer(torch.empty(tokens, layer.hidden, device="meta", dtype=torch.bfloat16))
    finally:
        knobs.runtime.jit_post_compile_hook = previous
    return misses


def planned_and_built(session_factory):
    session = session_factory(workers=1)
    net = model()
    run = session.plan_model(net, LIMITS, [ScaleProvider()])
    assert run.wait(300) and session.wait_ready(300, priority=Priority.BACKGROUND)
    k.scale_kernel.fn.device_caches.clear()  # as a fresh server process: built on disk, nothing in memory
    return session, net, run


def test_loaded_ahead_a_served_mix_leaves_the_memory_cache_never(session_factory):
    session, net, run = planned_and_built(session_factory)
    done = session.load_into_memory()
    planned = sum(run.variants.values())
    assert done["triton"]["loaded"] == planned and done["triton"]["failed"] == 0
    rng = random.Random()
    served = [rng.randint(1, LIMITS.max_num_tokens) for _ in range(20)]
    session.mark_serving()
    assert in_memory_misses(net, served) == []
    again = session.load_into_memory()  # idempotent: everything is in memory already
    assert again["triton"]["loaded"] == 0 and again["triton"]["already"] == planned


def test_without_it_the_first_launches_load_from_disk(session_factory):
    session, net, run = planned_and_built(session_factory)
    session.mark_serving()
    misses = in_memory_misses(net, range(1, LIMITS.max_num_tokens + 1))
    assert len(misses) == sum(run.variants.values()) and set(misses) == {"scale_kernel"}


def test_a_variant_whose_kernel_cannot_be_imported_is_one_line_and_the_rest_load(session_factory, caplog):
    from dataclasses import replace

    session, net, run = planned_and_built(session_factory)
    executor = session.families["triton"].executor
    (one, *rest) = executor.planned_requests()
    executor._planned[one.predicted_hash] = replace(one, module="tests.no_such_module")
    done = session.load_into_memory()["triton"]
    assert done["failed"] == 1 and done["loaded"] == len(rest)
    said = [r for r in caplog.records if "could not be loaded into memory ahead" in r.getMessage()]
    assert len(said) == 1
