"""quack-kernels through the CuTe DSL family: planning by capture of quack's own compile calls, helpers
filling quack's own object cache, and quack in another process loading what they left without compiling."""
import json
import pickle

import torch

from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.session import Session
from jit_ahead.providers.quack import QuackRMSNormProvider

from .test_cute import run_python


class Qwen3RMSNorm(torch.nn.Module):  # the shape of a transformers RMSNorm layer
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.variance_epsilon = 1e-6


LIMITS = EngineLimits(max_num_tokens=512, max_batch_size=8, cuda_graph_batch_sizes=(1, 2, 4, 8))

SERVER = """
    import json, pickle, sys
    import quack.rmsnorm  # noqa: F401
    compile_fwd = sys.modules["quack.rmsnorm"]._compile_rmsnorm_fwd
    out = {}
    for name, (args, kwargs) in pickle.loads(bytes.fromhex(sys.argv[1])).items():
        compile_fwd(*args, **kwargs)
        out[name] = compile_fwd.cache_info()._asdict()
        compile_fwd.cache_clear()
    print("RESULT", json.dumps(out))
"""


def use_cache(monkeypatch, folder) -> None:
    """quack reads QUACK_CACHE_DIR once, at import; this process may have imported it already."""
    import quack.cache

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(folder))


def test_helpers_fill_quacks_own_cache_and_quack_loads_it_without_compiling(tmp_path, monkeypatch):
    use_cache(monkeypatch, tmp_path)
    model = torch.nn.Sequential(Qwen3RMSNorm(256), Qwen3RMSNorm(256), Qwen3RMSNorm(64)).to("meta")
    events = []
    session = Session(families=("cute",), cute={"workers": 2})
    session.stats.subscribe(events.append)
    try:
        session.start()
        run = session.plan_model(model, LIMITS, providers=[QuackRMSNormProvider()])
        assert session.wait_ready(600) and run.wait(600)
        assert not run.errors, run.errors
        tickets = run.tickets
        assert [t.wait(600).name for t in tickets] == ["DONE"] * len(tickets)
    finally:
        session.close()
    requests = [t.request.payload for t in tickets]
    # Two hidden sizes, one dtype: two variants, whatever the row count (quack's row extent is symbolic),
    # found by running quack's host code for each of the 512 row counts.
    assert sorted(r.args[6] for r in requests) == [64, 256]
    assert all(r.path.exists() and r.path.parent.parent == tmp_path for r in requests)
    builds = [e for e in events if e["event"] == "build_finish"]
    assert len(builds) == 2 and all(e["helper"].startswith("helper-") and e["ok"] for e in builds)

    # Another process (the server's role) makes quack's own calls: loaded from the cache, none compiled;
    # an unplanned hidden size compiles, so the count can tell the difference.
    calls = {str(r.args[6]): (r.args, dict(r.kwargs)) for r in requests}
    args = requests[0].args
    calls["128"] = (args[:6] + (128,) + args[7:], dict(requests[0].kwargs))
    done = run_python(SERVER.replace("sys.argv[1]", repr(pickle.dumps(calls).hex())),
                      QUACK_CACHE_DIR=str(tmp_path), CUTE_DSL_ARCH="sm_90a")
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert (info["64"]["hits"], info["64"]["misses"]) == (1, 0)
    assert (info["256"]["hits"], info["256"]["misses"]) == (1, 0)
    assert (info["128"]["hits"], info["128"]["misses"]) == (0, 1)


def test_outside_a_capture_the_gated_compile_function_is_quacks_own(tmp_path, monkeypatch):
    import sys

    import cutlass

    from jit_ahead.cute.plan import capture

    use_cache(monkeypatch, tmp_path)
    provider = QuackRMSNormProvider()
    launches = list(provider.launches(provider.find_layers(torch.nn.Sequential(Qwen3RMSNorm(64)).to("meta")), LIMITS))
    rmsnorm = sys.modules["quack.rmsnorm"]
    gated = rmsnorm._compile_rmsnorm_fwd
    assert gated.jit_ahead_original is not gated and gated.cache_info is gated.jit_ahead_original.cache_info
    with capture("sm_90a") as plan:
        launches[0].run()
    assert (len(plan), gated.cache_info().misses) == (1, 0)  # captured: quack compiled nothing
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    args = plan.requests[0].args
    kernel = gated(*args)  # no capture: quack compiles (no GPU needed) and exports into its cache
    assert gated.cache_info().misses == 1 and type(kernel).__module__.startswith(("tvm_ffi", "cutlass"))
    assert plan.requests[0].path.exists() and args[0] is cutlass.BFloat16


def test_closing_the_cute_family_puts_quacks_own_compile_functions_back(tmp_path, monkeypatch):
    import sys

    use_cache(monkeypatch, tmp_path)
    provider = QuackRMSNormProvider()
    layers = provider.find_layers(torch.nn.Sequential(Qwen3RMSNorm(64)).to("meta"))
    next(iter(provider.launches(layers, LIMITS)))  # planning gates quack's compile functions
    rmsnorm = sys.modules["quack.rmsnorm"]
    own = rmsnorm._compile_rmsnorm_fwd.jit_ahead_original
    session = Session(families=("cute",), cute={"workers": 0}).start()
    session.close()
    assert rmsnorm._compile_rmsnorm_fwd is own and not hasattr(own, "jit_ahead_original")


def test_each_recorder_is_given_every_distinct_library_call_once():
    from jit_ahead.cute import library_cache

    call = ("quack.rmsnorm", "_compile_rmsnorm_fwd", (1, 2), {"x": 3})
    library_cache._note_call(*call)  # no recorder yet: nothing to give, and not marked seen
    first, second = [], []
    try:
        library_cache.set_recorder(lambda *seen: first.append(seen))
        library_cache._note_call(*call)
        library_cache._note_call(*call)
        library_cache.set_recorder(lambda *seen: second.append(seen))  # the next session's record folder
        library_cache._note_call(*call)
    finally:
        library_cache.set_recorder(None)
    assert first == second == [("quack.rmsnorm", "_compile_rmsnorm_fwd", (1, 2), (("x", 3),))]
