#!/usr/bin/env bash
# Planning wall on the GPU host's cores (issue 35), in two parts (each fits one device call):
#   planning_classes.sh engine   the whole space of EngineLimits(32768, 256, 32768), planned with shape
#                                classes, per model, 15 planners;
#   planning_classes.sh smaller [BASELINE]
#                                EngineLimits(8192, 16, 4096), where the every-shape planner of an older
#                                checkout (BASELINE, default .device/baseline: `git archive e9d780d`
#                                unpacked) still finishes, the two side by side.
# Wheels in .whl/ (liger-kernel, fla-core, flash-linear-attention); output under $OUT.
set -euo pipefail
part=${1:-engine}
baseline=${2:-.device/baseline}
out=${OUT:-results/planning-classes}
[ -f /tmp/site/jit_ahead.pth ] || bash scripts/gpu/install_offline.sh .whl
export PYTHONPATH=/tmp/site
nproc; python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)'
if [ "$part" = engine ]; then
    python3 scripts/bench/planning_wall.py --out "$out/engine-limits" --limits 32768,256,32768 --planners 15 \
        --models qwen35-hybrid,qwen3-next-liger,fla-kda,qwen3-liger,plain-hybrid
else
    python3 scripts/bench/planning_wall.py --out "$out/smaller-limits" --limits 8192,16,4096 --planners 15 \
        --models qwen35-hybrid,qwen3-next-liger --baseline "$baseline"
fi
