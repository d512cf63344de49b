"""The build request of one compile Triton's hook reports: what a launch would compile, predicted from the
very inputs this process would compile it from (its disk hash included). Planning's capture and the
executor's misses both make their requests here."""
from __future__ import annotations

import json

from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

from .request import TritonCompileRequest
from .compile_inputs import decode_options, predict_hash, target_tuple


def cache_invalidating_env() -> dict[str, str]:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(get_cache_invalidating_env_vars())


def request_from_hook(fn, compile: dict, env: dict[str, str] | None = None) -> TritonCompileRequest:
    """The request for one hook call: predicted from the very inputs this process would compile."""
    from triton.compiler import ASTSource

    kernel: JITFunction = fn.jit_function
    target: GPUTarget = kernel.device_caches[compile["device"]][2]
    spec = compile["specialization_data"]
    src = ASTSource(kernel, compile["signature"], compile["constants"], compile["configs"][0])
    env = cache_invalidating_env() if env is None else env
    predicted = predict_hash(src, target, decode_options(json.loads(spec)), env)
    return TritonCompileRequest(module=kernel.module, qualname=kernel.fn.__qualname__, name=kernel.fn.__name__,
                                specialization_data=spec, target=target_tuple(target),
                                env=tuple(sorted(env.items())), predicted_hash=predicted)
