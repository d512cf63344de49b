"""DeepGEMM's JIT cache key, computed in Python (its runtime computes it in C++ and exposes no way to ask).

An entry of DeepGEMM's disk cache is named ``<kernel name>.<digest>``, the digest a 128-bit hash over five
parts, each fed to the hash length-prefixed: the library's signature (``cutlass-<CUTLASS_VERSION>``), the
digest of the full ``nvcc --version`` text, the nvcc flags joined by spaces, a post-hook digest (empty
when there is none) and the digest of the kernel source with every ``<deep_gemm/...>`` header it includes,
recursively. No path enters it: the same source, headers, flags and nvcc give the same key anywhere.
Re-derived by hand, so ``tests/test_deep_gemm.py`` checks it against vectors the library's own C++
computed (``scripts/deep_gemm/key_vectors.py`` says how they were made).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

_MASK = (1 << 64) - 1
_SEEDS = (0xC6A4A7935BD1E995, 0xFF51AFD7ED558CCD)
_PRIMES = (0x100000001B3, 0x9E3779B97F4A7C15)
_BLANKS = " \t\f\v"


def _mix(value: int) -> int:
    """The 64-bit finalizer applied to each half of the state for the digest (splitmix64's)."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


class Hash128:
    """Two FNV-1a lanes over the same bytes; every update is prefixed with its length (8 bytes, little
    endian), so chained parts have unambiguous boundaries."""

    def __init__(self) -> None:
        self._state = list(_SEEDS)

    def update(self, data: str | bytes) -> "Hash128":
        raw = data.encode() if isinstance(data, str) else bytes(data)
        lane_0, lane_1 = self._state
        prime_0, prime_1 = _PRIMES
        for byte in len(raw).to_bytes(8, "little") + raw:
            lane_0 = ((lane_0 ^ byte) * prime_0) & _MASK
            lane_1 = ((lane_1 ^ byte) * prime_1) & _MASK
        self._state = [lane_0, lane_1]
        return self

    def hexdigest(self) -> str:
        return "".join(f"{_mix(lane):016x}" for lane in self._state)


def digest(data: str | bytes) -> str:
    return Hash128().update(data).hexdigest()


class NonStandardInclude(ValueError):
    """An include DeepGEMM's runtime refuses (quoted, or with blanks inside the brackets)."""


def included_name(line: str, prefixes: Sequence[str]) -> str | None:
    """The header a ``#include <...>`` line names when it starts with one of ``prefixes``; None for any
    other line. Raises NonStandardInclude where DeepGEMM's parser does."""
    line = line.lstrip(_BLANKS)
    if not line.startswith("#"):
        return None
    line = line[1:].lstrip(_BLANKS)
    if not line.startswith("include"):
        return None
    line = line[len("include"):].lstrip(_BLANKS)
    if not line or line[0] not in "<\"":
        return None
    closing = next((i for i in range(1, len(line)) if line[i] in ">\""), None)
    if closing is None:
        return None
    name = line[1:closing]
    if line[0] != "<" or line[closing] != ">" or not name or name[0] in _BLANKS or name[-1] in _BLANKS:
        raise NonStandardInclude(f"non-standard include: {line[:closing + 1]}")
    return name if any(name.startswith(prefix) for prefix in prefixes) else None


class SourceDigest:
    """The digest of a source and, recursively, the headers it includes under ``prefixes``, found in the
    first of ``include_dirs`` that has them (each header's digest computed once)."""

    def __init__(self, include_dirs: Iterable[str | Path], prefixes: Sequence[str] = ("deep_gemm/",)) -> None:
        self.include_dirs = [Path(d) for d in include_dirs]
        self.prefixes = tuple(prefixes)
        self._headers: dict[str, str] = {}
        self._visiting: set[str] = set()

    def of_source(self, code: str | bytes) -> str:
        raw = code.encode() if isinstance(code, str) else code
        hasher = Hash128().update(raw)
        for line in raw.split(b"\n"):
            name = included_name(line.decode("utf-8", errors="replace"), self.prefixes)
            if name is not None:
                hasher.update(self.of_header(name))
        return hasher.hexdigest()

    def of_header(self, name: str) -> str:
        if name in self._headers:
            return self._headers[name]
        if name in self._visiting:
            raise ValueError(f"circular include: {name}")
        path = next((d / name for d in self.include_dirs if (d / name).exists()), None)
        if path is None:
            raise FileNotFoundError(f"{name} is in none of {', '.join(map(str, self.include_dirs))}")
        self._visiting.add(name)
        try:
            digest_ = self.of_source(path.read_bytes())  # the bytes as they are, as DeepGEMM reads them
        finally:
            self._visiting.discard(name)
        self._headers[name] = digest_
        return digest_


def cache_key(signature: str, nvcc_version: str, flags: Sequence[str], source_digest: str,
              post_hook_digest: str = "") -> str:
    """The digest of an entry: ``signature`` (e.g. "cutlass-421"), the full ``nvcc --version`` text, the
    nvcc flags in order, the source digest (``SourceDigest.of_source``) and the post hook's digest."""
    return (Hash128().update(signature).update(digest(nvcc_version)).update(" ".join(flags))
            .update(post_hook_digest).update(source_digest).hexdigest())
