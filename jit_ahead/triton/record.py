"""The Triton family's records (``JIT_AHEAD_RECORD_DIR``): header fields and one entry per variant.

An entry is a TritonCompileRequest as JSON: enough for a helper to rebuild the variant exactly, marked
``benchmark_only`` when the process launched it only while an autotuner benchmarked a config it did not
choose (replay builds those last: with the recorded choice, nothing launches them again). The
header pins what the predicted hashes depend on besides the kernel source: Triton's version and install
key, the Python ABI, the target and the cache-invalidating environment. A kernel whose source changed
since it was recorded rebuilds under a new hash, which its helper reports as a hash mismatch.
"""
from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass

import triton

from ..core.records import RecordFormat, is_dotted_name
from .installation_key import installation_key
from .request import FAMILY, TritonCompileRequest
from .variant_diff import is_specialization

_HASH = re.compile("[0-9a-f]{64}")


def _cache_invalidating_env() -> list[list[str]]:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return sorted([k, v] for k, v in get_cache_invalidating_env_vars().items())


def header(target: tuple[str, int, int]) -> dict:
    return {"triton": triton.__version__, "triton_key": installation_key(),
            "python_abi": sysconfig.get_config_var("SOABI") or "", "target": list(target),
            "env": _cache_invalidating_env()}


@dataclass(frozen=True)
class RecordedVariant:
    request: TritonCompileRequest
    benchmark_only: bool = False

    @property
    def module(self) -> str:
        return self.request.module

    @property
    def qualname(self) -> str:
        return self.request.qualname


def encode(item: RecordedVariant) -> dict:
    request = item.request
    entry = {"module": request.module, "qualname": request.qualname, "name": request.name,
             "spec": request.specialization_data, "hash": request.predicted_hash}
    if item.benchmark_only:
        entry["benchmark_only"] = True
    return entry


def decode_for(target: tuple[str, int, int], env: list[list[str]]):
    """Entries carry no target or environment of their own: the header they were read under pins both."""
    env_pairs = tuple((k, v) for k, v in env)

    def decode(entry: dict) -> RecordedVariant:
        module, qualname, name = entry["module"], entry["qualname"], entry["name"]
        if not (is_dotted_name(module) and is_dotted_name(qualname) and str(name).isidentifier()):
            raise ValueError(f"not a kernel name: {module!r} {qualname!r}")
        spec, digest = entry["spec"], entry["hash"]
        if not (isinstance(digest, str) and _HASH.fullmatch(digest)):
            raise ValueError("bad hash")
        if not is_specialization(spec):
            raise ValueError("the specialization is not Triton's specialization JSON")
        request = TritonCompileRequest(module, qualname, name, spec, tuple(target), env_pairs, digest)
        return RecordedVariant(request, entry.get("benchmark_only") is True)

    return decode


def record_format(target: tuple[str, int, int]) -> RecordFormat:
    fields = header(target)
    return RecordFormat(family=FAMILY, header=fields, key_of=lambda item: item.request.predicted_hash, encode=encode,
                        decode=decode_for(tuple(fields["target"]), fields["env"]))
