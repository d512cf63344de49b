#!/usr/bin/env python3
"""Vectors for jit_ahead's DeepGEMM cache key (jit_ahead/deep_gemm/key.py), computed by DeepGEMM's own
hashing code: deep_jit's hash.hpp and parser.hpp from the deepinfer-gemm sdist, compiled with g++ and the
shims beside this script (``key_vectors.cpp``). The include tree of the vectors is our own text, written
into the vectors file, so the tests recreate it; DeepGEMM's real headers are checked here as well (the
Python port against the C++ on sources that include them) and reported, not committed.

    python scripts/deep_gemm/key_vectors.py --sdist /path/to/deepinfer_gemm-2.8.2 \
        --out tests/data/deep_gemm_key_vectors.json [--report results/<folder>/real_headers.json]

The sdist: https://pypi.org/project/deepinfer-gemm/2.8.2/ (download the .tar.gz and unpack it; pip cannot
build it without a CUDA torch).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from jit_ahead.deep_gemm.key import SourceDigest, cache_key, digest  # noqa: E402

STRINGS = ["", "abc", "deep_gemm", "x" * 1000, "line one\nline two\r\n\ttabbed\n", "\u00e9t\u00e9 \u2014 utf-8"]
TREE = {
    "deep_gemm/common/base.cuh": "#pragma once\nnamespace jit_ahead_test { constexpr int kBase = 1; }\n",
    "deep_gemm/common/math.cuh": "#pragma once\n#include <deep_gemm/common/base.cuh>\n#include <cute/tensor.hpp>\n"
                                 "namespace jit_ahead_test { constexpr int twice(int x) { return 2 * x; } }\n",
    "deep_gemm/impls/kernel.cuh": "#pragma once\n  #  include <deep_gemm/common/math.cuh>\n"
                                  "\t#include\t<deep_gemm/common/base.cuh>\n// #include <deep_gemm/not/included.cuh>\n"
                                  "#include <cuda_runtime.h>\n__global__ void jit_ahead_kernel(int* out) { *out = 3; }\n",
}
SOURCES = [
    "#include <deep_gemm/impls/kernel.cuh>\n",
    "#include <deep_gemm/impls/kernel.cuh>\r\n#include <deep_gemm/common/base.cuh>\r\nint main;\r\n",
    "// no includes at all\nint x = 1;",
    "#include <deep_gemm/common/math.cuh>\n#include <deep_gemm/common/math.cuh>\n",
]
NVCC_VERSIONS = ["nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n",
                 "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.9, V12.9.86\n"]
FLAGS = [["--gpu-architecture=sm_90a", "-O3", "--compiler-options=-O3",
          "--ptxas-options=--register-usage-level=10", "-std=c++20", "--compiler-options=-fPIC",
          "--compiler-options=-fconcepts", "--expt-relaxed-constexpr", "--expt-extended-lambda",
          "--diag-suppress=39,161,174,177,186,940", "--compiler-options=-Wno-deprecated-declarations,-Wno-abi"],
         ["--gpu-architecture=sm_100f", "-O3"]]


def build(sdist: Path, work: Path) -> Path:
    program = work / "key_vectors"
    subprocess.run(["g++", "-std=c++20", "-O1", "-I", str(HERE / "shim"), "-I",
                    str(sdist / "third-party" / "deep_jit" / "include"), str(HERE / "key_vectors.cpp"), "-o",
                    str(program)], check=True)
    return program


def run(program: Path, *args) -> str:
    return subprocess.run([str(program), *map(str, args)], check=True, capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sdist", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        program = build(args.sdist, work)
        strings = []
        for i, text in enumerate(STRINGS):
            path = work / f"string{i}"
            path.write_bytes(text.encode())
            strings.append({"text": text, "digest": run(program, "digest", path)})
        tree = work / "include"
        for name, text in TREE.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(text.encode())
        sources = []
        for i, text in enumerate(SOURCES):
            path = work / f"source{i}.cu"
            path.write_bytes(text.encode())
            sources.append({"text": text, "digest": run(program, "source", tree, path)})
        keys = []
        for version in NVCC_VERSIONS:
            for flags in FLAGS:
                for source in sources[:2]:
                    (work / "version").write_bytes(version.encode())
                    (work / "flags").write_bytes(" ".join(flags).encode())
                    keys.append({"signature": "cutlass-421", "nvcc_version": version, "flags": flags,
                                 "source_digest": source["digest"],
                                 "key": run(program, "key", "cutlass-421", work / "version", work / "flags",
                                            source["digest"])})
        vectors = {"made_by": "scripts/deep_gemm/key_vectors.py (deep_jit hash.hpp and parser.hpp of "
                              f"{args.sdist.name}, g++ with scripts/deep_gemm/shim)",
                   "strings": strings, "tree": TREE, "sources": sources, "keys": keys}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(vectors, indent=1, ensure_ascii=False) + "\n")

        # DeepGEMM's own headers: the port against the C++ on a source including each kernel header
        include = args.sdist / "deep_gemm" / "include"
        ported = SourceDigest([include])
        checked = []
        for header in sorted((include / "deep_gemm").rglob("*.cuh")):
            name = header.relative_to(include).as_posix()
            text = f"#include <{name}>\n"
            path = work / "real.cu"
            path.write_text(text)
            theirs, ours = run(program, "source", include, path), ported.of_source(text)
            checked.append({"header": name, "deep_gemm": theirs, "jit_ahead": ours, "equal": theirs == ours})
        agree = sum(c["equal"] for c in checked)
        print(f"{len(strings)} strings, {len(sources)} sources, {len(keys)} keys written to {args.out}; "
              f"real headers: {agree} of {len(checked)} digests equal")
        if args.report:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(json.dumps(checked, indent=1) + "\n")
        # our own port must agree on the committed vectors too, or they would fail the tests at once
        assert all(digest(s["text"]) == s["digest"] for s in strings)
        assert all(cache_key(k["signature"], k["nvcc_version"], k["flags"], k["source_digest"]) == k["key"] for k in keys)
        return 0 if agree == len(checked) else 1


if __name__ == "__main__":
    sys.exit(main())
