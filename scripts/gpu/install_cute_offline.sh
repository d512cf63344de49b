#!/usr/bin/env bash
# Install the CuTe DSL set (nvidia-cutlass-dsl with its CUDA 13 libraries, quack-kernels, TVM FFI) into
# /tmp/site on a GPU machine without internet, from wheels in the folders given (default .whl_cute_a
# .whl_cute_b). The CUDA 13 library wheel is larger than one 64 MiB carry, so it travels split:
# split -n 2 -d <wheel> <wheel>.part  (parts .part00, .part01, possibly in different folders); this
# script joins the parts first. Dependencies the machine already has (cuda-bindings, protobuf) are kept.
# Afterwards: export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages (the DSL puts `cutlass`
# on the path with a .pth file, which Python reads only in site directories, not in a --target folder), then
# python3 scripts/gpu/cute_check.py --out results/<date>-h200-cute-check
set -euo pipefail
folders=("$@")
[ ${#folders[@]} -gt 0 ] || folders=(.whl_cute_a .whl_cute_b)
work=$(mktemp -d)
for folder in "${folders[@]}"; do cp "$folder"/* "$work"/; done
for first in "$work"/*.whl.part00; do
    [ -e "$first" ] || continue
    wheel=${first%.part00}
    cat "$wheel".part* > "$wheel" && rm "$wheel".part*
done
optional=()
python3 -c 'import cuda.bindings' 2>/dev/null || optional+=("$work"/cuda_bindings*.whl "$work"/cuda_pathfinder*.whl)
python3 -c 'import google.protobuf' 2>/dev/null || optional+=("$work"/protobuf*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$work"/nvidia_cutlass_dsl-*.whl "$work"/nvidia_cutlass_dsl_libs_*.whl "$work"/quack_kernels*.whl \
    "$work"/apache_tvm_ffi*.whl "$work"/torch_c_dlpack_ext*.whl "$work"/einops*.whl "${optional[@]}"
rm -rf "$work"
