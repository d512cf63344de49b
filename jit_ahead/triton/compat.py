"""Differences between the supported Triton versions (3.6.x and 3.9.x) that jit_ahead must paper over."""
from __future__ import annotations

import functools

import triton.runtime.jit as triton_jit


def jit_function_ref(fn) -> dict:
    """How Triton 3.9 writes a JITFunction constexpr into specialization JSON."""
    return {"jit_function": f"{fn.module}:{fn.fn.__qualname__}"}


def _mentions(code, text: str) -> bool:
    """Whether a code object (or one nested in it, such as a comprehension) holds the constant ``text``."""
    return any(c == text or (hasattr(c, "co_consts") and _mentions(c, text)) for c in code.co_consts)


def patch_specialization_serializer() -> None:
    """Make 3.6's specialization JSON encode JITFunction constexprs the way 3.9 does.

    Triton 3.6 builds the JSON for the ``jit_cache_hook`` with ``json.dumps`` over the raw constexpr
    values, so with any hook installed, a launch that passes a ``@triton.jit`` function as an argument
    raises ``TypeError: Object of type JITFunction is not JSON serializable``. ``_call_hook`` looks the
    serializer up as a module global at call time, so wrapping it is enough. 3.9 needs nothing.
    """
    original = triton_jit.serialize_specialization_data
    if getattr(original, "_jit_ahead_tolerant", False) or _mentions(original.__code__, "jit_function"):
        return

    @functools.wraps(original)
    def tolerant(name, signature, constants, attrs, options, key, *rest):
        encoded = {k: jit_function_ref(v) if isinstance(v, triton_jit.JITFunction) else v
                   for k, v in constants.items()}
        return original(name, signature, encoded, attrs, options, key, *rest)

    tolerant._jit_ahead_tolerant = True
    triton_jit.serialize_specialization_data = tolerant


def restore_specialization_serializer() -> None:
    """Undo ``patch_specialization_serializer`` (with the hook it serves)."""
    current = triton_jit.serialize_specialization_data
    if getattr(current, "_jit_ahead_tolerant", False):
        triton_jit.serialize_specialization_data = current.__wrapped__
