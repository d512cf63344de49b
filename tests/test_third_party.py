"""Hash parity on third-party kernels: Liger-Kernel and flash-linear-attention, through their real
launchers on meta tensors, built in helpers, then hit on disk by a fresh process."""
import pytest

from . import workloads as examples
from jit_ahead.triton import capture

from .conftest import run_consumer, wait_all
from .scenarios import workload_launches


def _roundtrip(names, triton_cache, session_factory):
    with capture() as planned:
        workload_launches(names)
    assert len(planned) > 0
    session = session_factory(workers=2)
    results = wait_all(session.families["triton"].submit(planned))
    # A helper fails a request whose built hash differs from the prediction, so ok means parity.
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    events = run_consumer(",".join(names), triton_cache)
    assert {e["hash"] for e in events} == {r.predicted_hash for r in planned.requests}
    assert all(e["cache_hit"] for e in events), [e for e in events if not e["cache_hit"]]
    return planned


def test_liger_kernel(triton_cache, session_factory):
    pytest.importorskip("liger_kernel")
    names = [w.name for w in examples.LIGER]
    planned = _roundtrip(names, triton_cache, session_factory)
    kernels = {r.qualname for r in planned.requests}
    assert {"_rms_norm_forward_kernel", "_block_rms_norm_forward_kernel", "_triton_rope",
            "_swiglu_forward_kernel", "_geglu_tanh_forward_kernel", "_layer_norm_forward_kernel"} <= kernels


def test_flash_linear_attention(triton_cache, session_factory):
    pytest.importorskip("fla")
    names = [w.name for w in examples.FLA]
    planned = _roundtrip(names, triton_cache, session_factory)
    # fla's autotuned kernels: every pruned config is a request.
    assert sum(r.qualname == "l2norm_fwd_kernel" for r in planned.requests) > 5
    assert "chunk_gated_delta_rule_fwd_kernel_h_blockdim64" in {r.qualname for r in planned.requests}
