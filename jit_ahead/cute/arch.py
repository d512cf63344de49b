"""The GPU arch CuTe DSL compiles for: its name for a device view, and the environment variable the DSL
reads it from when there is no GPU (``CUTE_DSL_ARCH``)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

ARCH_VAR = "CUTE_DSL_ARCH"


def arch_of(view) -> str:
    """The CuTe DSL arch name of a DeviceView's GPU: arch-specific features (``a``) from sm_90 on."""
    major, minor = view.capability
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


@contextlib.contextmanager
def targeting(arch: str) -> Iterator[None]:
    """Compile for ``arch`` inside the block; the variable is as it was afterwards (an in-place build in
    the server leaves the server's environment alone)."""
    previous = os.environ.get(ARCH_VAR)
    os.environ[ARCH_VAR] = arch
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ARCH_VAR, None)
        else:
            os.environ[ARCH_VAR] = previous
