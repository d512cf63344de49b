"""Small Triton kernels for the benchmarks, in an importable module (helpers must import what they build)."""
import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def unrolled_kernel(x_ptr, n, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """Compile time grows with STEPS: a build long enough to wait on."""
    offs = tl.arange(0, BLOCK)
    acc = tl.load(x_ptr + offs, mask=offs < n)
    for i in tl.static_range(STEPS):
        acc = tl.sin(acc) * (i + 1) + tl.cos(acc)
    tl.store(x_ptr + offs, acc, mask=offs < n)
