"""Turning Triton's specialization JSON back into compile inputs, and predicting the disk hash.

Both the launching process (prediction) and the helpers (building) use these functions, and both go
through Triton's own ``ASTSource``, ``make_backend``, ``parse_options``, ``get_cache_key`` and cache
manager: the hash is computed the way ``triton.compile()`` computes it, never re-derived by hand.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
from typing import Any

import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_key, get_cache_manager
from triton.runtime.jit import JITFunction


class KernelNotImportable(RuntimeError):
    pass


def unwrap_jit_function(obj: Any) -> JITFunction | None:
    """The JITFunction under autotune/heuristics wrappers, or None."""
    seen = 0
    while obj is not None and not isinstance(obj, JITFunction) and seen < 16:
        obj = getattr(obj, "fn", None)
        seen += 1
    return obj if isinstance(obj, JITFunction) else None


def not_importable(module: str, qualname: str) -> str | None:
    """Why a helper could not import this kernel by name, or None."""
    if module == "__main__":
        return (f"kernel {qualname} is defined in __main__, which a helper cannot import; move it into a "
                "module to build it ahead")
    if "<locals>" in qualname:
        return f"kernel {module}.{qualname} is defined inside a function; a helper cannot import it"
    return None


def resolve_kernel(module: str, qualname: str) -> JITFunction:
    """Import the kernel a request names: the module attribute, or any JITFunction with that qualname."""
    reason = not_importable(module, qualname)
    if reason:
        raise KernelNotImportable(reason)
    mod = importlib.import_module(module)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    found = unwrap_jit_function(obj)
    if found is not None and found.fn.__qualname__ == qualname:
        return found
    # Kernels bound under another name (``kernel = triton.jit(_impl)``): scan the module.
    for value in vars(mod).values():
        found = unwrap_jit_function(value)
        if found is not None and found.fn.__qualname__ == qualname and found.module == module:
            return found
    raise KernelNotImportable(f"no @triton.jit kernel {qualname} in module {module}")


def _tuplify(value: Any) -> Any:
    # JSON turns tuples into lists; Triton never takes lists in signatures or constexprs.
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def _decode_constant(value: Any) -> Any:
    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict):
        if "constexpr" in value:
            return tl.constexpr(_tuplify(value["constexpr"]))
        if "jit_function" in value:
            module, _, qualname = value["jit_function"].partition(":")
            return resolve_kernel(module, qualname)
    return _tuplify(value)


def decode_options(spec: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}


def compile_inputs(kernel: JITFunction, spec: dict) -> tuple[ASTSource, dict]:
    """The ``ASTSource`` and options dict that ``triton.compile`` takes, decoded as ``preload()`` does."""
    signature = {k: _tuplify(v) for k, v in spec["signature"].items()}
    constexprs = {tuple(k): _decode_constant(v) for k, v in zip(spec["constant_keys"], spec["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])}
    options = decode_options(spec)
    # The libdevice path is absolute but only its content is hashed; a helper on another install layout
    # uses its own copy of the same file.
    libs = options.get("extern_libs")
    if libs and not all(os.path.exists(path) for _, path in libs):
        options.pop("extern_libs")
    return ASTSource(kernel, signature, constexprs, attrs), options


def predict_hash(src: ASTSource, target: GPUTarget, options: dict, env_vars: dict[str, str]) -> str:
    """The hash ``triton.compile(src, target=target, options=options)`` will use, by Triton's own key."""
    backend = make_backend(target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=env_vars)
    inspection_hook = getattr(knobs.runtime, "add_stages_inspection_hook", None)  # 3.9 adds it to the key
    if inspection_hook is not None:
        key += inspection_hook()[0]
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def cache_file_stem(kernel_name: str) -> str:
    return kernel_name[:150]  # compile() truncates the same way


def on_disk(predicted_hash: str, kernel_name: str) -> bool:
    """Whether Triton's cache manager has a complete entry for this hash (what compile() checks)."""
    metadata_file = f"{cache_file_stem(kernel_name)}.json"
    try:
        group = get_cache_manager(predicted_hash).get_group(metadata_file) or {}
    except (OSError, ValueError, AttributeError):  # 3.6 raises on a corrupt group file: that is a miss
        return False
    return group.get(metadata_file) is not None


def target_tuple(target: GPUTarget) -> tuple[str, int, int]:
    return (target.backend, int(target.arch), int(target.warp_size))


def spec_json(specialization_data: str) -> dict:
    return json.loads(specialization_data)

