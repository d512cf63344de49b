"""Faster meta results for the two torch calls that dominate a planned forward, in planner processes.

On meta tensors torch computes ``torch.empty_like`` through its Python reference (a stride permutation
worked out in Python for every call) and ``F.linear`` through a decomposition into reshapes and a
Python ``mm`` meta kernel. A planner runs thousands of layer forwards that make these calls on plain,
contiguous meta tensors, where the result is known without any of that: a new contiguous meta tensor of
the right shape and dtype. ``install()`` replaces the two functions with versions that return exactly
that in those cases and call torch's own function in every other one (other devices, strides, dtypes
or arguments, autograd, tensor subclasses, or any torch function or dispatch mode active).

Autocast never applies to meta tensors, so it changes neither. Only a planner process installs them
(``Session.plan_model``'s planner entry): it is a fork of the server that runs nothing but planning, so
no thread of the server ever calls the replacements.
tests/test_meta_shortcuts.py checks every shortcut result against torch's own, stride by stride.
"""
from __future__ import annotations

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_installed: dict[str, object] = {}


def _canonical(tensor: torch.Tensor) -> bool:
    """A plain meta tensor with exactly the strides ``torch.empty`` gives its shape."""
    if not tensor.is_meta or type(tensor) not in _PLAIN:
        return False
    expected = 1
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride())):
        if stride != expected:
            return False
        expected *= size
    return True


def _modes_active() -> bool:
    return torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0


def _grad_needed(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def empty_like(input, *args, **kwargs):
    """``torch.empty_like(input[, dtype=])`` of a canonical meta tensor: ``torch.empty`` of its shape."""
    if not args and kwargs.keys() <= {"dtype"} and isinstance(input, torch.Tensor) and _canonical(input) \
            and not _modes_active():
        return torch.empty(input.shape, dtype=kwargs.get("dtype") or input.dtype, device="meta")
    return _installed["empty_like"](input, *args, **kwargs)


def linear(input, weight, bias=None):
    """``F.linear`` of canonical meta tensors of one dtype, ``weight`` 2-D and matching: the output shape,
    contiguous. Everything else (a shape mismatch included: torch raises its own error) goes to torch."""
    if (isinstance(input, torch.Tensor) and isinstance(weight, torch.Tensor) and input.dim() >= 1
            and weight.dim() == 2 and input.shape[-1] == weight.shape[1] and input.dtype == weight.dtype
            and _canonical(input) and _canonical(weight)
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.dim() == 1 and bias.dtype == input.dtype
                                  and bias.shape[0] == weight.shape[0] and _canonical(bias)))
            and not _grad_needed(input, weight, bias) and not _modes_active()):
        return torch.empty((*input.shape[:-1], weight.shape[0]), dtype=input.dtype, device="meta")
    return _installed["linear"](input, weight, bias)


def install() -> None:
    """Replace ``torch.empty_like`` and ``torch.nn.functional.linear`` in this process (a planner's).
    Idempotent."""
    if _installed:
        return
    _installed["empty_like"] = torch.empty_like
    _installed["linear"] = torch.nn.functional.linear
    torch.empty_like = empty_like
    torch.nn.functional.linear = linear


def uninstall() -> None:
    """Put torch's own functions back (tests)."""
    if not _installed:
        return
    torch.empty_like = _installed.pop("empty_like")
    torch.nn.functional.linear = _installed.pop("linear")
