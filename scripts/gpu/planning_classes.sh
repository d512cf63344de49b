#!/usr/bin/env bash
# Planning wall on the GPU host's cores (issue 35), in parts that each fit one device call:
#   planning_classes.sh engine [BASELINE]
#                                the whole space of EngineLimits(32768, 256, 32768), planned with shape
#                                classes, per model, 15 planners, two runs each; with BASELINE (the root
#                                of an older checkout, e.g. `git archive` of it unpacked), that code too,
#                                alternating with this one;
#   planning_classes.sh mid [BASELINE]
#                                the same at EngineLimits(16384, 64, 8192);
#   planning_classes.sh smaller [BASELINE]
#                                EngineLimits(8192, 16, 4096), where the every-shape planner of an older
#                                checkout (default .device/baseline) still finishes, the two side by side.
# Models: the five (the GatedDeltaNet and Qwen3.5 hybrid demo models, Qwen3-Next + Liger, fla's KDA
# model, a Qwen3-MoE + Liger model) and the Qwen3 + Liger demo model.
# Wheels in .whl/ (liger-kernel, fla-core, flash-linear-attention); output under $OUT.
set -euo pipefail
part=${1:-engine}
baseline=${2:-}
out=${OUT:-results/planning-classes}
models=${MODELS:-gated-deltanet,qwen35-hybrid,qwen3-next-liger,fla-kda,qwen3-moe-liger,qwen3-liger}
[ -f /tmp/site/jit_ahead.pth ] || bash scripts/gpu/install_offline.sh .whl
export PYTHONPATH=/tmp/site
nproc; python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)'
with_baseline=()
[ -n "$baseline" ] && with_baseline=(--baseline "$baseline")
case "$part" in
    engine) python3 scripts/bench/planning_wall.py --out "$out/engine-limits" --limits 32768,256,32768 \
                --planners 15 --repeat 2 --models "$models" "${with_baseline[@]}" ;;
    mid) python3 scripts/bench/planning_wall.py --out "$out/mid-limits" --limits 16384,64,8192 \
             --planners 15 --models "$models" "${with_baseline[@]}" ;;
    smaller) python3 scripts/bench/planning_wall.py --out "$out/smaller-limits" --limits 8192,16,4096 \
                 --planners 15 --models "$models" --baseline "${baseline:-.device/baseline}" ;;
esac
