"""The CuTe DSL family's build request and artifact key. Importing it never imports the DSL (helpers
unpickle it before choosing what to import)."""
from __future__ import annotations

import functools
import hashlib
import importlib
import json
from dataclasses import asdict, dataclass

from ..core.requests import VariantBase

FAMILY = "cute"

# The helper's host CPU must never leak into the object the server loads: a fixed, portable host target.
PORTABLE_HOST_TARGET = "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64"


@dataclass(frozen=True)
class SymSpec:
    """A symbolic extent or stride (``cute.sym_int``). ``slot`` numbers the distinct symbols of one call
    in order of appearance: two places holding the same symbol in the call hold the same slot."""

    slot: int
    width: int = 32
    divisibility: int = 1
    symbol: str | None = None


Extent = int | SymSpec | None


@dataclass(frozen=True)
class TensorSpec:
    """A fake tensor: CUTLASS dtype name (``Float16``), shape, strides, memory space and assumed byte
    alignment. In a hand-written spec a ``None`` extent is a fresh 32-bit symbol of ``divisibility`` and
    ``stride=None`` means compact strides in ``stride_order`` (default row-major); specs taken from a
    call (``jit_ahead.cute.arg_specs``) give every symbol and stride explicitly."""

    dtype: str
    shape: tuple[Extent, ...]
    stride_order: tuple[int, ...] | None = None
    memspace: str = "gmem"
    assumed_align: int | None = None
    divisibility: int = 1  # of each None extent
    stride: tuple[int | SymSpec, ...] | None = None
    use_32bit_stride: bool = False


@dataclass(frozen=True)
class StreamSpec:
    """A CUDA stream argument (``use_tvm_ffi_env_stream``: the stream comes from the TVM FFI environment)."""

    use_tvm_ffi_env_stream: bool = False


@dataclass(frozen=True)
class ConstSpec:
    """A Python value passed as is (a ``Constexpr``, or ``None`` for an absent optional tensor): it is
    compiled in."""

    value: int | float | bool | str | None


@dataclass(frozen=True)
class ScalarSpec:
    """A runtime scalar of a CUTLASS numeric type (``Int32``, ``Float32``)."""

    dtype: str


ArgSpec = TensorSpec | StreamSpec | ConstSpec | ScalarSpec


def resolve(module: str, qualname: str):
    """The object a request names by module and qualified name (the function a helper compiles)."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def uses_tvm_ffi(options: str) -> bool:
    return "--enable-tvm-ffi" in options.split()


@dataclass(frozen=True)
class CuteCompileRequest(VariantBase):
    """Everything that changes the exported object, so everything in its key."""

    family = FAMILY

    module: str
    qualname: str  # of the @cute.jit function
    args: tuple[ArgSpec, ...]
    arch: str  # "sm_90a"
    options: str = ""  # further cute.compile options
    host_target: str = PORTABLE_HOST_TARGET
    dsl_version: str = ""  # the DSL's own fingerprint: its sources, its compiler binary and CUDA flavor
    source_sha256: str = ""  # the kernel module's file

    @functools.cached_property  # asked for several times per call; the fields never change
    def key(self) -> str:
        fields = asdict(self)
        fields["args"] = [[type(a).__name__, asdict(a)] for a in self.args]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    @property
    def tvm_ffi(self) -> bool:
        """Compiled with ``--enable-tvm-ffi``: exported and loaded through TVM FFI."""
        return uses_tvm_ffi(self.options)

    @property
    def symbol(self) -> str:
        """The exported function's name in the object: a C identifier unique to the variant."""
        return f"jit_ahead_{self.key[:24]}"


    def is_built(self) -> bool:
        from .build import object_path  # the build module imports the DSL's helpers: not for helpers' unpickling

        return object_path(self).exists()
