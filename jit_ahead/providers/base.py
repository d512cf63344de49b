"""The provider API: model-facing code that finds a kernel library's layers and enumerates every launch
they can make within the engine limits, by calling the library's real launcher on meta tensors."""
from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from ..core.planning.claims import Claims  # noqa: F401 - part of the provider API
from ..core.planning.limits import EngineLimits
from ..core.priority import Priority


@dataclass(frozen=True)
class PlannedLaunch:
    """One call of a library launcher on meta tensors; run inside a capture it yields compile requests."""

    priority: Priority  # WARMUP for what warmup and CUDA-graph capture need, else BACKGROUND
    run: Callable[[], object]
    label: str


class Provider(ABC):
    """Subclass per kernel library or layer type. Providers never compile or launch anything themselves:
    the session runs their launches in a capture and queues the requests."""

    name: ClassVar[str]
    library: ClassVar[str]  # importable module; built-in providers are enabled when it imports
    family: ClassVar[str] = "triton"
    # kernel modules its launches build from: helpers import them as soon as planning starts, while the
    # provider still walks the model (a kernel library's import is seconds per helper)
    modules: ClassVar[tuple[str, ...]] = ()
    # the EngineLimits.extra keys it reads, each with what it does: planning names any other key once
    extra_limits: ClassVar[dict[str, str]] = {}
    # True for a planner of what other providers leave (the model-level planner): it runs after them and
    # its ``find_layers`` also gets what they claim, the limits and whether planning was cancelled:
    # ``find_layers(model, claims, limits, stop)``
    sees_claims: ClassVar[bool] = False
    # calls the last ``launches`` made to find shape classes, by problem (``shape_classes``): what planning
    # costs beside the launches it lists; each ``launches`` sets a dict of its own
    sampled: dict[str, int] = {}

    @abstractmethod
    def find_layers(self, model) -> list:
        """The model's layers this provider plans for (``model.modules()``; meta or real weights)."""

    @abstractmethod
    def launches(self, layers: list, limits: EngineLimits) -> Iterable[PlannedLaunch]:
        """Every launch the layers can make within ``limits``; duplicates are fine (deduplicated later)."""

    def enter_planner(self) -> None:
        """Set-up in a planner process (forked from the planning thread) before this provider's launches run
        there; process-wide, since no thread of the server runs in a planner. Default: nothing."""

    def claims(self, model, sites: list) -> Claims:
        """What this provider plans in full among what ``find_layers`` returned (default: nothing); the
        model-level planner leaves it out of its own sweep."""
        return Claims()


def distinct_sites(found: Iterable[tuple[str, object]], what: str, log) -> list:
    """One site per ``form`` among ``found`` (pairs of a layer's name and its site, or the reason it is not
    planned); each reason is one warning on ``log``, naming the first layer it applies to."""
    distinct: dict[tuple, object] = {}
    skipped: dict[str, str] = {}
    for name, site in found:
        if isinstance(site, str):
            skipped.setdefault(site, name)
        else:
            distinct.setdefault(site.form, site)
    for why, name in skipped.items():
        log.warning("%s: %s is not planned (%s); its kernels compile where they are launched", what, name, why)
    return list(distinct.values())


def imported(module: str):
    """``module`` if this process has imported it, else None. A model holding a library's layers has
    imported the module that defines them; looking for them must not import the library (seconds, and
    memory and a longer exit for the server, for a library its model does not use)."""
    return sys.modules.get(module)


def warmup_token_counts(limits: EngineLimits) -> set[int]:
    """Token counts an engine's warmup runs: its CUDA-graph batch sizes (decode, one token each) and
    one full-length prefill (the profiling run: one sequence of min(max_num_tokens, max_seq_len) tokens).
    Launches at these are planned WARMUP."""
    return {*limits.cuda_graph_batch_sizes, min(limits.max_num_tokens, limits.max_seq_len)}


def token_counts(limits: EngineLimits, warmup: Iterable[int] = ()) -> list[tuple[int, Priority]]:
    """Every token count from 1 to ``max_num_tokens`` with its priority, the warmup's first: WARMUP for
    ``warmup_token_counts`` and the counts in ``warmup`` (an engine's own warmup sizes), else BACKGROUND.
    For kernels whose variants follow the token count through an engine's or a library's own choices
    (tuned configs, split counts): no smaller set of counts is exact for every GPU."""
    warm = {*warmup_token_counts(limits), *warmup}
    counts = sorted(range(1, limits.max_num_tokens + 1), key=lambda n: n not in warm)
    return [(n, Priority.WARMUP if n in warm else Priority.BACKGROUND) for n in counts]


def warmup_shapes(limits: EngineLimits) -> list[tuple[int, int]]:
    """The (batch, tokens per sequence) shapes of an engine's warmup within the limits (``is_warmup_shape``):
    the full-length prefill, then one token at each CUDA-graph batch size."""
    longest = (1, max(1, min(limits.max_num_tokens, limits.max_seq_len)))
    return [longest] + [(b, 1) for b in limits.cuda_graph_batch_sizes if 1 <= b <= limits.max_batch_size]


def is_warmup_shape(limits: EngineLimits, batch: int, seq: int) -> bool:
    """A (batch, tokens per sequence) shape the engine's warmup runs (see ``warmup_token_counts``)."""
    return (seq == 1 and batch in limits.cuda_graph_batch_sizes) or (
        batch == 1 and seq == min(limits.max_num_tokens, limits.max_seq_len))
