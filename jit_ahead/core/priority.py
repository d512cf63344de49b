"""Request priorities, highest first."""
from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """Why a variant is wanted. A lower value is served first.

    URGENT: a launch on the executor is blocked on it right now, or an autotuner there is benchmarking
        the configs of one tuning key and will launch it shortly.
    WARMUP: the engine's next warmup forward or CUDA-graph capture needs it.
    REPLAY: an earlier run of the same deployment used it.
    BACKGROUND: a provider enumerated it as reachable within the engine limits.
    SPARE: an earlier run built it without needing its result (for Triton: a config an autotuner tried
        and did not choose); needed again only if that choice is made again, so built last.
    """

    URGENT = 0
    WARMUP = 1
    REPLAY = 2
    BACKGROUND = 3
    SPARE = 4
