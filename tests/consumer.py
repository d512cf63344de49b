"""A fresh 'server' process: runs a scenario through Triton's normal launch path (stand-in driver, no
jit_ahead) and prints, as JSON, every compile() Triton made with its hash and cache_hit flag.

    python -m tests.consumer SCENARIO
"""
from __future__ import annotations

import json
import sys

from triton import knobs

from .scenarios import run_scenario


def main() -> None:
    events = []

    def listener(*, src, metadata, metadata_group, times, cache_hit, **kwargs):
        events.append({"name": src.name, "hash": metadata["hash"], "cache_hit": cache_hit})

    knobs.compilation.listener = listener
    run_scenario(sys.argv[1])
    print("CONSUMER " + json.dumps(events))


if __name__ == "__main__":
    main()
