#!/usr/bin/env python3
"""Does NVML answer in a process forked from one that holds a CUDA context (a jit_ahead planner forked from
a vLLM worker)? On an H200 the fused-MoE launches of vLLM's planners failed with NVML_ERROR_OPERATING_SYSTEM
(results/2026-12-07-h200-vllm-moe-16384-mixed-sampling/). For each parent state (nothing started, a CUDA
context, a CUDA context and NVML left initialised as torch leaves it) this asks NVML for device 0's name
in the parent, in a forked child, and in a forked child whose inherited descriptors were pointed at
/dev/null as a planner's are (``jit_ahead.core.processes.detach_descriptors``). Prints NVML's return
codes (0: success; 999: unknown; 17: NVML_ERROR_OPERATING_SYSTEM).

    python scripts/gpu/nvml_fork_probe.py
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys


def ask(nvml) -> dict:
    handle = ctypes.c_void_p()
    name = ctypes.create_string_buffer(96)
    init = nvml.nvmlInit_v2()
    got = nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
    named = nvml.nvmlDeviceGetName(handle, name, 96) if got == 0 else None
    return {"init": init, "handle": got, "name": named, "device": name.value.decode(errors="replace"),
            "shutdown": nvml.nvmlShutdown()}


def in_child(nvml, detach: bool) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        if detach:
            from jit_ahead.core.processes import detach_descriptors

            detach_descriptors(keep=(write,))
        os.write(write, json.dumps(ask(nvml)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"error": "the child wrote nothing"}


def state(name: str) -> None:
    import torch

    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if name == "nvml-left-open":
        torch.cuda._raw_device_count_nvml()  # nvmlInit with no shutdown, as torch's device count leaves it
    if name != "nothing":
        torch.ones(1, device="cuda")
    print(json.dumps({"state": name, "parent": ask(nvml), "child": in_child(nvml, False),
                      "child, descriptors detached": in_child(nvml, True)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        state(sys.argv[1])
    else:
        for name in ("nothing", "cuda", "nvml-left-open"):
            subprocess.run([sys.executable, __file__, name], check=False)
