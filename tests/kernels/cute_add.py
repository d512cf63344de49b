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


def compile_add(dtype: str = "Float16"):
    """The host side a library runs: fake tensors sharing one symbolic length, then ``cute.compile``."""
    import cutlass
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    n = cute.sym_int32(divisibility=8)
    a, b, c = (make_fake_compact_tensor(getattr(cutlass, dtype), (n,), assumed_align=16) for _ in range(3))
    return cute.compile(add, a, b, c, make_fake_stream())


def compile_add_locally(dtype: str = "Float16"):
    """A kernel defined inside a function: no helper can import it, so it compiles in place."""
    import cutlass
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    @cute.jit
    def add_local(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        add_kernel(a, b, c).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)

    n = cute.sym_int32(divisibility=8)
    a, b, c = (make_fake_compact_tensor(getattr(cutlass, dtype), (n,), assumed_align=16) for _ in range(3))
    return cute.compile(add_local, a, b, c, make_fake_stream())


def compile_add_tvm_ffi(dtype: str = "Float16"):
    """As ``compile_add``, compiled for TVM FFI (as quack does): the result takes torch tensors and the
    current stream from the environment."""
    import cutlass
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    n = cute.sym_int32(divisibility=8)
    a, b, c = (make_fake_compact_tensor(getattr(cutlass, dtype), (n,), assumed_align=16) for _ in range(3))
    return cute.compile(add, a, b, c, make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
