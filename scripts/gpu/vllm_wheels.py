#!/usr/bin/env python3
"""Gather, on a machine with PyPI, the wheels a GPU machine without internet needs to run vLLM 0.25.0
(issue 36): vLLM and every package its requirements reach that the GPU image lacks, for Python 3.12 on
x86-64, then cut them into parts that each fit one device call's carry (64 MiB).

    python scripts/gpu/vllm_wheels.py [--out .whl-vllm] [--skip NAME ...]

Packages the image already holds (device KINDS.md's list, with torch 2.11.0, Triton 3.6.0, transformers
5.17.0) are not fetched; neither are those only other paths use (--skip; by default the video codecs and
the GPU kernels of other attention backends: the runs use the Triton attention backend). vLLM's own
wheel loses FlashAttention's compiled extensions (``vllm/vllm_flash_attn/*.so``: unused with
VLLM_ATTENTION_BACKEND=TRITON_ATTN; see ``strip_flash_attn``).
The parts go to --out as ``part-NN`` with ``manifest.json``; ``install_vllm_offline.sh`` joins and
installs them there once every part has been carried (``run`` with carry ``[".whl-vllm/part-NN"]``).
"""
from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
# flashinfer-python and apache-tvm-ffi are not skipped: vLLM 0.25's sampler imports FlashInfer's module at
# its construction, and xgrammar imports tvm_ffi, on every path
SKIP = {"torchcodec", "pynvvideocodec", "flashinfer-cubin", "tokenspeed-mla", "humming-kernels",
        "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13", "quack-kernels",
        "tilelang", "fastsafetensors", "nvidia-cudnn-frontend"}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + ["manylinux2014_x86_64", "manylinux2010_x86_64",
                                                                 "manylinux1_x86_64", "linux_x86_64"]
PART_BYTES = 48 << 20  # with the working tree, within one call's 64 MiB carry


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# the GPU machine's interpreter, for requirement markers
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
          "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "extra": ""}


def pip(*args: str) -> None:
    platforms = [arg for platform in PLATFORMS + ["any"] for arg in ("--platform", platform)]
    try:
        subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--only-binary=:all:", "--python-version", "3.12",
                        "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", *platforms],
                       check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"pip {args[0]} failed: {exc.stderr[-1500:]}")


def vllm_requirements(wheel: Path, skip: set[str]) -> list[str]:
    """vLLM's own requirements that apply on the GPU machine (extras and --skip left out)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    found = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if norm(req.name) not in skip and (req.marker is None or req.marker.evaluate(TARGET)):
            req.marker = None  # evaluated here, for the GPU machine
            found.append(str(req))
    return found


FA_INIT = "vllm/vllm_flash_attn/__init__.py"
FA_CHECK = re.compile(r"\nif not \(FA2_AVAILABLE or FA3_AVAILABLE\):\n    raise ImportError\(.*?\n    \)\n", re.S)


def strip_flash_attn(wheel: Path) -> None:
    """vLLM's wheel, rewritten in place without FlashAttention's compiled extensions (``vllm/vllm_flash_attn/
    *.so``, and their RECORD lines). Its Python files stay: vLLM 0.25 imports them wherever a model module
    imports ``fa_utils`` (Qwen3's does), whatever the attention backend; its package's check that an
    extension is there is taken out, so that a call, never an import, fails without one."""
    def dropped(name: str) -> bool:
        return name.startswith("vllm/vllm_flash_attn/") and name.endswith(".so")

    with tempfile.NamedTemporaryFile(dir=wheel.parent, delete=False) as tmp:
        with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for item in src.infolist():
                if dropped(item.filename):
                    continue
                data = src.read(item.filename)
                if item.filename == FA_INIT:
                    text, found = FA_CHECK.subn("\n", data.decode())
                    if found != 1:
                        raise SystemExit(f"{FA_INIT}: its extension check was not found; look at it again")
                    data = text.encode()
                if item.filename.endswith(".dist-info/RECORD"):  # the changed file's line goes too
                    data = "".join(l for l in data.decode().splitlines(True)
                                   if not (dropped(l.split(",")[0]) or l.startswith(FA_INIT + ","))).encode()
                dst.writestr(item, data)
    os.replace(tmp.name, wheel)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".whl-vllm")
    parser.add_argument("--skip", nargs="*", default=sorted(SKIP))
    args = parser.parse_args()
    skip = {norm(s) for s in args.skip}
    image = {norm(n) for n in IMAGE}
    with tempfile.TemporaryDirectory() as folder:
        # vLLM's requirements resolved as pip would resolve them there (torch pinned to the image's), then
        # the wheels of those the image lacks, each at its resolved version
        pip("download", "--no-deps", "-d", folder, "vllm==0.25.0")
        (vllm,) = Path(folder).glob("vllm-*.whl")
        requirements = Path(folder, "requirements.txt")
        requirements.write_text("\n".join(vllm_requirements(vllm, skip)) + "\n")
        report = Path(folder, "report.json")
        pip("install", "--dry-run", "--ignore-installed", "--target", str(Path(folder, "target")), "--report",
            str(report), "-r", str(requirements), "torch==2.11.0", "triton==3.6.0", "transformers==5.17.0")
        resolved = {norm(item["metadata"]["name"]): item["metadata"]["version"]
                    for item in json.loads(report.read_text())["install"]}
        wanted = sorted(f"{name}=={version}" for name, version in resolved.items()
                        if name not in image and name not in skip and not name.startswith("nvidia-"))
        pip("download", "--no-deps", "-d", folder, *wanted)
        wheels = sorted(Path(folder).glob("*.whl"))
        strip_flash_attn(vllm)
        bundle = Path(folder, "bundle.tar")
        subprocess.run(["tar", "-cf", str(bundle), "-C", folder] + [w.name for w in wheels], check=True)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("part-*"):
            old.unlink()
        data = bundle.read_bytes()
        parts = []
        for i in range(0, len(data), PART_BYTES):
            part = out / f"part-{i // PART_BYTES:02d}"
            part.write_bytes(data[i:i + PART_BYTES])
            parts.append(part.name)
        manifest = {"wheels": sorted(w.name for w in wheels), "parts": parts,
                    "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest['wheels'])} wheels, {manifest['bytes'] / 2**20:.0f} MiB in {len(parts)} parts under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
