#!/usr/bin/env bash
# Install jit_ahead and the kernel libraries on a GPU machine without internet, from wheels in $1
# (default .whl/), into /tmp/site; put jit_ahead.pth where `site` runs it, so JIT_AHEAD=1 works.
# Afterwards: export PYTHONPATH=/tmp/site
set -euo pipefail
wheels=${1:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$wheels"/liger_kernel*.whl "$wheels"/fla_core*.whl "$wheels"/flash_linear*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>/dev/null
# Bytecode once, here: without it every process compiles the libraries' sources again on import (seconds of
# each start, the same in every arm of a benchmark, and a large part of their spread).
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1 || true
# PYTHONPATH entries are on sys.path before `site` processes .pth files, so the hook finds jit_ahead there.
site_dir=$(python3 -c 'import site; print(site.getsitepackages()[0])')
if ! cp /tmp/site/jit_ahead.pth "$site_dir/" 2>/dev/null; then
    user_site=$(python3 -m site --user-site)
    mkdir -p "$user_site" && cp /tmp/site/jit_ahead.pth "$user_site/"
fi
