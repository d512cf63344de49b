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


def attention_model(vllm_config, layers: dict[str, dict], triton: bool = True):
    """vLLM's ``Attention`` layers (name -> keyword arguments beside the heads), on the Triton attention
    backend as ``--attention-backend TRITON_ATTN`` gives them on a GPU (``triton=False``: the platform's)."""
    import torch
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    backend = {"attn_backend": TritonAttentionBackend} if triton else {}
    with torch.device("meta"):
        return torch.nn.ModuleDict({name: Attention(cache_config=vllm_config.cache_config, prefix=name, **backend,
                                                    **kwargs) for name, kwargs in layers.items()})


class AttentionRunner:
    """What vLLM's GPU model runner sets up around attention layers, on meta tensors: a block table per
    layer (``MultiGroupBlockTable``), vLLM's metadata builder for its KV-cache spec, its KV cache bound to
    the layer; ``step`` runs one batch through every layer's own ``forward`` in vLLM's forward context."""

    def __init__(self, vllm_config, model, blocks: int = 1000) -> None:
        import torch
        from vllm.v1.worker.block_table import MultiGroupBlockTable

        scheduler, meta = vllm_config.scheduler_config, torch.device("meta")
        self.vllm_config, self.model, self.parts = vllm_config, model, {}
        for name, layer in model.items():
            spec = layer.get_kv_cache_spec(vllm_config)
            table = MultiGroupBlockTable(max_num_reqs=scheduler.max_num_seqs, max_model_len=vllm_config.model_config.max_model_len,
                                         max_num_batched_tokens=scheduler.max_num_batched_tokens, pin_memory=False,
                                         device=meta, block_sizes=[spec.block_size], kernel_block_sizes=[spec.block_size])
            builder = layer.attn_backend.get_builder_cls()(spec, [name], vllm_config, meta)
            layer.kv_cache = torch.empty(layer.attn_backend.get_kv_cache_shape(
                blocks, spec.block_size, spec.num_kv_heads, spec.head_size), dtype=spec.dtype, device=meta)
            # the custom op's own function, which its CUDA kernel is: on meta tensors the op runs its fake
            layer.use_direct_call = True
            self.parts[name] = (table, builder)

    def step(self, query_lens: list[int], seq_lens: list[int]) -> None:
        import torch
        from vllm.forward_context import set_forward_context
        from vllm.v1.attention.backend import CommonAttentionMetadata

        meta, sequences, tokens = torch.device("meta"), len(query_lens), sum(query_lens)
        first = next(iter(self.model.values()))
        heads, kv_heads, head = first.num_heads, first.num_kv_heads, first.head_size
        qkv = torch.empty(tokens, (heads + 2 * kv_heads) * head, dtype=torch.bfloat16, device=meta)
        query, key, value = qkv.split([heads * head, kv_heads * head, kv_heads * head], dim=-1)  # as models do
        starts = torch.zeros(sequences + 1, dtype=torch.int32)
        starts[1:] = torch.tensor(query_lens, dtype=torch.int32).cumsum(0)
        metadata, slots = {}, {}
        for name, (table, builder) in self.parts.items():
            starts_gpu = torch.empty(sequences + 1, dtype=torch.int32, device=meta)
            table.compute_slot_mapping(sequences, starts_gpu, torch.empty(tokens, dtype=torch.int64, device=meta))
            common = CommonAttentionMetadata(
                query_start_loc=starts_gpu, query_start_loc_cpu=starts,
                seq_lens=torch.empty(sequences, dtype=torch.int32, device=meta), num_reqs=sequences,
                num_actual_tokens=tokens, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
                block_table_tensor=table[0].get_device_tensor(sequences), slot_mapping=table[0].slot_mapping.gpu[:tokens])
            metadata[name], slots[name] = builder.build(0, common), common.slot_mapping
        with set_forward_context(metadata, self.vllm_config, num_tokens=tokens, slot_mapping=slots):
            for layer in self.model.values():
                layer(query, key, value)


def _viewed_cuda():
    """A vLLM CUDA platform that answers as the device view's GPU does (the session installs the view: an
    H200 on a CPU-only machine)."""
    import torch
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class ViewedCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"

        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(*torch.cuda.get_device_capability(device_id))

        @classmethod
        def is_arch_support_pdl(cls):  # CudaPlatform's own test
            return torch.cuda.get_device_capability(0)[0] >= 9

    return ViewedCuda()


def viewed_cuda_platform() -> None:
    """vLLM's platform from here on answers as the device view's GPU does, for what vLLM decides from it: its
    FlashInfer backend's decode kernel and dtypes. Import vLLM's layer modules first: under it they would
    import CUDA extensions."""
    import vllm.platforms

    vllm.platforms._current_platform = _viewed_cuda()


def tilelang_kernels_for_gpu():
    """vLLM's TileLang kernel module as a CUDA worker imports it. It picks TileLang, its pass configs and
    PDL from the platform at import, and vLLM's CPU platform gives it none of them: it is imported under a
    platform that answers as the device view's GPU does, then the CPU platform is put back for everything
    else."""
    import vllm.platforms

    cpu = vllm.platforms._current_platform
    vllm.platforms._current_platform = _viewed_cuda()
    try:
        import vllm.model_executor.kernels.mhc.tilelang_kernels as kernels
    finally:
        vllm.platforms._current_platform = cpu
    return kernels


def deepseek_v4_model(vllm_config):
    """vLLM's NVIDIA ``DeepseekV4Model`` on meta tensors, built as its loader builds it (the model's default
    dtype, the configuration current). Its attention and MoE (sparse-MLA and DeepGEMM/FlashInfer paths: no
    CPU build) become modules that return their input, the shape theirs return; its three auxiliary CUDA
    streams are None. Everything of mHC, the layers' parameters, norms and the forward, is vLLM's."""
    import torch
    import vllm.models.deepseek_v4.nvidia.model as dsv4
    from vllm.utils.torch_utils import set_default_torch_dtype

    class Attention(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

        def forward(self, positions, x, _):
            return x

    class MoE(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

        def forward(self, x, input_ids):
            return x

    dsv4._select_dsv4_attn_cls = lambda config: Attention
    dsv4.DeepseekV4MoE = MoE
    torch.cuda.Stream = lambda *args, **kwargs: None
    with set_default_torch_dtype(vllm_config.model_config.dtype), torch.device("meta"):
        return dsv4.DeepseekV4Model(vllm_config=vllm_config, prefix="model")
