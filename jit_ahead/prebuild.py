"""``jit-ahead build``: plan a model and build every variant it can launch within the limits, on a machine
without a GPU (an image build, a CI job), into Triton's cache folder, the saved plans' folder and, where
``JIT_AHEAD_STORE`` is set, the deployment's store. A server started on them (``JIT_AHEAD=1``) with the same
model, limits, libraries and GPU model plans nothing and compiles nothing.

The model is a local transformers model folder (its ``config.json``: the model is made on the meta device, as
``from_pretrained`` makes it, with no weight read) or ``module:function``, a function returning the model (for
models a server builds itself). ``--setup module:function`` runs first, as the server does before it builds
its model: a kernel library's patches (``liger_kernel.transformers:apply_liger_kernel_to_qwen3``).
"""
from __future__ import annotations

import importlib
import os

from .core.records import is_dotted_name


class BuildInputError(ValueError):
    """What the command was given cannot be used; the message says what and why."""


def entry_point(spec: str, what: str):
    """The object ``module:attribute`` names."""
    module, sep, name = spec.partition(":")
    if not sep or not is_dotted_name(module) or not all(part.isidentifier() for part in name.split(".")):
        raise BuildInputError(f"{what} {spec!r} is not module:function")
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise BuildInputError(f"{what} {spec!r}: {module} cannot be imported ({exc})") from None
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise BuildInputError(f"{what} {spec!r}: {module} has no {name}")
    if not callable(obj):
        raise BuildInputError(f"{what} {spec!r} is not callable")
    return obj


def run_setups(specs: list[str]) -> None:
    for spec in specs:
        entry_point(spec, "--setup")()


def make_model(spec: str):
    """The model ``spec`` names: a transformers model folder, made on meta, or ``module:function``'s result."""
    import torch

    if os.path.isdir(spec):
        if not os.path.isfile(os.path.join(spec, "config.json")):
            raise BuildInputError(f"{spec} is a folder without a config.json: not a transformers model folder")
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(spec)
        # from_pretrained gives the parameters the checkpoint's dtype, which its config names
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, **({"dtype": dtype} if dtype is not None else {}))
        return model.eval()  # as from_pretrained returns it
    if ":" not in spec:
        raise BuildInputError(f"{spec} is neither a folder nor module:function")
    model = entry_point(spec, "the model")()
    if not isinstance(model, torch.nn.Module):
        raise BuildInputError(f"the model {spec!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model
