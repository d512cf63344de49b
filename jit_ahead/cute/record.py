"""The CuTe DSL family's records (``JIT_AHEAD_RECORD_DIR``): header fields and one entry per variant.

Two kinds of entry: a ``cute.compile`` call the executor saw (its request without the fields the header
pins), and a call of a library's cached compile function (quack's ``jit_cache``) made outside planning.
The header pins the DSL's own fingerprint (its sources, compiler binary and CUDA flavor), the Python ABI
and the arch; a kernel module whose source changed since is rebuilt under a new key (its source hash is
part of the entry). Library calls are keyed again by the library at replay, so a changed library simply
computes other keys.

Entries name modules that helpers import, so decoding accepts only plain dotted names and the argument
types the family itself produces.
"""
from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import asdict, dataclass

from ..core.records import RecordFormat, is_dotted_name
from .request import FAMILY, ConstSpec, CuteCompileRequest, ScalarSpec, StreamSpec, SymSpec, TensorSpec

_SPECS = {cls.__name__: cls for cls in (TensorSpec, StreamSpec, ConstSpec, ScalarSpec)}
_PLAIN = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class LibraryCall:
    """A call of a library's cached compile function, with JSON-able arguments."""

    module: str
    qualname: str
    args: tuple
    kwargs: tuple  # sorted (name, value) pairs

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(encode(self), sort_keys=True).encode()).hexdigest()


def header(arch: str) -> dict:
    from .build import dsl_version

    return {"cute_dsl": dsl_version(), "python_abi": sysconfig.get_config_var("SOABI") or "", "arch": arch}


# -- values -------------------------------------------------------------------------------------------------
def _encode_value(value):
    """A library call's argument as JSON: plain values as they are, CUTLASS numeric types by name."""
    if isinstance(value, _PLAIN):
        return value
    import cutlass

    named = isinstance(value, type) and getattr(cutlass, value.__name__, None) is value
    if named and issubclass(value, cutlass.Numeric):
        return {"cutlass": value.__name__}
    raise TypeError(f"{type(value).__name__} cannot be recorded")


def _decode_value(value):
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, dict) and set(value) == {"cutlass"}:
        import cutlass

        cls = getattr(cutlass, str(value["cutlass"]), None)
        if isinstance(cls, type) and issubclass(cls, cutlass.Numeric):
            return cls
    raise ValueError(f"not a recorded argument: {value!r}")


def recordable(call: LibraryCall) -> bool:
    try:
        encode(call)
        return True
    except TypeError:
        return False


# -- entries ------------------------------------------------------------------------------------------------
def encode(item) -> dict:
    if isinstance(item, LibraryCall):
        return {"kind": "library", "module": item.module, "qualname": item.qualname,
                "args": [_encode_value(v) for v in item.args],
                "kwargs": [[k, _encode_value(v)] for k, v in item.kwargs]}
    return {"kind": "compile", "module": item.module, "qualname": item.qualname, "options": item.options,
            "host_target": item.host_target, "source_sha256": item.source_sha256,
            "args": [[type(a).__name__, asdict(a)] for a in item.args]}


def _extent(value):
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, dict):
        return SymSpec(int(value["slot"]), int(value["width"]), int(value["divisibility"]),
                       None if value.get("symbol") is None else str(value["symbol"]))
    raise ValueError(f"not an extent: {value!r}")


def _optional(value, convert):
    return None if value is None else convert(value)


def _spec(entry):
    name, fields = entry
    cls = _SPECS[name]
    if cls is TensorSpec:
        return TensorSpec(str(fields["dtype"]), tuple(_extent(e) for e in fields["shape"]),
                          _optional(fields["stride_order"], lambda order: tuple(int(i) for i in order)),
                          str(fields["memspace"]), _optional(fields["assumed_align"], int), int(fields["divisibility"]),
                          _optional(fields["stride"], lambda stride: tuple(_extent(e) for e in stride)),
                          bool(fields["use_32bit_stride"]))
    if cls is StreamSpec:
        return StreamSpec(bool(fields["use_tvm_ffi_env_stream"]))
    if cls is ConstSpec:
        if not isinstance(fields["value"], _PLAIN):
            raise ValueError("not a constant")
        return ConstSpec(fields["value"])
    return ScalarSpec(str(fields["dtype"]))


def decode_for(fields: dict):
    """Entries carry no DSL fingerprint or arch of their own: the header they were read under pins both."""

    def decode(entry: dict):
        module, qualname = entry["module"], entry["qualname"]
        if not (is_dotted_name(module) and is_dotted_name(qualname)):
            raise ValueError(f"not a kernel name: {module!r} {qualname!r}")
        if entry["kind"] == "library":
            return LibraryCall(module, qualname, tuple(_decode_value(v) for v in entry["args"]),
                               tuple((str(k), _decode_value(v)) for k, v in entry["kwargs"]))
        if entry["kind"] != "compile":
            raise ValueError(f"unknown entry kind {entry['kind']!r}")
        return CuteCompileRequest(module, qualname, tuple(_spec(a) for a in entry["args"]), fields["arch"],
                                  str(entry["options"]), str(entry["host_target"]), fields["cute_dsl"],
                                  str(entry["source_sha256"]))

    return decode


def record_format(arch: str) -> RecordFormat:
    fields = header(arch)
    return RecordFormat(family=FAMILY, header=fields, key_of=lambda item: item.key, encode=encode,
                        decode=decode_for(fields))
