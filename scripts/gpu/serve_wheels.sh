#!/usr/bin/env bash
# The wheels `transformers serve` needs beyond the GPU image (FastAPI, Uvicorn, OpenAI's types, pydantic), taken
# out of the vLLM wheel set scripts/gpu/vllm_wheels.py cut (.whl-vllm/part-*), into .whl-serve/ (a few MB: one
# device call carries them beside .whl/). On the GPU machine:
#   pip install --no-index --no-deps --target /tmp/site .whl-serve/*.whl
set -euo pipefail
out=${1:-.whl-serve}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat .whl-vllm/part-* > "$work/bundle.tar"
mkdir -p "$out"
names=$(tar tf "$work/bundle.tar" | grep -E '^(fastapi|starlette|uvicorn|openai|pydantic|pydantic_core|annotated_types|typing_inspection|sniffio|jiter|python_multipart|httpx2|httpcore2)-[0-9]')
tar xf "$work/bundle.tar" -C "$out" $names
ls "$out"
