"""What a TileLang compile is, as its kernel cache sees it, and the request that builds it ahead.

Every TileLang compile (``@tilelang.jit`` calls, ``tilelang.compile``, the autotuner's) reaches
``KernelCache.cached`` with an elaborated PrimFunc and its compile options. The request carries exactly
those, with the PrimFunc as TVM's JSON, so a helper repeats the same call without the engine's code, its
globals or a GPU; its key is the cache's own (``KernelCache._generate_key``), computed from the options as
``cached`` resolves them (the pass configs normalized, the target and execution backend resolved by
``create_backend_context``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.requests import VariantBase

FAMILY = "tilelang"


@dataclass(frozen=True)
class TileLangCompileRequest(VariantBase):
    family = FAMILY
    build_modules = ()  # the build reads its function from the request; helpers import TileLang at start
    key: str  # TileLang's kernel cache key: the entry's folder name
    module: str  # the kernel factory's module ("tilelang" for a bare tilelang.compile)
    qualname: str  # the factory's qualified name, or the PrimFunc's symbol
    func_json: str  # tvm.ir.save_json of the elaborated PrimFunc
    out_idx: tuple | int | None
    target: str  # the resolved target, as TVM prints it (JSON)
    target_host: str | None
    execution_backend: str
    pass_configs: tuple  # sorted (name, value) pairs, as normalized
    compile_flags: tuple | str | None
    args: tuple = ()  # the extra positional arguments of ``cached`` (part of the key as their repr)

    def cached_arguments(self) -> dict:
        """``KernelCache.cached``'s keyword arguments that reproduce the captured call."""
        from tvm.target import Target

        return {"target": Target(self.target),
                "target_host": Target(self.target_host) if self.target_host else None,
                "execution_backend": self.execution_backend, "pass_configs": dict(self.pass_configs),
                "compile_flags": list(self.compile_flags) if isinstance(self.compile_flags, tuple) else self.compile_flags}

    def is_built(self, cache=None) -> bool:
        """On disk in TileLang's kernel cache (``cache``: the server's ``KernelCache``, or TileLang's own)."""
        from .build import is_built

        return is_built(self, cache)


def legal_out_idx(func, out_idx):
    """``out_idx`` as TileLang's adapter leaves it: negative indices of a list counted from the end of the
    PrimFunc's parameters. The adapter rewrites the list it is given in place (the decorator's own), so
    without this a decorator's first compile is keyed with ``[-1]`` and every later one with ``[n - 1]``;
    jit_ahead passes the rewritten form from the start, in planning and in the server alike. An int is
    keyed as given (the adapter makes a new list of it)."""
    if not isinstance(out_idx, (list, tuple)):
        return out_idx
    count = len(func.params)
    return [count + i if isinstance(i, int) and -count <= i < 0 else i for i in out_idx]


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def request_for(cache, func, out_idx, args, *, target, target_host, execution_backend, pass_configs,
                compile_flags, backend_context, factory=None) -> TileLangCompileRequest:
    """The request of one ``KernelCache.cached(func, out_idx, *args, ...)`` call (``out_idx`` already
    legal), resolved the way that call resolves it before it computes its key. ``factory``: the
    ``@tilelang.jit`` function it came from, if any."""
    import tvm
    from tilelang import env
    from tilelang.backend.module import create_backend_context
    from tilelang.transform.pass_config import normalize_pass_configs

    pass_configs = normalize_pass_configs(pass_configs)
    if backend_context is None:
        backend_context = create_backend_context(target if target is not None else env.get_default_target(),
                                                 target_host,
                                                 execution_backend if execution_backend is not None
                                                 else env.get_default_execution_backend())
    resolved_target = backend_context.target
    resolved_host = backend_context.target_host
    backend = backend_context.execution_backend.name
    key = cache._generate_key(func=func, out_idx=out_idx, execution_backend=backend, args=args,
                              target=resolved_target, target_host=resolved_host, pass_configs=pass_configs,
                              compile_flags=compile_flags)
    if factory is not None:
        module, qualname = factory.__module__, factory.__qualname__
    else:
        attrs = func.attrs
        module, qualname = "tilelang", str(attrs["global_symbol"] if attrs and "global_symbol" in attrs else "main")
    return TileLangCompileRequest(
        key=key, module=module, qualname=qualname, func_json=tvm.ir.save_json(func), out_idx=_frozen(out_idx),
        target=str(resolved_target), target_host=str(resolved_host) if resolved_host else None,
        execution_backend=backend, pass_configs=tuple(sorted((pass_configs or {}).items())),
        compile_flags=_frozen(compile_flags), args=tuple(args))
