"""The TileLang family's records (``JIT_AHEAD_RECORD_DIR``): one entry per compile the server made, the
request as it is (its PrimFunc JSON included), under a header that pins the TileLang version and the
machine, the inputs of TileLang's key that are not in the entry."""
from __future__ import annotations

import platform
from dataclasses import asdict

from ..core.records import RecordFormat, is_dotted_name
from .request import FAMILY, TileLangCompileRequest



def header() -> dict:
    import tilelang

    return {"tilelang": tilelang.__version__, "machine": platform.machine()}


def encode(request: TileLangCompileRequest) -> dict:
    entry = asdict(request)
    entry["pass_configs"] = [list(pair) for pair in request.pass_configs]
    entry["args"] = list(request.args)
    for name in ("out_idx", "compile_flags"):
        if isinstance(entry[name], tuple):
            entry[name] = {"list": list(entry[name])}
    return entry


def decode(entry: dict) -> TileLangCompileRequest:
    """Only entries of the family's own shape: a module name that is a dotted name, strings where strings
    are, plain values elsewhere."""
    values = dict(entry)
    for name in ("out_idx", "compile_flags"):
        value = values.get(name)
        if isinstance(value, dict):
            values[name] = tuple(value["list"])
    values["pass_configs"] = tuple((str(k), v) for k, v in values["pass_configs"])
    values["args"] = tuple(values.get("args", ()))
    request = TileLangCompileRequest(**{k: values[k] for k in TileLangCompileRequest.__dataclass_fields__})
    for name in ("key", "module", "qualname", "func_json", "target", "execution_backend"):
        if not isinstance(getattr(request, name), str):
            raise ValueError(f"{name} is not a string")
    if not is_dotted_name(request.module):
        raise ValueError(f"module {request.module!r} is not a dotted name")
    return request


def record_format() -> RecordFormat:
    return RecordFormat(family=FAMILY, header=header(), key_of=lambda request: request.key, encode=encode,
                        decode=decode)
