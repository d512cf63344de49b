"""TileLang kernels of our own for the TileLang family's tests (imported only where tilelang is installed).

``scale_rows``: a row-wise elementwise kernel over a dynamic token count. ``split_row_sums``: a reduction
whose split count is a factory argument, the way DeepSeek-V4's mHC kernels take ``n_splits`` (derived from
the token count and the SM count by the engine); each split count is another kernel.
"""
import tilelang
import tilelang.language as T

TARGET = {"kind": "cuda", "arch": "sm_90a"}  # the H200's; "auto" needs a GPU


@tilelang.jit(out_idx=[-1], target=TARGET)
def scale_rows(hidden, block_m=64, dtype="float16"):
    m = T.dynamic("m")

    @T.prim_func
    def main(x: T.Tensor((m, hidden), dtype), out: T.Tensor((m, hidden), dtype)):
        with T.Kernel(T.ceildiv(m, block_m), threads=128) as bx:
            for i, j in T.Parallel(block_m, hidden):
                if bx * block_m + i < m:
                    out[bx * block_m + i, j] = x[bx * block_m + i, j] * T.cast(2.0, dtype)

    return main


@tilelang.jit(out_idx=[-1], target=TARGET)
def split_row_sums(hidden, n_splits, dtype="float32"):
    m = T.dynamic("m")
    chunk = hidden // n_splits

    @T.prim_func
    def main(x: T.Tensor((m, hidden), dtype), out: T.Tensor((n_splits, m), dtype)):
        with T.Kernel(m, n_splits, threads=32) as (row, split):
            acc = T.alloc_local((1,), dtype)
            acc[0] = T.cast(0, dtype)
            for j in T.serial(chunk):
                acc[0] += x[row, split * chunk + j]
            out[split, row] = acc[0]

    return main
