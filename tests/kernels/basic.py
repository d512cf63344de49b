"""Small real Triton kernels for the tests: a plain one, a heuristics one, an autotuned one, one that
takes a @triton.jit function as a constexpr, and one that fails to compile."""
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * factor)
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=4),
                          triton.Config({"BLOCK": 512}, num_warps=8)], key=["n"])
@triton.jit
def tuned_copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def relu(x):
    return tl.maximum(x, 0.0)


@triton.jit
def apply_kernel(x_ptr, out_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, ACT(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def broken_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + undefined_name)  # noqa: F821 - fails to compile


@triton.jit
def slow_kernel(x_ptr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    # Fully unrolled, so compile time grows with STEPS: the tests' stand-in for a long build.
    offs = tl.arange(0, BLOCK)
    acc = tl.load(x_ptr + offs)
    for i in tl.static_range(STEPS):
        acc = acc * 1.0001 + tl.sin(acc + i)
    tl.store(x_ptr + offs, acc)


# Configs the next kernel's benchmarker timed in this process. With no GPU there is nothing to time: it
# launches the config once (so it compiles, as on a GPU) and reports each later config as faster, so the
# autotuner's choice is the last config, not simply the first.
BENCHMARKED: list[int] = []


def _bench_prefers_later(kernel_call, quantiles=None, **kwargs):
    kernel_call()
    BENCHMARKED.append(1)
    t = 1000.0 - len(BENCHMARKED)
    return [t] * len(quantiles) if quantiles else t


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=4),
                          triton.Config({"BLOCK": 512}, num_warps=8)], key=["n"], cache_results=True,
                 do_bench=_bench_prefers_later)
@triton.jit
def stored_tuning_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


# Autotuned on the row width only: the element count is not in the tuning key but still specializes
# (== 1, divisible by 16, other). Planning launches it at many counts per width.
@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2)],
                 key=["width"])
@triton.jit
def width_tuned_kernel(x_ptr, n, width, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * width, mask=offs < n)


# The same with a pruning function that reads the count's value: below 64 only the small block is kept,
# so which configs run depends on more than the count's specialization.
@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2)],
                 key=["width"], prune_configs_by={
                     "early_config_prune": lambda configs, nargs, **kw: [
                         c for c in configs if c.kwargs["BLOCK"] <= max(32, nargs["n"])]})
@triton.jit
def width_tuned_pruned_kernel(x_ptr, n, width, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * width, mask=offs < n)


# The same with heuristics inside the autotuner: EVEN depends on the count's value and each config's BLOCK,
# not only on the count's specialization.
@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2)],
                 key=["width"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def width_tuned_even_kernel(x_ptr, n, width, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * width)
    else:
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * width, mask=offs < n)


# Hooks that read and write the arguments' values while benchmarking (the output zeroed before each config,
# the input restored after), under heuristics that compute a constexpr from an argument's value.
@triton.heuristics({"EVEN": lambda args: args["n"] % 2 == 0})
@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=4)],
                 key=["n"], reset_to_zero=["out_ptr"], restore_value=["x_ptr"], do_bench=_bench_prefers_later)
@triton.jit
def hooked_tuning_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + EVEN, mask=mask)
