"""A kernel module that kills any jit_ahead helper importing it while JIT_AHEAD_TEST_CRASH=1: the tests'
real stand-in for a request that crashes helpers (an LLVM abort, a segfault in a kernel library)."""
import os
import signal

import triton
import triton.language as tl

if os.environ.get("JIT_AHEAD_HELPER") == "1" and os.environ.get("JIT_AHEAD_TEST_CRASH") == "1":
    os.kill(os.getpid(), signal.SIGKILL)


@triton.jit
def crash_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2)
