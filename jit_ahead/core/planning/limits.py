"""The limits a server was started with: what bounds the shapes its kernels can see."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineLimits:
    """Engine limits, as vLLM, SGLang or TensorRT-LLM configure them.

    ``max_num_tokens``: tokens in one forward pass (the prefill/chunked-prefill budget).
    ``max_batch_size``: sequences decoded together. ``max_seq_len``: the longest sequence.
    ``cuda_graph_batch_sizes``: the batch sizes the engine captures graphs for (warmup needs them first).
    ``extra``: provider-specific limits, by name.
    """

    max_num_tokens: int = 8192
    max_batch_size: int = 256
    max_seq_len: int = 8192
    dtypes: tuple[str, ...] = ("bfloat16",)
    cuda_graph_batch_sizes: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_num_tokens", "max_batch_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineLimits.{name} must be a positive integer, got {value!r}")
        if not self.dtypes:
            raise ValueError("EngineLimits.dtypes must name at least one dtype")
        bad = [b for b in self.cuda_graph_batch_sizes if not isinstance(b, int) or not 1 <= b <= self.max_batch_size]
        if bad:
            raise ValueError(f"EngineLimits.cuda_graph_batch_sizes {bad} are outside 1..max_batch_size "
                             f"({self.max_batch_size})")

    def torch_dtypes(self):
        import torch

        try:
            return tuple(getattr(torch, name) for name in self.dtypes)
        except AttributeError as exc:
            raise ValueError(f"EngineLimits.dtypes {self.dtypes}: {exc}") from None
