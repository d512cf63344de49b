#!/usr/bin/env python3
"""Which of jit_ahead's files one executor miss crosses (issue 38's check): a Triton launch of a variant
nothing planned, and a toy-family call, each built in place (no helpers), traced from the DSL's entry point
to the launch's return. Prints, per family, the jit_ahead files in the order first entered, how many, and how
many times the trace moved from one file to another (the bounces).

    python scripts/bench/miss_trace.py
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


class FileTrace:
    """Python calls made in files under ``roots``, in order (sys.setprofile: calls only, so cheap enough)."""

    def __init__(self, roots: tuple[Path, ...]) -> None:
        self.roots = tuple(str(r) for r in roots)
        self.files: list[str] = []

    def __call__(self, frame, event, arg) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(self.roots):
                self.files.append(os.path.relpath(name, REPO))

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)

    def summary(self) -> dict:
        distinct = list(dict.fromkeys(self.files))
        moves = sum(1 for a, b in zip(self.files, self.files[1:]) if a != b)
        return {"files": distinct, "count": len(distinct), "moves": moves}


def triton_miss() -> dict:
    import torch

    from jit_ahead.session import Session
    from jit_ahead.triton.standin import ensure_driver
    from tests.kernels.basic import add_kernel

    ensure_driver()
    session = Session(triton={"workers": 0}).start()
    try:
        x = torch.empty(1024, device="meta")
        with FileTrace((REPO / "jit_ahead",)) as trace:
            add_kernel[(4,)](x, x, x, 1024, BLOCK=256)
        return trace.summary()
    finally:
        session.close()


def triton_load_miss() -> dict:
    """The miss a server meets most once jit_ahead has built the plan: the variant on disk, loaded."""
    import torch

    from jit_ahead.session import Session
    from jit_ahead.triton.standin import ensure_driver
    from tests.kernels.basic import add_kernel

    ensure_driver()
    session = Session(triton={"workers": 0}).start()
    try:
        x = torch.empty(1024, device="meta")
        add_kernel[(4,)](x, x, x, 1024, BLOCK=256)  # built in place, then dropped from Triton's memory
        for cache in add_kernel.device_caches.values():
            cache[0].clear()
        with FileTrace((REPO / "jit_ahead",)) as trace:
            add_kernel[(4,)](x, x, x, 1024, BLOCK=256)
        return trace.summary()
    finally:
        session.close()


def toy_miss() -> dict:
    from jit_ahead import registry
    from jit_ahead.session import Session
    from tests.toy import INFO, dsl

    registry._registered[INFO.name] = INFO  # as the toy's entry point would register it
    session = Session((INFO.name,), toy={"workers": 0}).start()
    try:
        with FileTrace((REPO / "jit_ahead", REPO / "tests" / "toy")) as trace:
            dsl.compile("mul", "traced")
        return trace.summary()
    finally:
        session.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        for knob in ("JIT_AHEAD_RECORD_DIR", "JIT_AHEAD_STATS"):  # unset: no records, no stats log (defaults)
            os.environ.pop(knob, None)
        os.environ.update(TRITON_CACHE_DIR=os.path.join(scratch, "triton"), JIT_AHEAD_TUNING_DIR="0",
                          JIT_AHEAD_PLAN_DIR=os.path.join(scratch, "plans"),
                          TOY_DSL_CACHE_DIR=os.path.join(scratch, "toy"))
        for name, run in (("triton", triton_miss), ("triton, on disk", triton_load_miss), ("toy", toy_miss)):
            result = run()
            print(f"{name}: one miss {'loaded' if 'disk' in name else 'built in place'} crosses {result['count']} of jit_ahead's files, moving between "
                  f"files {result['moves']} times: " + ", ".join(result["files"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
