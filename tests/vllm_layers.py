"""vLLM's own MoE layers on meta tensors in a CPU process, for the vLLM tests and benchmarks.

``moe_model(shapes)`` builds one ``FusedMoE`` per entry (name -> (experts, top_k, hidden, intermediate)), the
layer class vLLM's MoE models (Qwen3-MoE, Mixtral, DeepSeek) build, inside a vLLM configuration and a
one-process distributed group, as a worker builds them. vLLM's CPU platform gives the layers its CPU MoE
backend; ``on_triton_experts`` gives them what vLLM's backend selection gives an sm_90 GPU, where it puts
FlashInfer's MoE last, the Triton experts, as an H100 or H200 server's layers have it.

Call ``cpu_vllm()`` first (before anything imports vLLM's kernels): a Triton driver that answers, and vLLM's
CPU platform (its CUDA platform loads vLLM's CUDA extension, which needs the driver library).
"""
from __future__ import annotations

import socket

_context = []  # the vLLM configuration context, kept open: leaving it unsets the configuration


def cpu_vllm() -> None:
    import triton  # noqa: F401 - first, as a server imports it

    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()


def moe_model(shapes: dict[str, tuple[int, int, int, int]]):
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    if not _context:
        context = set_current_vllm_config(VllmConfig())
        context.__enter__()
        _context.append(context)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
    from vllm.model_executor.layers.fused_moe import FusedMoE

    with torch.device("meta"):
        return torch.nn.ModuleDict({name: FusedMoE(num_experts=e, top_k=k, hidden_size=h, intermediate_size=i,
                                                   params_dtype=torch.bfloat16, prefix=name)
                                    for name, (e, k, h, i) in shapes.items()})


def experts_of(model) -> list:
    """The model's ``RoutedExperts`` modules (they hold the weights and the quantization method)."""
    return [m for m in model.modules() if hasattr(m, "w13_weight") and hasattr(m, "quant_method")]


def on_triton_experts(model) -> list:
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    experts = experts_of(model)
    for layer in experts:
        layer.quant_method.unquantized_backend = UnquantizedMoeBackend.TRITON
        layer.quant_method.experts_cls = TritonExperts
    return experts
