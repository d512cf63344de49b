"""The Triton family's build request. Importing this module never imports Triton (helpers unpickle it)."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.requests import BuildRequest

FAMILY = "triton"


@dataclass(frozen=True)
class TritonCompileRequest:
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

    @property
    def label(self) -> str:
        return f"{self.module}.{self.qualname}[{self.predicted_hash[:12]}]"

    def build_request(self) -> BuildRequest:
        return BuildRequest(family=FAMILY, key=self.predicted_hash, payload=self, label=self.label,
                            modules=(self.module,))
