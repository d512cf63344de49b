"""Launch sets shared by the tests and by the fresh consumer process (tests/consumer.py)."""
from __future__ import annotations

import torch

from . import workloads as examples
from jit_ahead.triton.standin import ensure_driver

# The stand-in driver (an H200's view) first, then the libraries that read the device at import; the
# planning process, the helpers and the consumer all see the same GPU.
ensure_driver()
examples.import_libraries()

from .kernels import basic as k


def basic_launches() -> None:
    x = torch.empty(4096, device="meta", dtype=torch.float16)
    xf = torch.empty(4096, device="meta", dtype=torch.float32)
    k.add_kernel[(4,)](x, x, x, 4096, BLOCK=1024)
    k.add_kernel[(4,)](x[1:], x, x, 4095, BLOCK=1024)  # misaligned view: a different variant
    k.add_kernel[(1,)](xf, xf, xf, 1, BLOCK=256)  # n == 1 specializes to a constexpr
    k.scale_kernel[(4,)](x, x, 4096, 2.0, BLOCK=1024)  # heuristics: EVEN
    k.scale_kernel[(4,)](x, x, 4000, 2.0, BLOCK=1024)  # heuristics: not EVEN
    k.tuned_copy_kernel[(4,)](x, x, 4096)  # autotune: every config
    k.apply_kernel[(4,)](x, x, 4096, ACT=k.relu, BLOCK=1024)  # a @triton.jit function as a constexpr


def workload_launches(names) -> None:
    for workload in examples.by_name(names):
        workload.run(*workload.make_inputs("meta", 0))


def run_scenario(name: str) -> None:
    if name == "basic":
        basic_launches()
    else:
        workload_launches(name.split(","))
