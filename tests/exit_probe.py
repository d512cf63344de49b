"""A server-like process for the exit tests: ``python -m tests.exit_probe MODE``.

It starts jit_ahead as an engine would, plans the GatedDeltaNet demo model at limits large enough that
planning (in forked planners) and builds (fla kernels in helpers) are still running, prints ``WORK_DONE``
once both are under way (and ``JIT_AHEAD_CLOSED`` once jit_ahead's exit handler has run), then ends by MODE: ``return`` from main, ``exit3`` (``sys.exit(3)``), or
``wait`` (sleep until the test sends a signal). ``plain`` is the same process without jit_ahead: it
builds the model, prints ``WORK_DONE`` and returns (how long the interpreter itself takes to end);
``plain-wait`` waits for a signal instead (the status the process ends with by it, without jit_ahead).
"""
from __future__ import annotations

import atexit
import sys
import threading
import time


def main(mode: str) -> int:
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()
    import jit_ahead
    from jit_ahead import demo_models
    from jit_ahead.core.planning.limits import EngineLimits

    if mode in ("plain", "plain-wait"):
        demo_models.fla_gated_deltanet()
        print("WORK_DONE", flush=True)
        while mode == "plain-wait":  # until the test's signal: how the process ends by it without jit_ahead
            time.sleep(1)
        return 0

    # registered before jit_ahead's own exit handler, so it runs after it: the test times jit_ahead's part
    atexit.register(lambda: print("JIT_AHEAD_CLOSED", flush=True))
    session = jit_ahead.start(triton={"workers": 2})
    building = threading.Event()
    session.stats.subscribe(lambda e: building.set() if e["event"] == "build_start" else None)
    run = session.plan_model(demo_models.fla_gated_deltanet(), EngineLimits(4096, 8, 4096,
                                                                            cuda_graph_batch_sizes=(1, 2)))
    if not building.wait(300):
        print("no build started", flush=True)
        return 5
    if run.done:  # planning ended before the first build began (a loaded machine): another model's planning
        # is under way when the process ends, as the tests need
        run = session.plan_model(demo_models.qwen35_hybrid(), EngineLimits(4096, 8, 4096, cuda_graph_batch_sizes=(1, 2)))
    print(f"WORK_DONE planning_done={run.done}", flush=True)
    if mode == "exit3":
        sys.exit(3)
    if mode == "wait":
        while True:
            time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
