#!/usr/bin/env bash
# Issue 44 item 4 (and issue 35 items 2-3): engine-style starts, cold then warm, with and without jit_ahead,
# at the two limit sets, in parts that each fit one device call (about 10 minutes):
#   ready_starts.sh MODEL SET [ARMS]
# MODEL: qwen35-hybrid and gated-deltanet (the demo models at their demo size, weights built in place) or a
# real-sized one whose weights are read from a checkpoint (qwen3-liger-1b, gated-deltanet-1b, and the two no
# test uses: llama-liger-1b, gla-1b); SET: mid (EngineLimits(16384, 64, 8192)) or limits (32768, 256, 32768).
# ARMS (default plain-cold,jit-cold,jit-warm,plain-warm): a cold start without and with jit_ahead, then
# a warm one with jit_ahead and the same cache without it. Each run draws its request mix with a new seed.
# Reported per arm: process time, time to ready, executor compiles and autotune runs after ready, the ready
# line's figures, the longest wait and its cause, the worst request. Output under $OUT/MODEL-SET.
set -euo pipefail
model=${1:?model}
set_name=${2:?set: mid or limits}
arms=${3:-plain-cold,jit-cold,jit-warm,plain-warm}
out=${OUT:-results/ready-starts}
mkdir -p "$out"
[ -f /tmp/site/jit_ahead.pth ] || bash scripts/gpu/install_offline.sh .whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nproc
checkpoint=()
case "$model" in *-1b) checkpoint=(--engine-style /tmp/ckpt) ;; esac
python3 scripts/gpu/engine_starts.py --out "$out/$model-$set_name" --models "$model" --sets "$set_name" \
    --arms "$arms" --arm-timeout 140 "${checkpoint[@]}" 2>&1 | tee "$out/$model-$set_name.log"
