"""A small real CuTe DSL kernel for the tests: elementwise add over a 1-D tensor."""
import cuda.bindings.driver as cuda
import cutlass.cute as cute


@cute.kernel
def add_kernel(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < cute.size(a):
        c[i] = a[i] + b[i]


@cute.jit
def add(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
    n = cute.size(a)
    add_kernel(a, b, c).launch(grid=((n + 127) // 128, 1, 1), block=(128, 1, 1), stream=stream)
