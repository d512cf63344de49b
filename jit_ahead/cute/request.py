"""The CuTe DSL family's build request and artifact key. Importing it never imports the DSL (helpers
unpickle it before choosing what to import)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from ..core.requests import BuildRequest

FAMILY = "cute"

# The helper's host CPU must never leak into the object the server loads: a fixed, portable host target.
PORTABLE_HOST_TARGET = "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64"


@dataclass(frozen=True)
class TensorSpec:
    """A fake tensor: CUTLASS dtype name (``Float16``), shape with ``None`` for a symbolic extent, the
    order of its strides (None: compact row-major), memory space and assumed byte alignment."""

    dtype: str
    shape: tuple[int | None, ...]
    stride_order: tuple[int, ...] | None = None
    memspace: str = "gmem"
    assumed_align: int | None = None
    divisibility: int = 1  # of each symbolic extent


@dataclass(frozen=True)
class StreamSpec:
    """A CUDA stream argument."""


@dataclass(frozen=True)
class ConstSpec:
    """A Python value passed as is (a ``Constexpr``: it is compiled in)."""

    value: int | float | bool | str


@dataclass(frozen=True)
class ScalarSpec:
    """A runtime scalar of a CUTLASS numeric type (``Int32``, ``Float32``)."""

    dtype: str


ArgSpec = TensorSpec | StreamSpec | ConstSpec | ScalarSpec


@dataclass(frozen=True)
class CuteCompileRequest:
    """Everything that changes the exported object, so everything in its key."""

    module: str
    qualname: str  # of the @cute.jit function
    args: tuple[ArgSpec, ...]
    arch: str  # "sm_90a"
    options: str = ""  # further cute.compile options
    host_target: str = PORTABLE_HOST_TARGET
    dsl_version: str = ""  # the DSL's own fingerprint: its sources, its compiler binary and CUDA flavor
    source_sha256: str = ""  # the kernel module's file

    @property
    def key(self) -> str:
        fields = asdict(self)
        fields["args"] = [[type(a).__name__, asdict(a)] for a in self.args]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    @property
    def symbol(self) -> str:
        """The exported function's name in the object: a C identifier unique to the variant."""
        return f"jit_ahead_{self.key[:24]}"

    @property
    def label(self) -> str:
        return f"{self.module}.{self.qualname}[{self.key[:12]}]"

    def build_request(self) -> BuildRequest:
        return BuildRequest(family=FAMILY, key=self.key, payload=self, label=self.label, modules=(self.module,))
