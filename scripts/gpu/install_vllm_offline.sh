#!/usr/bin/env bash
# vLLM 0.25.0 on a GPU machine without internet (issue 36), from the parts scripts/gpu/vllm_wheels.py cut
# (one part per device call: each call carries .whl-vllm/part-NN and .whl-vllm/manifest.json and runs this).
# Each call sets its part aside in /tmp/vllm-parts (kept while the machine stays warm); the call that
# completes the set checks the whole against the manifest's digest and installs every wheel into
# /tmp/site, beside jit_ahead (install_offline.sh). Afterwards: export PYTHONPATH=/tmp/site
# Prints "vllm parts missing: ..." until the last part came, then "vllm installed: <version>".
set -euo pipefail
parts=/tmp/vllm-parts
mkdir -p "$parts"
cp .whl-vllm/manifest.json "$parts/"
for part in .whl-vllm/part-*; do
    [ -f "$part" ] && cp "$part" "$parts/"
done
if [ -f /tmp/site/vllm/__init__.py ]; then
    echo "vllm installed: $(PYTHONPATH=/tmp/site python3 -c 'import importlib.metadata as m; print(m.version("vllm"))')"
    exit 0
fi
python3 - "$parts" <<'PY'
import hashlib, json, os, subprocess, sys, tarfile
folder = sys.argv[1]
manifest = json.load(open(os.path.join(folder, "manifest.json")))
missing = [p for p in manifest["parts"] if not os.path.exists(os.path.join(folder, p))]
if missing:
    print("vllm parts missing: " + " ".join(missing))
    sys.exit(0)
digest = hashlib.sha256()
bundle = os.path.join(folder, "bundle.tar")
with open(bundle, "wb") as out:
    for p in manifest["parts"]:
        data = open(os.path.join(folder, p), "rb").read()
        digest.update(data)
        out.write(data)
if digest.hexdigest() != manifest["sha256"]:
    sys.exit("vllm parts do not match the manifest's digest: carry them again")
wheels = os.path.join(folder, "wheels")
with tarfile.open(bundle) as tar:
    tar.extractall(wheels, filter="data")
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                "--upgrade", "--target", "/tmp/site"] + [os.path.join(wheels, w) for w in manifest["wheels"]], check=True)
print("vllm installed: " + [w for w in manifest["wheels"] if w.startswith("vllm-")][0])
PY
