"""Planning whose cost does not grow with the limits: the model planner calls a few points per shape class
(``providers/shape_classes.py``) and plans exactly what calling every shape plans; at the limits engines use,
random real calls (a new seed each run) launch nothing it did not plan."""
import dataclasses
import logging
import random

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.providers import shape_classes
from jit_ahead.providers.base import Claims
from jit_ahead.providers.device_gates import meta_stands_for_the_gpu
from jit_ahead.providers.meta import MetaCaller, meta_reads_answered
from jit_ahead.providers.model import ModelProvider, _sweep, left_padded_mask
from jit_ahead.providers.shape_classes import Interval, Poly, Select, SiteModel, SlotModel, Space, Step
from jit_ahead.triton import capture

from . import any_models

ENGINE = EngineLimits(max_num_tokens=32768, max_batch_size=256, max_seq_len=32768,
                      cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256))

# models the library providers plan (the model planner after them)
LIBRARY_MODELS = {"fla-gated-deltanet": lambda: demo_models.fla_gated_deltanet(layers=2),
                  "liger-qwen3": lambda: demo_models.liger_qwen3(layers=2),
                  "qwen3-moe-liger": lambda: any_models.qwen3_moe_liger(layers=2, hidden=256)}


def model_plan(model, limits):
    """The model planner alone (no library provider), its launches run as planners run them."""
    provider = ModelProvider()
    sites = provider.find_layers(model, Claims(), limits)
    launches = list(provider.launches(sites, limits))
    with capture() as planned:
        for launch in launches:
            launch.run()
    return {r.predicted_hash: r.name for r in planned.requests}, launches, provider, sites


def providers_plan(model, limits, run: bool = True):
    """Every built-in provider, the model planner last with what the others claim, as plan_model runs them:
    the predicted hashes planned (none unless ``run``) and the number of launches, plus the calls the
    providers made to find shape classes."""
    from jit_ahead.providers.builtin import builtin_providers

    claims, count, sampled = Claims(), 0, 0
    with capture() as found:
        for provider in sorted(builtin_providers(), key=lambda p: p.sees_claims):
            sites = provider.find_layers(model, claims, limits) if provider.sees_claims else provider.find_layers(model)
            claims |= provider.claims(model, sites)
            for launch in (provider.launches(sites, limits) if sites else []):
                if run:
                    launch.run()
                count += 1
            sampled += sum(provider.sampled.values()) if sites else 0
    return {r.predicted_hash for r in found.requests}, count, sampled


def every_shape(limits):
    return dataclasses.replace(limits, extra={**limits.extra, "shape_classes": False})


# -- the same plan as every shape ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen35-hybrid", "qwen3-liger"])
def test_shape_classes_plan_exactly_what_every_shape_plans(name):
    model = {"qwen35-hybrid": lambda: demo_models.qwen35_hybrid(hidden=256),
             "qwen3-liger": lambda: demo_models.liger_qwen3(layers=2)}[name]()
    limits = EngineLimits(max_num_tokens=320, max_batch_size=6, max_seq_len=300, cuda_graph_batch_sizes=(1, 2, 4))
    classes, few, provider, _ = model_plan(model, limits)
    shapes, all_launches, _, _ = model_plan(model, every_shape(limits))
    assert sorted(classes.values()) == sorted(shapes.values()) and set(classes) == set(shapes)
    # far fewer calls, the sampling included
    assert len(few) + sum(provider.sampled.values()) < len(all_launches) / 3


# -- random real calls at the limits engines use -------------------------------------------------------------
@torch.no_grad()
def _served(model, batch, prompt, decode, padded, rng):
    """What a transformers server calls: a prefill (left-padded with a mask when ``padded``) with the
    model's cache and ``decode`` steps on it; returns the requests of the steps that are within the
    limits (a long decode's filling prefill is how the cache got there, not a request)."""
    caller = MetaCaller(model, inference=True)
    ids = lambda b, t: torch.empty(b, t, dtype=torch.long, device="meta")  # noqa: E731
    keyword = "cache" if "cache" in caller.replica.forward.__code__.co_varnames else "past_key_values"
    mask = None
    if padded:
        mask = torch.ones(batch, prompt, dtype=torch.long)
        for row in range(1, batch):
            mask[row, : rng.randint(0, prompt - 1)] = 0
    with meta_reads_answered(), meta_stands_for_the_gpu():
        with capture() as filling:
            extra = {} if mask is None else {"attention_mask": mask}
            out = caller(input_ids=ids(batch, prompt), use_cache=True, **extra)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        with capture() as steps:
            for _ in range(decode):
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
                extra = {} if mask is None else {"attention_mask": mask}
                out = caller(input_ids=ids(batch, 1), use_cache=True, **{keyword: cache}, **extra)
                cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache
    return filling.requests, steps.requests


def _check_random_calls(model, limits, planned, count, padded):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    missed = []
    for i in range(count):
        batch = rng.randint(2 if padded and i % 3 == 0 else 1, limits.max_batch_size)
        longest = max(1, min(limits.max_seq_len - 4, limits.max_num_tokens // batch))
        long_decode = i % 4 == 3
        if long_decode:  # a cache grown by decoding beyond what one prefill of this batch holds
            prompt = rng.randint(longest, limits.max_seq_len - 2)
        else:
            prompt = rng.randint(max(1, longest // 2), longest) if i % 2 else rng.randint(1, longest)
        with_mask = padded and i % 3 == 0 and batch > 1 and prompt > 1 and not long_decode
        filling, steps = _served(model, batch, prompt, rng.randint(1, 2), with_mask, rng)
        requests = steps if long_decode else filling + steps
        new = sorted({r.name for r in requests if r.predicted_hash not in planned})
        if new:
            missed.append(((batch, prompt, "padded" if with_mask else "", "long decode" if long_decode else ""), new))
    assert missed == [], f"seed {seed}: {missed}"


@pytest.mark.parametrize("name", ["qwen35-hybrid", "qwen3-next-liger", "fla-kda"])
def test_random_calls_at_engine_limits_launch_only_planned_variants(name, caplog):
    caplog.set_level(logging.INFO, logger="jit_ahead.providers.model")
    model = {"qwen35-hybrid": lambda: demo_models.qwen35_hybrid(hidden=256),
             "qwen3-next-liger": any_models.qwen3_next_liger,
             "fla-kda": any_models.fla_kda}[name]()
    planned, launches, provider, sites = model_plan(model, ENGINE)
    assert "is planned at every shape" not in caplog.text  # every value was explained
    assert len(launches) < 1000
    _check_random_calls(model, ENGINE, planned, 10, padded=sites[0].padded)


@pytest.mark.parametrize("name", list(LIBRARY_MODELS))
def test_random_calls_at_engine_limits_launch_only_what_the_providers_planned(name, caplog):
    """The demo models fla and Liger plan (their providers, the model planner after them) and a Qwen3-MoE
    model with Liger: random real calls across EngineLimits(32768, 256, 32768), padded ones and long
    decodes among them."""
    caplog.set_level(logging.INFO, logger="jit_ahead.providers")
    model = LIBRARY_MODELS[name]()
    planned, count, _ = providers_plan(model, ENGINE)
    assert "is planned at every shape" not in caplog.text  # every value was explained
    assert count < 5000
    _check_random_calls(model, ENGINE, planned, 10, padded=True)


# -- cost ----------------------------------------------------------------------------------------------------
def test_planning_calls_do_not_grow_with_the_token_and_length_limits():
    model = demo_models.qwen35_hybrid(hidden=256)
    counts, sweeps = {}, {}
    for tokens in (8192, 32768):
        limits = EngineLimits(max_num_tokens=tokens, max_batch_size=64, max_seq_len=tokens,
                              cuda_graph_batch_sizes=(1, 2, 4, 8))
        provider = ModelProvider()
        sites = provider.find_layers(model, Claims(), limits)
        launches = list(provider.launches(sites, limits))
        counts[tokens] = len(launches) + sum(provider.sampled.values())
        sweeps[tokens] = sum(1 for _ in _sweep(sites[0], limits))
    assert sweeps[32768] > 3 * sweeps[8192]  # every shape: the calls grow with the limits
    assert counts[32768] <= 1.25 * counts[8192] + 20, counts  # shape classes: they do not


@pytest.mark.parametrize("name", list(LIBRARY_MODELS))
def test_the_library_providers_calls_do_not_grow_with_the_token_and_length_limits(name):
    """Launches listed plus calls sampled, counted (not timed) at 8192 and at 32768 tokens and lengths."""
    model = LIBRARY_MODELS[name]()
    counts, every = {}, {}
    for tokens in (8192, 32768):
        limits = EngineLimits(max_num_tokens=tokens, max_batch_size=64, max_seq_len=tokens,
                              cuda_graph_batch_sizes=(1, 2, 4, 8))
        _, listed, sampled = providers_plan(model, limits, run=False)
        counts[tokens] = listed + sampled
        every[tokens] = providers_plan(model, every_shape(limits), run=False)[1]
    assert every[32768] > 3 * every[8192], every  # every shape: the calls grow with the limits
    assert counts[32768] <= 1.25 * counts[8192] + 20, counts  # shape classes: they do not


# -- values no form explains: every shape, as before ---------------------------------------------------------
@triton.jit
def _scrambled_kernel(x_ptr, n, SCRAMBLED: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, 16), tl.zeros((16,), tl.float32) + SCRAMBLED + n)


class Scrambled(torch.nn.Module):
    """A model whose one kernel takes a constexpr no shape form explains: (tokens squared) mod 7."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 16)

    def forward(self, input_ids):
        x = self.embed(input_ids).float()
        tokens = input_ids.shape[1]
        _scrambled_kernel[(1,)](x, x.numel(), SCRAMBLED=(tokens * tokens) % 7)
        return x


def test_a_value_no_form_explains_plans_every_shape_with_one_line(caplog):
    caplog.set_level(logging.INFO, logger="jit_ahead.providers.model")
    with torch.device("meta"):
        model = Scrambled().eval()
    limits = EngineLimits(max_num_tokens=64, max_batch_size=2, max_seq_len=64)
    classes, launches, _, _ = model_plan(model, limits)
    shapes, _, _, _ = model_plan(model, every_shape(limits))
    lines = [r.getMessage() for r in caplog.records if "is planned at every shape" in r.getMessage()]
    assert len(lines) == 1 and "SCRAMBLED" in lines[0], lines
    assert set(classes) == set(shapes) and len(classes) == 4  # the squares mod 7: 0, 1, 2 and 4


# -- the cover reaches every class of a space ----------------------------------------------------------------
def _random_form(rng, polys):
    u = rng.choice(["n", "b", "bn"])
    kind = rng.randrange(5)
    if kind == 0:
        return Poly((rng.randint(-3, 40), rng.randint(-2, 5), rng.randint(0, 9), rng.randint(0, 3))), "int"
    if kind == 1:
        return Step(u if rng.random() < 0.7 or not polys else rng.choice(polys), rng.choice(["pow2", "cdiv", "div"]),
                    rng.choice([2, 16, 64]), rng.choice([None, 1, 16]), rng.choice([None, 64, 128, 1024])), "exact"
    if kind == 2:
        return Interval(u, rng.choice([None, 1, 16, 64]), rng.choice([None, 100, 300])), "exact"
    if kind == 3:
        return Select(u, rng.choice([1, 2, 64]), Poly((rng.randint(0, 2048), 0, 0, 0)),
                      Poly((0, rng.randint(0, 3), rng.randint(0, 64), 0))), "ptr"
    return Poly((rng.randint(-40, 40), rng.randint(-3, 3), rng.randint(-3, 3), rng.randint(-1, 1))), "int"


def test_cover_reaches_every_class_the_models_give_anywhere_in_the_space():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for trial in range(25):
        space = Space("prefill", rng.choice([1, 2]), rng.randint(3, 24), rng.randint(50, 700),
                      rng.choice([None, rng.randint(100, 3000)]))
        models = []
        for index in range(rng.randint(1, 5)):
            polys, slots = [], []
            for slot in range(rng.randint(1, 3)):
                form, classed = _random_form(rng, polys)
                if isinstance(form, Poly):
                    polys.append(form)
                slots.append(SlotModel(f"s{slot}", form, classed))
            presence = rng.choice([shape_classes.Const(1), _random_form(rng, [])[0]])
            if not isinstance(presence, Interval):
                presence = shape_classes.Const(1)
            models.append(SiteModel(("k", (), index), presence, tuple(slots)))
        b = np.array([x for x in range(space.batch_min, space.batch_max + 1) for _ in range(space.n_max(x))])
        n = np.array([m for x in range(space.batch_min, space.batch_max + 1) for m in range(1, space.n_max(x) + 1)])
        points = shape_classes.cover(space, models)
        pb = np.array([p[0] for p in points])
        pn = np.array([p[1] for p in points])
        for model in models:
            everywhere = model.classes(np.concatenate([b, pb]), np.concatenate([n, pn]))
            reached = set(everywhere[len(b):].tolist()) - {-1}
            assert set(everywhere[: len(b)].tolist()) - {-1} == reached, f"seed {seed}, trial {trial}: {model}"


# -- the search's calls in forked children -------------------------------------------------------------------
def _square_unless_told(item):
    """In a forked child: die (SIGKILL) or hang (SIGSTOP) on the items that say so; in this thread, answer."""
    import os
    import signal

    from jit_ahead.core.planning import planners

    kind, value = item
    if planners.in_planner() and kind != "ok":
        os.kill(os.getpid(), signal.SIGKILL if kind == "die" else signal.SIGSTOP)
    return value * value, os.getpid()


def test_forked_calls_answer_every_item_even_when_a_child_dies_or_hangs():
    import os

    from jit_ahead.core.planning import forked_calls

    items = [("ok", 1), ("ok", 2), ("die", 3), ("ok", 4), ("ok", 5), ("hang", 6)]
    results = forked_calls.call_all(_square_unless_told, items, workers=3, timeout=5.0)
    assert [r[0] for r in results] == [1, 4, 9, 16, 25, 36]
    # the shares of the dead and the silent child ran here; the healthy child's share did not
    here = {value for (_, value), (_, pid) in zip(items, results) if pid == os.getpid()}
    assert {3, 6} <= here and len(here) < len(items)


def test_the_search_run_in_forked_children_picks_what_it_picks_in_this_thread(monkeypatch):
    model = demo_models.qwen35_hybrid(hidden=256)
    limits = EngineLimits(max_num_tokens=2048, max_batch_size=8, max_seq_len=2048, cuda_graph_batch_sizes=(1, 2))
    planned = {}
    for workers in ("0", "3"):
        monkeypatch.setenv("JIT_AHEAD_PLANNERS", workers)
        found, launches, provider, _ = model_plan(model, limits)
        planned[workers] = set(found)
    assert planned["0"] == planned["3"]


def test_the_search_runs_in_a_process_of_its_own_not_in_the_server(monkeypatch, tmp_path):
    """Its sampling and model fitting would hold the server's GIL, and delay the serving thread, for as long
    as they run: the search runs in a child forked from the planning thread, whose own children sample."""
    import os

    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "2")
    where = tmp_path / "pids"
    classify_all = shape_classes.classify_all

    def recording(*args, **kwargs):  # a forked child writes its pid where this process reads it
        with open(where, "a") as f:
            f.write(f"{os.getpid()}\n")
        return classify_all(*args, **kwargs)

    monkeypatch.setattr(shape_classes, "classify_all", recording)
    found = shape_classes.search([shape_classes.Problem("step", (Space("prefill", 1, 8, 500, 2000),), _synthetic("step"))])
    assert isinstance(found[0], shape_classes.Classified)
    model = demo_models.qwen35_hybrid(hidden=256)
    limits = EngineLimits(max_num_tokens=2048, max_batch_size=8, max_seq_len=2048, cuda_graph_batch_sizes=(1, 2))
    planned, launches, _, _ = model_plan(model, limits)
    assert planned and launches
    pids = where.read_text().split()
    assert len(pids) == 2 and str(os.getpid()) not in pids  # both searches ran, neither in this process


def _dies_in_a_child():
    import os
    import signal

    from jit_ahead.core.planning import planners

    if planners.in_planner():
        os.kill(os.getpid(), signal.SIGKILL)
    return "answered here"


def test_a_search_process_that_dies_leaves_the_search_to_the_planning_thread_with_one_line(monkeypatch, caplog):
    from jit_ahead.providers import forked_planning

    monkeypatch.setenv("JIT_AHEAD_PLANNERS", "2")
    caplog.set_level(logging.WARNING, logger="jit_ahead.planning")
    assert forked_planning.call_in_child(_dies_in_a_child, stop=lambda: False, cancelled=lambda: None) == "answered here"
    lines = [r.getMessage() for r in caplog.records if "shape-class search's process gave no answer" in r.getMessage()]
    assert len(lines) == 1, lines


def test_a_search_process_is_killed_when_planning_is_cancelled():
    import os
    import threading
    import time

    import psutil

    from jit_ahead.core.planning import forked_calls

    cancelled = threading.Event()
    threading.Timer(0.5, cancelled.set).start()
    t0 = time.monotonic()
    with pytest.raises(forked_calls.NotAnswered, match="stopped"):
        forked_calls.call_in_child(lambda: time.sleep(60), stop=cancelled.is_set)
    assert time.monotonic() - t0 < 10
    assert psutil.Process(os.getpid()).children() == []  # killed and reaped


@pytest.mark.parametrize("name", list(LIBRARY_MODELS))
def test_the_library_providers_with_shape_classes_plan_what_they_plan_at_every_shape(name):
    """fla's GatedDeltaNet provider (prefills, padded batches in each mode, its other modules by token
    total) and Liger's (row-wise layers by token count, RoPE by batch and length, cos/sin shared or per
    row), with the model planner after them, as plan_model runs them."""
    model = LIBRARY_MODELS[name]()
    limits = EngineLimits(max_num_tokens=600, max_batch_size=12, max_seq_len=600, cuda_graph_batch_sizes=(1, 2, 4))
    classes, few, _ = providers_plan(model, limits)
    shapes, every, _ = providers_plan(model, every_shape(limits))
    assert classes == shapes and few < every / 2


# -- the search's parts --------------------------------------------------------------------------------------
def test_a_polynomial_is_fitted_where_the_points_fix_the_batch():
    """A space of one batch size (fla's padded modes, Liger's token counts): 1 and b, n and b n are the same
    column there, and the fit must still find the integer polynomial (it once split them into halves)."""
    points = [(1, n) for n in (1, 2, 3, 16, 17, 64, 65, 100, 8192, 16383, 16384)]
    for values in ([n for _, n in points], [256 * n + 3 for _, n in points]):
        poly = shape_classes._fit_poly(points, values)
        assert poly is not None
        b, n = shape_classes._arrays(points)
        assert poly.predict(b, n).tolist() == values


def test_row_ids_match_numpy_unique_by_rows_even_when_hashes_collide(monkeypatch):
    rng = np.random.default_rng(random.randrange(2**32))
    matrix = rng.integers(-1, 3, size=(3000, 7))
    matrix = np.concatenate([matrix, matrix[::3]])
    for mix in (shape_classes._ROW_MIX, np.zeros(4, dtype=np.uint64)):  # zeros: every row hashes the same
        monkeypatch.setattr(shape_classes, "_ROW_MIX", mix)
        ids, first = shape_classes.row_ids(matrix)
        assert np.array_equal(matrix[first[ids]], matrix)
        assert len(first) == len(np.unique(matrix, axis=0)) and sorted(set(ids.tolist())) == list(range(len(first)))


def test_traced_values_that_compare_equal_keep_their_types():
    """Traces share equal values between launches; True == 1 == 1.0 must still come back as a flag, an
    integer and a float."""
    from jit_ahead.triton import launch_trace

    flag, number, real = (launch_trace._shared_raw(v, False) for v in (True, 1, 1.0))
    assert (type(flag.value), type(number.value), type(real.value)) == (bool, int, float)
    assert launch_trace._shared_raw(True, False) is flag
    values = [launch_trace._shared_values({"x": raw}) for raw in (flag, real)]
    assert type(values[0][0][1].value) is bool and type(values[1][0][1].value) is float


def test_a_launch_site_does_not_depend_on_a_probe_in_another_thread():
    """Sites are named by their Python stack; while another thread's probe has torch.autograd.Function.apply
    patched (Liger's probe does, in a demo planning three models at once), fla's calls pass through the
    dispatcher. Its frames must not make other sites: the demo's fla padded mode was once planned at every
    total because some of its sampled calls ran during the Liger model's probe."""
    import threading

    from jit_ahead.providers import fla
    from jit_ahead.core.thread_patch import patched_in_this_thread
    from jit_ahead.triton.launch_trace import traced

    model = demo_models.fla_gated_deltanet(layers=1)
    site = next(s for s in fla.FlaGatedDeltaNetProvider().find_layers(model) if isinstance(s, fla.GatedDeltaNetSite))

    def sites() -> list:  # one place for both calls: a site includes the lines that led to the launch
        return [launch.site for launch in traced(lambda: fla._prefill(site, 2, 70))]

    alone = sites()
    holding, done = threading.Event(), threading.Event()

    def probe_elsewhere():
        with patched_in_this_thread(torch.autograd.Function, "apply", lambda original, *a, **k: original(*a, **k)):
            holding.set()
            done.wait(60)

    other = threading.Thread(target=probe_elsewhere)
    other.start()
    try:
        assert holding.wait(60)
        beside = sites()
    finally:
        done.set()
        other.join()
    assert beside == alone


def _synthetic(kind):
    """A sample function of one launch site whose value follows the point: a power-of-two step of n (a
    constexpr), or no form at all (a value hashed from the point)."""
    from jit_ahead.triton.launch_trace import Raw, TracedLaunch

    def sample(point):
        b, n = point
        value = 1 << (n - 1).bit_length() if kind == "step" else (b * 7919 + n * 104729) % 1009
        return {"prefill": [TracedLaunch(("k", (), 0), (("BLOCK", Raw("int", value, exact=True)),))]}
    return sample


def test_problems_searched_together_share_rounds_and_fail_alone():
    space = Space("prefill", 1, 8, 500, 2000)
    problems = [shape_classes.Problem("step", (space,), _synthetic("step")),
                shape_classes.Problem("noise", (space,), _synthetic("noise")),
                shape_classes.Problem("step again", (space,), _synthetic("step"))]
    seed = random.randrange(2**32)

    def rounds(chosen, first_seed):
        batches = []

        def sample_all(items):
            batches.append(len(items))
            return [chosen[i].sample(p) for i, p in items]
        return shape_classes.classify_all(chosen, seed=first_seed, sample_all=sample_all), len(batches)

    found, together = rounds(problems, seed)
    assert isinstance(found[1], shape_classes.Unexplained), seed
    for classified in (found[0], found[2]):
        assert isinstance(classified, shape_classes.Classified), (seed, classified)
        reached = {1 << (n - 1).bit_length() for _, n in classified.points["prefill"]}
        assert reached == {1 << k for k in range(10)}, seed  # 1..512: every power of two n can round to
    # each problem searched alone with the seed it had (seed + its index): together, one batch of calls
    # per round for all of them, as many rounds as the longest alone
    alone = [rounds([problem], seed + index)[1] for index, problem in enumerate(problems)]
    assert together == max(alone), (seed, together, alone)


def test_a_sweep_meets_every_batch_size_at_a_spread_of_lengths_before_every_length_of_one():
    # issue 44: a sweep stopped at ready had planned batch 1-2 only (batch-major), so every request at a
    # larger batch compiled a variant of a kernel whose constexpr is the batch size.
    from jit_ahead.providers.model import coarse_first, prefill_shapes

    limits = EngineLimits(max_num_tokens=512, max_batch_size=16, max_seq_len=512, cuda_graph_batch_sizes=(1,))
    shapes = list(prefill_shapes(limits))
    ordered = coarse_first(shapes)
    assert sorted(ordered) == sorted(shapes)
    tenth = len(shapes) // 10
    assert {batch for batch, _ in shapes[:tenth]} == {1}  # the order before: batch 1 at every length
    early = ordered[:tenth]
    assert {batch for batch, _ in early} == set(range(1, 17))
    assert all(len({n for b, n in early if b == batch}) >= 4 for batch in range(1, 17))
