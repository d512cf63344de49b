"""Meta kernels for the CUDA ops of vLLM that sit between the Triton launches a provider plans.

vLLM's custom ops (``torch.ops._C`` / ``torch.ops._moe_C``) have CUDA kernels and no Meta kernel, so a
call on meta tensors stops there, before the Triton launches that follow it. Each op listed here writes
only into tensors its caller allocated (its schema returns nothing), so a Meta kernel that does nothing
leaves the caller exactly as far as the real one would, as far as shapes go. Where the op is not loaded at
all (a CPU-only process: vLLM's CUDA extension needs the driver), it is defined here with vLLM's schema.

Registering is process-wide and touches only the Meta dispatch key: real tensors still reach vLLM's
kernels. The libraries are kept for the life of the process (dropping one would unregister its kernels).
"""
from __future__ import annotations

import threading

import torch

# namespace -> (name, schema as vLLM declares it) for each op on a planned path
OPS = {
    "_moe_C": (
        ("moe_align_block_size", "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
                                 "Tensor(a!) sorted_token_ids, Tensor(b!) experts_ids, "
                                 "Tensor(c!) num_tokens_post_pad, Tensor? maybe_expert_map) -> ()"),
        ("moe_sum", "moe_sum(Tensor input, Tensor(a!) output) -> ()"),
    ),
    "_C": (
        ("silu_and_mul", "silu_and_mul(Tensor(a!) result, Tensor input) -> ()"),
        ("gelu_and_mul", "gelu_and_mul(Tensor(a!) out, Tensor input) -> ()"),
        ("gelu_tanh_and_mul", "gelu_tanh_and_mul(Tensor(a!) out, Tensor input) -> ()"),
    ),
}

_libraries: list = []
_lock = threading.Lock()


def _nothing(*args, **kwargs) -> None:
    return None


def install() -> None:
    """Once per process: a do-nothing Meta kernel for each op in ``OPS`` that has none."""
    with _lock:
        if _libraries:
            return
        for namespace, ops in OPS.items():
            library = torch.library.Library(namespace, "FRAGMENT")
            for name, schema in ops:
                if hasattr(getattr(torch.ops, namespace), name):
                    if torch._C._dispatch_has_kernel_for_dispatch_key(f"{namespace}::{name}", "Meta"):
                        continue
                else:
                    library.define(schema)
                library.impl(name, _nothing, "Meta")
            _libraries.append(library)
