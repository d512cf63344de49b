"""Helpers must see the server's GPU: flash-linear-attention picks kernel source branches from the device
it detects at import, so a helper that saw "no GPU" would build other variants than the server loads."""
import pytest
import torch

from . import workloads as examples
from jit_ahead.core import device_view
from jit_ahead.core.building.pool import HelperPool
from jit_ahead.core.priority import Priority
from jit_ahead.core.observing.stats import Stats
from jit_ahead.triton import capture
from jit_ahead.triton.family import SPEC

from .conftest import wait_all


def test_a_process_without_gpu_sees_the_default_h200():
    view = device_view.installed()
    assert view is not None and view.name == "NVIDIA H200"
    assert torch.cuda.get_device_capability() == (9, 0)
    assert torch.cuda.get_device_properties(0).shared_memory_per_block_optin == 232448
    assert not torch.cuda.is_available()  # only the queries are answered; nothing pretends to run


@pytest.mark.parametrize("shown", [True, False], ids=["helpers-see-the-server-gpu", "helpers-see-no-gpu"])
def test_fla_builds_match_only_when_helpers_see_the_server_gpu(triton_cache, shown):
    pytest.importorskip("fla")
    import fla.utils.hardware

    assert fla.utils.hardware.IS_NVIDIA_HOPPER  # the planner saw the H200
    (workload,) = examples.by_name(["fla.gated_delta_recurrent"])
    with capture() as planned:
        workload.run(*workload.make_inputs("meta", 0))
    stats, events = Stats(), []
    stats.subscribe(events.append)
    # a fork server of its own interpreter, which imports fla itself (a fork of this process has it
    # imported with this process's view of the GPU already)
    pool = HelperPool(SPEC, workers=1, stats=stats, env_overrides={"TRITON_CACHE_DIR": str(triton_cache)},
                      device_view=device_view.current() if shown else None, start_mode="fork")
    pool.start()
    try:
        results = wait_all([pool.submit(r.build_request(), Priority.URGENT) for r in planned.requests])
    finally:
        pool.close()
    views = {e["info"]["device_view"] for e in events if e["event"] in ("helper_ready", "forkserver_ready")}
    if shown:
        assert views == {"NVIDIA H200"}
        assert all(r.ok for r in results)
    else:
        # What jit_ahead prevents: the helper imports fla without a GPU, gets other kernel source, and
        # the hash check refuses the build instead of publishing a variant the server would miss.
        assert views == {None}
        assert not any(r.ok for r in results) and all("HashMismatch" in r.error for r in results)
