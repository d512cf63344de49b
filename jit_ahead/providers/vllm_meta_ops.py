"""Meta kernels for the CUDA ops of vLLM that sit between the Triton launches a provider plans.

vLLM's custom ops (``torch.ops._C`` / ``torch.ops._moe_C``) have CUDA kernels and no Meta kernel, so a
call on meta tensors stops there, before the Triton launches that follow it. Each op listed here writes
only into tensors its caller allocated (its schema returns nothing), so a Meta kernel that does nothing
leaves the caller exactly as far as the real one would, as far as shapes go. Where the op is not loaded at
all (a CPU-only process: vLLM's CUDA extension needs the driver), it is defined here with the schema vLLM's
extension declares; never on a CUDA platform, where vLLM's extension defines them itself.

Registering is process-wide and touches only the Meta dispatch key: real tensors still reach vLLM's
kernels. The libraries are kept for the life of the process (dropping one would unregister its kernels).
"""
from __future__ import annotations

import torch

from ..core.processes import fork_safe_lock

# namespace -> (name, schema) for each op on a planned path
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
        ("swigluoai_and_mul", "swigluoai_and_mul(Tensor(a!) out, Tensor input) -> ()"),
        ("silu_and_mul_with_clamp", "silu_and_mul_with_clamp(Tensor(a!) out, Tensor input, float limit, "
                                    "float alpha, float beta) -> ()"),
    ),
}

_libraries: list = []
_installed = False
_lock = fork_safe_lock()


def _nothing(*args, **kwargs) -> None:
    return None


def install() -> None:
    """Once per process: a do-nothing Meta kernel for each op in ``OPS`` that has none."""
    global _installed
    from vllm.platforms import current_platform

    with _lock:
        if _installed:
            return
        may_define = not current_platform.is_cuda_alike()
        for namespace, ops in OPS.items():
            library = torch.library.Library(namespace, "FRAGMENT")
            _libraries.append(library)
            for name, schema in ops:
                if hasattr(getattr(torch.ops, namespace), name):
                    if torch._C._dispatch_has_kernel_for_dispatch_key(f"{namespace}::{name}", "Meta"):
                        continue
                elif may_define:
                    library.define(schema)
                else:  # not loaded on a GPU: the planned call stops there, as it would without this module
                    continue
                library.impl(name, _nothing, "Meta")
        _installed = True
