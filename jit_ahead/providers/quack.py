"""quack-kernels (CuTe DSL) RMSNorm, for engines that run their models' RMSNorm layers through
``quack.rmsnorm.rmsnorm_fwd``.

Not enabled by the library's presence: a model's RMSNorm layers call quack only when the engine routes
them there, so the engine adds ``QuackRMSNormProvider()`` to the providers it plans with.

How the reachable space is found: every RMSNorm layer of the model (a class named ``*RMSNorm`` with a
1-D weight) gives its hidden size and weight dtype; quack's own host code, ``rmsnorm_fwd``, runs on meta
tensors of every row count 1..max(max_num_tokens, max_batch_size) and every activation dtype of the
limits, inside a capture. Its compile function (``_compile_rmsnorm_fwd``, a ``quack.cache.jit_cache``
wrapper) is gated: in a capture it records the call (quack's key of it) and returns a no-op kernel, so
nothing compiles and nothing launches. The rows are symbolic in quack's kernels, so in practice one
variant per (hidden size, dtypes) remains after deduplication; the enumeration still asks quack for
each row count rather than assuming it.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from .base import PlannedLaunch, Provider, warmup_token_counts


@dataclass(frozen=True)
class NormSite:
    hidden: int
    weight_dtype: torch.dtype
    eps: float


def _rmsnorm_module():
    import quack.rmsnorm  # noqa: F401 - quack's package __init__ binds the name to a function

    from ..cute.library_cache import gate_package

    gate_package("quack")
    return sys.modules["quack.rmsnorm"]


class QuackRMSNormProvider(Provider):
    name = "quack-rmsnorm"
    library = "quack"
    family = "cute"
    modules = ("quack.rmsnorm",)

    def find_layers(self, model) -> list[NormSite]:
        sites = {}
        for module in model.modules():
            weight = getattr(module, "weight", None)
            is_norm = type(module).__name__.endswith("RMSNorm") and isinstance(weight, torch.Tensor)
            if not is_norm or weight.dim() != 1:
                continue
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
            site = NormSite(int(weight.shape[0]), weight.dtype, float(eps) if eps is not None else 1e-6)
            sites.setdefault(site, None)
        return list(sites)

    def launches(self, layers: list[NormSite], limits: EngineLimits) -> Iterable[PlannedLaunch]:
        rmsnorm = _rmsnorm_module()
        most = max(limits.max_num_tokens, limits.max_batch_size)
        warmup = sorted(r for r in warmup_token_counts(limits) if r <= most)
        for site in layers:
            for dtype in limits.torch_dtypes():
                for rows in warmup:
                    yield PlannedLaunch(Priority.WARMUP, _launch(rmsnorm, site, dtype, (rows,)),
                                        f"quack rmsnorm_fwd N={site.hidden} {dtype} rows={rows}")
                rest = tuple(r for r in range(1, most + 1) if r not in warmup)
                yield PlannedLaunch(Priority.BACKGROUND, _launch(rmsnorm, site, dtype, rest),
                                    f"quack rmsnorm_fwd N={site.hidden} {dtype} rows=1..{most}")


def _launch(rmsnorm, site: NormSite, dtype: torch.dtype, row_counts: tuple[int, ...]):
    def run() -> None:
        weight = torch.empty(site.hidden, dtype=site.weight_dtype, device="meta")
        for rows in row_counts:
            rmsnorm.rmsnorm_fwd(torch.empty(rows, site.hidden, dtype=dtype, device="meta"), weight, eps=site.eps)

    return run
