"""TileLang kernels of our own for the TileLang family's tests (imported only where tilelang is installed).

``scale_rows``: a row-wise elementwise kernel over a dynamic token count. ``split_row_sums``: a reduction
whose split count is a factory argument, the way DeepSeek-V4's mHC kernels take ``n_splits`` (derived from
the token count and the SM count by the engine); each split count is another kernel.
"""
import tilelang
import tilelang.language as T
import torch

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


def split_count(num_tokens: int, hidden: int, sm_count: int, block_m: int = 64) -> int:
    """How many splits a forward of ``num_tokens`` tokens uses, the way an engine sizes mHC's ``n_splits``:
    enough row blocks times splits to fill the SMs, at most one split per 128 columns."""
    blocks = -(-num_tokens // block_m)
    return max(1, min(hidden // 128, sm_count // blocks))


class SplitRowSums(torch.nn.Module):
    """A layer whose TileLang kernel depends on the token count and the GPU's SM count."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden

    def kernel_call(self, num_tokens: int):
        sm_count = torch.cuda.get_device_properties(0).multi_processor_count
        return split_row_sums, (self.hidden, split_count(num_tokens, self.hidden, sm_count)), {}

    def forward(self, x):
        kernel, args, kwargs = self.kernel_call(x.shape[0])
        return kernel(*args, **kwargs)(x)
