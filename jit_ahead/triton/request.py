"""The Triton family's build request, and how one is made from a compile Triton's hook reports: predicted
from the very inputs this process would compile it from (its disk hash included). Planning's capture and the
executor's misses both make their requests here. Importing this module never imports Triton (helpers
unpickle it; a process that never misses never loads Triton's compiler for it)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.requests import VariantBase

FAMILY = "triton"


@dataclass(frozen=True)
class TritonCompileRequest(VariantBase):
    """Everything a helper needs to rebuild one variant exactly, for an explicit target.

    ``specialization_data`` is Triton's own JSON from the ``jit_cache_hook`` (signature, constexprs,
    attributes and the fully resolved options). ``predicted_hash`` is the disk hash Triton's ``compile()``
    will look up in the launching process; the helper checks that its build lands there.
    """

    module: str
    qualname: str
    name: str  # the kernel function's __name__: Triton's file stem in the cache entry
    specialization_data: str
    target: tuple[str, int, int]  # GPUTarget(backend, arch, warp_size)
    env: tuple[tuple[str, str], ...]  # the launching process's cache-invalidating environment
    predicted_hash: str

    family = FAMILY

    @property
    def key(self) -> str:
        return self.predicted_hash


def cache_invalidating_env() -> dict[str, str]:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(get_cache_invalidating_env_vars())


def request_from_hook(fn, compile: dict, env: dict[str, str] | None = None) -> TritonCompileRequest:
    """The request for one hook call: predicted from the very inputs this process would compile."""
    from triton.compiler import ASTSource

    from .compile_inputs import decode_options, predict_hash, target_tuple

    kernel = fn.jit_function  # a JITFunction
    target = kernel.device_caches[compile["device"]][2]  # its GPUTarget
    spec = compile["specialization_data"]
    src = ASTSource(kernel, compile["signature"], compile["constants"], compile["configs"][0])
    env = cache_invalidating_env() if env is None else env
    predicted = predict_hash(src, target, decode_options(json.loads(spec)), env)
    return TritonCompileRequest(module=kernel.module, qualname=kernel.fn.__qualname__, name=kernel.fn.__name__,
                                specialization_data=spec, target=target_tuple(target),
                                env=tuple(sorted(env.items())), predicted_hash=predicted)
