"""Planning by capture: inside ``with capture()``, an op that asks FlashInfer for a module it would build
(``JitSpec.build_and_load``) records the module as a request and stops there (``Captured``): the spec was
made by FlashInfer's own ``gen_*_module`` (its generated sources are written), nothing is built, and the
op's ``functools.cache`` keeps nothing. ``planned_call(op, *args)`` runs one op so in a provider's launch."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..core.shared_patch import VariantsFound, capturing_into
from . import hook
from .hook import Captured

__all__ = ["Captured", "capture", "planned_call"]


@contextlib.contextmanager
def capture(target=None) -> Iterator[VariantsFound]:
    """Record the FlashInfer modules this context's ops ask for; each ask raises ``Captured``. ``target`` is
    unused: FlashInfer's target archs are its own (the device's, or ``FLASHINFER_CUDA_ARCH_LIST``)."""
    with capturing_into(hook, VariantsFound()) as plan:
        yield plan


def planned_call(op, *args, **kwargs) -> None:
    """One call of a FlashInfer op inside the caller's capture; a module this process has already is no
    error."""
    try:
        op(*args, **kwargs)
    except Captured:
        pass
