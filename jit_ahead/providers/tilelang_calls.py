"""A provider base for TileLang kernels whose variants follow from the token count of a forward and the
device: DeepSeek-V4's mHC kernels take a split count that an engine derives from the number of tokens and
the GPU's SM count, and every split count is another kernel (22 of them on an H200 for hidden size 7168).

A subclass names the layers and, for a layer and a token count, the TileLang call that forward makes
(``calls``): the same computation the layer runs, so the plan is exact. Every token count from 1 to the
limits' ``max_num_tokens`` is asked for (cheap: no kernel is elaborated twice, calls are deduplicated by
their arguments first); the calls the engine's warmup makes (its CUDA-graph sizes and its profiling run)
are planned at WARMUP, the rest at BACKGROUND. The device the calls read is the server's: planners see its
properties (the device view).
"""
from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Iterable, Iterator

from ..core.planning.limits import EngineLimits
from .base import PlannedLaunch, Provider, token_counts

Call = tuple  # (kernel, args tuple, kwargs dict): one TileLang kernel call


class TileLangTokenCalls(Provider):
    family = "tilelang"
    library = "tilelang"

    @abstractmethod
    def calls(self, layer, num_tokens: int) -> Iterable[Call]:
        """The TileLang calls ``layer``'s forward makes for ``num_tokens`` tokens."""

    def launches(self, layers: list, limits: EngineLimits) -> Iterator[PlannedLaunch]:
        from ..tilelang.plan import planned_call

        seen: set[tuple] = set()
        counts = token_counts(limits)
        for layer in layers:
            for num_tokens, priority in counts:
                for kernel, args, kwargs in self.calls(layer, num_tokens):
                    form = (id(kernel), repr(tuple(args)), repr(sorted(kwargs.items())))  # lists are arguments too
                    if form in seen:
                        continue
                    seen.add(form)
                    label = f"{_name(kernel)}{tuple(args)} ({num_tokens} tokens)"
                    yield PlannedLaunch(priority, functools.partial(planned_call, kernel, *args, **kwargs), label)


def _name(kernel) -> str:
    """A ``@tilelang.jit`` factory's name (its function's), else the callable's."""
    function = getattr(getattr(kernel, "func", None), "orig_func", kernel)
    return getattr(function, "__qualname__", type(kernel).__name__)
