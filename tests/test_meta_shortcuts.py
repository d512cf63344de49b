"""Planner processes' meta shortcuts (providers/meta_shortcuts.py): every result equals torch's own, and a
planned forward launches the same variants with them as without."""
import itertools
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.providers import meta_shortcuts
from jit_ahead.providers.fla import FlaGatedDeltaNetProvider
from jit_ahead.triton import capture


@pytest.fixture
def shortcuts():
    meta_shortcuts.install()
    try:
        yield meta_shortcuts._installed
    finally:
        meta_shortcuts.uninstall()


def _meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _tensors():
    """Canonical ones, and every way a meta tensor can differ from one: views with other strides,
    size-1 and size-0 dimensions with any stride, expanded, channels-last, 0-d, subclasses, other devices."""
    yield _meta((4, 7, 64))
    yield _meta((1, 1, 512), torch.float32)
    yield _meta((3, 0, 8))
    yield _meta(())
    yield _meta((5, 6)).t()
    yield _meta((4, 8, 16))[:, ::2]
    yield _meta((4, 8, 16))[..., :8]
    yield torch.empty_strided((2, 1, 8), (8, 3, 1), dtype=torch.float16, device="meta")  # contiguous, odd stride
    yield torch.empty_strided((2, 0, 8), (1, 7, 3), device="meta")
    yield _meta((1, 8)).expand(6, 8)
    yield _meta((2, 3, 4, 5)).to(memory_format=torch.channels_last)
    yield torch.nn.Parameter(_meta((16, 32)), requires_grad=False)
    yield torch.nn.Parameter(_meta((16, 32)))
    yield torch.empty(3, 4)  # host


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (type(a), a.shape, a.stride(), a.dtype, a.device, a.requires_grad, a.storage_offset()) == (
        type(b), b.shape, b.stride(), b.dtype, b.device, b.requires_grad, b.storage_offset())


def test_empty_like_equals_torch_for_every_kind_of_tensor(shortcuts):
    for tensor, kwargs in itertools.product(_tensors(), ({}, {"dtype": torch.float32}, {"dtype": None},
                                                         {"memory_format": torch.contiguous_format},
                                                         {"requires_grad": True})):
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                _same(torch.empty_like(tensor, **kwargs), shortcuts["empty_like"](tensor, **kwargs))


def test_linear_equals_torch_for_every_kind_of_input_weight_and_bias(shortcuts):
    weights = [_meta((24, 64)), _meta((64, 24)).t(), _meta((24, 64), torch.float32),
               torch.nn.Parameter(_meta((24, 64))), torch.nn.Parameter(_meta((24, 64)), requires_grad=False)]
    biases = [None, _meta((24,)), _meta((24,), torch.float32), _meta((48,))[::2]]
    inputs = [_meta((3, 5, 64)), _meta((64,)), _meta((7, 64)), _meta((2, 0, 64)), _meta((5, 3, 64)).transpose(0, 1),
              torch.empty_strided((4, 1, 64), (64, 5, 1), dtype=torch.bfloat16, device="meta"),
              _meta((2, 3, 64), torch.float16)]
    checked = 0
    for x, w, b in itertools.product(inputs, weights, biases):
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                try:
                    expected = shortcuts["linear"](x, w, b)
                except RuntimeError as exc:
                    with pytest.raises(RuntimeError, match=re.escape(str(exc))):
                        torch.nn.functional.linear(x, w, b)
                    continue
                _same(torch.nn.functional.linear(x, w, b), expected)
                checked += 1
    assert checked > 100
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast never applies to meta tensors
        x, w = _meta((3, 64), torch.float32), _meta((24, 64), torch.float32)
        _same(torch.nn.functional.linear(x, w), shortcuts["linear"](x, w))
    with pytest.raises(RuntimeError):  # a mismatch raises torch's own error
        torch.nn.functional.linear(_meta((3, 63)), _meta((24, 64)))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_an_active_dispatch_mode_sees_the_ops_torch_makes():
    x, w = _meta((3, 5, 64)), _meta((24, 64))

    def ops():
        with _Ops() as mode:
            torch.empty_like(x)
            torch.nn.functional.linear(x, w)
        return mode.seen

    plain = ops()
    meta_shortcuts.install()
    try:
        assert ops() == plain
    finally:
        meta_shortcuts.uninstall()


def test_a_planned_gated_deltanet_layer_launches_the_same_variants_with_the_shortcuts():
    model = demo_models.fla_gated_deltanet()
    provider = FlaGatedDeltaNetProvider()
    limits = EngineLimits(max_num_tokens=300, max_batch_size=3, max_seq_len=200, cuda_graph_batch_sizes=(1, 2))
    sites = provider.find_layers(model)
    listed = list(provider.launches(sites, limits))
    launches = [launch for launch in listed if "decode" in launch.label] + listed[::7]
    assert any("padded" in launch.label for launch in launches) and any("decode" in launch.label for launch in launches)

    def variants():
        with capture() as plan:
            for launch in launches:
                launch.run()
        return {r.predicted_hash for r in plan.requests}

    plain = variants()
    meta_shortcuts.install()
    try:
        assert torch.empty_like is meta_shortcuts.empty_like
        short = variants()
    finally:
        meta_shortcuts.uninstall()
    assert torch.empty_like is not meta_shortcuts.empty_like
    assert short == plain and len(plain) > 20


def test_the_shortcuts_answer_plain_meta_calls_without_torch(shortcuts):
    def torch_called(*args, **kwargs):
        raise AssertionError("torch's own function was called")

    originals = dict(shortcuts)
    shortcuts.update(empty_like=torch_called, linear=torch_called)
    try:
        x, w, b = _meta((2, 9, 64)), torch.nn.Parameter(_meta((24, 64)), requires_grad=False), _meta((24,))
        with torch.no_grad():
            _same(torch.empty_like(x, dtype=torch.float32), _meta((2, 9, 64), torch.float32))
            _same(torch.nn.functional.linear(x, w, b), _meta((2, 9, 24)))
            _same(torch.nn.Linear(64, 24, device="meta", dtype=torch.bfloat16)(x), _meta((2, 9, 24)))
        with pytest.raises(AssertionError, match="own function"):  # a mode active: torch's own
            with _Ops():
                torch.empty_like(x)
    finally:  # before the fixture puts torch's functions back from this table
        shortcuts.update(originals)
