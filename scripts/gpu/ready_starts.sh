#!/usr/bin/env bash
# Issue 44 item 4 (and issue 35 items 2-3): engine-style starts, cold then warm, with and without jit_ahead,
# at the two limit sets, in parts that each fit one device call (about 10 minutes):
#   ready_starts.sh MODEL SET [ARMS] [-- MORE engine_starts.py FLAGS, e.g. --warm-pairs 4 --profile-serving]
# MODEL: qwen35-hybrid and gated-deltanet (the demo models at their demo size, weights built in place) or a
# real-sized one whose weights are read from a checkpoint (qwen3-liger-1b, gated-deltanet-1b, and the two no
# test uses: llama-liger-1b, gla-1b); SET: mid (EngineLimits(16384, 64, 8192)) or limits (32768, 256, 32768).
# ARMS (default jit-cold,plain-cold,jit-warm,plain-warm): a cold start with and without jit_ahead, then
# a warm one with jit_ahead and the same cache without it; no untimed first process (--no-prime), so the
# cold jit_ahead arm is the call's first process and pays its one-off costs. Each run draws its request
# mix with a new seed. ARM_TIMEOUT (default 200 s) ends an arm that runs longer (it is reported as such).
# Reported per arm: process time, time to ready, executor compiles and autotune runs after ready, the ready
# line's figures, the longest wait and its cause, the worst request. Output under $OUT/MODEL-SET.
set -euo pipefail
model=${1:?model}
set_name=${2:?set: mid or limits}
arms=${3:-jit-cold,plain-cold,jit-warm,plain-warm}
more=("${@:4}")
[ "${more[0]:-}" = "--" ] && more=("${more[@]:1}")
out=${OUT:-results/ready-starts}
mkdir -p "$out"
[ -f /tmp/site/jit_ahead.pth ] || bash scripts/gpu/install_offline.sh .whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nproc
checkpoint=()
case "$model" in *-1b) checkpoint=(--engine-style /tmp/ckpt) ;; esac
python3 scripts/gpu/engine_starts.py --out "$out/$model-$set_name" --models "$model" --sets "$set_name" \
    --arms "$arms" --no-prime --arm-timeout "${ARM_TIMEOUT:-200}" "${checkpoint[@]}" "${more[@]}" 2>&1 \
    | tee "$out/$model-$set_name.log"
