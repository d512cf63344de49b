"""What a FlashInfer JIT module is, as FlashInfer describes it, and the request that builds it ahead.

FlashInfer's ops get each module from a ``gen_*_module(...)`` function of theirs: a ``JitSpec`` (its name,
sources and compiler flags), whose ``build_and_load`` runs ninja in the module's folder of FlashInfer's JIT
folder (``~/.cache/flashinfer/<version>/<archs>/cached_ops/<name>``), then loads ``<name>.so``. The request
carries the spec's own fields, so a helper makes the same spec again and builds it with FlashInfer's own
``JitSpec.build`` (its ninja file, its lock); the sources it names (FlashInfer's, or generated into its
folder when the spec was made) are on this machine's disk. The key covers every field and the JIT folder
(FlashInfer's version and the target archs): a module built is stamped with it, and a module whose stamp
differs is not taken as built.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.requests import VariantBase

FAMILY = "flashinfer"
STAMP = "jit_ahead.json"  # in the module's folder, written once its build succeeded


class Unsupported(TypeError):
    """A spec jit_ahead cannot carry to a helper (a field that is a function or a mapping): FlashInfer's."""


def _plain(value):
    """A spec field as JSON (paths marked, so that they come back as paths)."""
    if isinstance(value, Path):
        return {"path": str(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise Unsupported(f"a field of type {type(value).__name__}")


def _restored(value):
    if isinstance(value, dict) and set(value) == {"path"}:
        return Path(value["path"])
    if isinstance(value, list):
        return [_restored(v) for v in value]
    return value


@dataclass(frozen=True)
class FlashInferModule(VariantBase):
    family = FAMILY
    build_modules = ()  # helpers import FlashInfer at start; the spec is in the request
    name: str  # the module's name: its folder and library
    spec_class: str  # "module:Class" of the spec (FlashInfer's JitSpec)
    fields: str  # the spec's fields, as JSON (an object)
    jit_dir: str  # FlashInfer's JIT folder in the process that made the spec
    version: str  # FlashInfer's

    module = "flashinfer.jit"
    qualname = property(lambda self: self.name)

    @classmethod
    def of(cls, spec) -> "FlashInferModule":
        """The module of an nvcc spec (one with a JIT library and plain fields); ``Unsupported`` otherwise."""
        from flashinfer import __version__
        from flashinfer.jit import env

        kind = type(spec)
        if not dataclasses.is_dataclass(spec) or not hasattr(spec, "jit_library_path"):
            raise Unsupported(f"a {kind.__name__}, not an nvcc module")
        fields = json.dumps({f.name: _plain(getattr(spec, f.name)) for f in dataclasses.fields(spec)})
        return cls(spec.name, f"{kind.__module__}:{kind.__qualname__}", fields, str(env.FLASHINFER_JIT_DIR),
                   __version__)

    @property
    def key(self) -> str:
        text = json.dumps([self.name, self.spec_class, self.fields, self.jit_dir, self.version])
        return hashlib.sha256(text.encode()).hexdigest()

    def spec(self):
        """The same ``JitSpec``, made again in this process."""
        import importlib

        module, _, kind = self.spec_class.partition(":")
        fields = {field: _restored(value) for field, value in json.loads(self.fields).items()}
        return getattr(importlib.import_module(module), kind)(**fields)

    @property
    def folder(self) -> str:
        return os.path.join(self.jit_dir, self.name)

    @property
    def library(self) -> str:
        return os.path.join(self.folder, f"{self.name}.so")

    def is_built(self) -> bool:
        """Its library is there, stamped by a build of this very request."""
        from ..core.building.shared_files import Unusable, read_json

        if not os.path.exists(self.library):
            return False
        try:
            stamp = read_json(os.path.join(self.folder, STAMP), 4096)
        except Unusable:  # damaged: built again, which writes it anew
            return False
        return isinstance(stamp, dict) and stamp.get("key") == self.key
