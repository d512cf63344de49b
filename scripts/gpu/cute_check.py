#!/usr/bin/env python3
"""The CuTe DSL family on the GPU: helper-built objects run, match the in-process compiled kernel, and
the executor does no CuTe compile after warmup.

One process, jit_ahead session with the cute family (helpers: CPU only, nice 19, GPU hidden), empty
caches in a temporary folder:
  planning   captures ``cute.compile`` of the test add kernel (plain and TVM FFI) and quack's RMSNorm
             for a small model's RMSNorm layers (QuackRMSNormProvider); helpers build everything
  warmup     the server's own calls: the add kernel through ``cute.compile`` (loaded objects), quack's
             ``rmsnorm_fwd`` at a few row counts (quack loads the helpers' objects from its cache)
  serving    mark_serving, then more rows and calls; any CuTe compile in this process is counted
  control    the same kernels compiled in this process without jit_ahead (another quack cache folder,
             the DSL's compile called directly): outputs must be bitwise equal
Writes cute_check.json and .md to --out.

    python scripts/gpu/cute_check.py --out results/<date>-h200-cute-check
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

HIDDEN = (4096, 128)  # a model's hidden size and its q/k norm's head dim
ROWS_WARMUP = (1, 8, 512)
ROWS_SERVING = (3, 77, 1000, 4096)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="a results/<date>-<what> folder")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="cute_check_")
    os.environ["JIT_AHEAD_CUTE_CACHE_DIR"] = os.path.join(scratch, "cute")
    os.environ["QUACK_CACHE_DIR"] = os.path.join(scratch, "quack")

    import torch

    import cutlass
    import quack
    import tvm_ffi
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session
    from jit_ahead.cute import hook
    from jit_ahead.providers.quack import QuackRMSNormProvider
    from tests.kernels import cute_add

    result: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                                 "cutlass_dsl": cutlass.__version__, "quack": quack.__version__,
                                 "tvm_ffi": tvm_ffi.__version__,
                                 "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}
    phase = {"name": "planning"}
    compiles: list[tuple[str, str]] = []  # (phase, function): the DSL's compiles in this process
    events: list[dict] = []
    t0 = time.perf_counter()
    session = Session(families=("cute",))
    session.stats.subscribe(events.append)
    session.start()
    original = hook._original

    def counting(cc, func, *a, **k):
        compiles.append((phase["name"], getattr(func, "__qualname__", type(func).__qualname__)))
        return original(cc, func, *a, **k)

    hook._original = counting

    class Qwen3RMSNorm(torch.nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
            self.variance_epsilon = 1e-6

    model = torch.nn.Sequential(*(Qwen3RMSNorm(h) for h in HIDDEN)).to("meta")
    limits = EngineLimits(max_num_tokens=4096, max_batch_size=64, cuda_graph_batch_sizes=(1, 8))
    with session.families["cute"].capture() as plan:
        cute_add.compile_add("Float16")
        cute_add.compile_add_tvm_ffi("Float16")
    tickets = session.families["cute"].submit(plan, Priority.WARMUP)
    run = session.plan_model(model, limits, providers=[QuackRMSNormProvider()])
    ready = session.wait_ready(600)
    result["planning"] = {"ready": ready, "ready_s": round(time.perf_counter() - t0, 2),
                          "variants": len(tickets) + sum(run.variants.values()), "errors": run.errors,
                          "builds": [{k: e.get(k) for k in ("label", "helper", "ok", "seconds")}
                                     for e in events if e["event"] == "build_finish"]}

    rmsnorm = sys.modules["quack.rmsnorm"]
    fwd = rmsnorm._compile_rmsnorm_fwd
    checks: dict = {}

    # -- warmup: the server's own calls ------------------------------------------------------------------
    phase["name"] = "warmup"
    n = 1 << 20
    a = torch.randn(n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    add_ffi = cute_add.compile_add_tvm_ffi("Float16")
    c = torch.empty_like(a)
    add_ffi(a, b, c)
    torch.cuda.synchronize()
    checks["add_tvm_ffi_type"] = f"{type(add_ffi).__module__}.{type(add_ffi).__name__}"
    checks["add_tvm_ffi_equals_torch"] = bool(torch.equal(c, a + b))
    add_plain = cute_add.compile_add("Float16")
    checks["add_plain_type"] = f"{type(add_plain).__module__}.{type(add_plain).__name__}"
    try:
        from cutlass.cute.runtime import from_dlpack

        import cuda.bindings.driver as cuda_driver

        c2 = torch.empty_like(a)

        stream = cuda_driver.CUstream(torch.cuda.current_stream().cuda_stream)
        tensors = [from_dlpack(t, assumed_align=16).mark_layout_dynamic() for t in (a, b, c2)]
        add_plain(*tensors, stream)
        torch.cuda.synchronize()
        checks["add_plain_equals_torch"] = bool(torch.equal(c2, a + b))
    except Exception as exc:  # reported, not hidden: how a plain export is called is the caller's part
        checks["add_plain_error"] = f"{type(exc).__name__}: {exc}"

    def rms(rows: int, hidden: int):
        g = torch.Generator(device="cuda").manual_seed(rows * 7 + hidden)
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        out = rmsnorm.rmsnorm_fwd(x, w, eps=1e-6)[0]
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
        return x, w, out, float((out.float() - ref).abs().max())

    outputs = {}
    for rows in ROWS_WARMUP:
        for hidden in HIDDEN:
            outputs[(rows, hidden)] = rms(rows, hidden)
    torch.cuda.synchronize()
    checks["quack_after_warmup"] = fwd.cache_info()._asdict()

    # -- serving ------------------------------------------------------------------------------------------
    session.mark_serving()
    phase["name"] = "serving"
    for rows in ROWS_SERVING:
        for hidden in HIDDEN:
            outputs[(rows, hidden)] = rms(rows, hidden)
    cute_add.compile_add_tvm_ffi("Float16")
    torch.cuda.synchronize()
    checks["quack_after_serving"] = fwd.cache_info()._asdict()
    checks["max_abs_err_vs_fp32_reference"] = max(o[3] for o in outputs.values())
    checks["executor_compiles"] = compiles
    checks["executor_misses"] = [{k: e.get(k) for k in ("label", "outcome", "seconds")}
                                 for e in events if e["event"] == "executor_miss"]
    session.close()

    # -- control: compiled in this process, no jit_ahead --------------------------------------------------
    phase["name"] = "control"
    import quack.cache

    quack.cache.CACHE_DIR = os.path.join(scratch, "quack-control")
    fwd.cache_clear()
    equal = []
    for (rows, hidden), (x, w, out, _) in outputs.items():
        equal.append(bool(torch.equal(rmsnorm.rmsnorm_fwd(x, w, eps=1e-6)[0], out)))
    length = cutlass.cute.sym_int32(divisibility=8)  # as compile_add_tvm_ffi makes them
    fake = [cutlass.cute.runtime.make_fake_compact_tensor(cutlass.Float16, (length,), assumed_align=16) for _ in range(3)]
    local = original(cutlass.cute.compile, cute_add.add, *fake,
                     cutlass.cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
    c3 = torch.empty_like(a)
    local(a, b, c3)
    torch.cuda.synchronize()
    checks["quack_equals_in_process_compile"] = all(equal)
    checks["quack_control_compiles"] = fwd.cache_info()._asdict()
    checks["add_equals_in_process_compile"] = bool(torch.equal(c3, c))
    result["checks"] = checks
    result["executor_compiles_after_warmup"] = sum(1 for p, _ in compiles if p == "serving") + \
        checks["quack_after_serving"]["misses"]

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cute_check.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    lines = [f"# CuTe DSL family on the GPU ({result['date']})", "",
             f"Versions: {json.dumps(result['versions'])}", "",
             f"- planning: {result['planning']['variants']} variants, ready {result['planning']['ready']} after "
             f"{result['planning']['ready_s']} s, {len(result['planning']['builds'])} builds in helpers, errors "
             f"{result['planning']['errors']}",
             f"- add kernel (TVM FFI) loaded as {checks['add_tvm_ffi_type']}: equals torch "
             f"{checks['add_tvm_ffi_equals_torch']}, equals the in-process compile {checks['add_equals_in_process_compile']}",
             f"- add kernel (plain export) loaded as {checks['add_plain_type']}: "
             f"{checks.get('add_plain_equals_torch', checks.get('add_plain_error'))}",
             f"- quack RMSNorm: cache after warmup {checks['quack_after_warmup']}, after serving "
             f"{checks['quack_after_serving']}; bitwise equal to quack compiled in this process "
             f"{checks['quack_equals_in_process_compile']}; max |err| vs fp32 {checks['max_abs_err_vs_fp32_reference']:.4f}",
             f"- CuTe compiles in this process: {compiles}",
             f"- executor compiles after warmup: {result['executor_compiles_after_warmup']}"]
    with open(os.path.join(args.out, "cute_check.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
