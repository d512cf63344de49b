"""Arguments of a ``cute.compile`` call and their specs, both ways.

``specs_of`` turns the representative arguments a caller passes (fake tensors, fake streams, CUTLASS
scalars, Python constants, ``None``) into ``ArgSpec``s that pickle and hash; ``fake_args`` rebuilds
equivalent arguments from them in a helper. A symbol shared by two places of the call (the batch extent
of an input and of its output) stays shared: symbols are numbered by first appearance.
"""
from __future__ import annotations

from .request import ArgSpec, ConstSpec, ScalarSpec, StreamSpec, SymSpec, TensorSpec


class UnsupportedCall(ValueError):
    """A ``cute.compile`` call jit_ahead cannot describe as a build request; it compiles in place."""


def specs_of(args) -> tuple[ArgSpec, ...]:
    """The specs of a call's arguments; UnsupportedCall names the first argument that has none."""
    import cutlass
    from cutlass.cute.runtime import _FakeTensor
    from cutlass.cute.typing import SymInt

    symbols: dict[int, SymSpec] = {}  # id(SymInt) -> its spec; the call's arguments keep them alive

    def extent(value):
        if isinstance(value, SymInt):
            spec = symbols.get(id(value))
            if spec is None:
                spec = symbols[id(value)] = SymSpec(len(symbols), value.width, value.divisibility, value.symbol)
            return spec
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        raise UnsupportedCall(f"extent {value!r} is neither an int nor a cute.sym_int")

    def one(index: int, arg) -> ArgSpec:
        if arg is None or isinstance(arg, (bool, int, float, str)):
            return ConstSpec(arg)
        if isinstance(arg, _FakeTensor):
            return TensorSpec(arg.element_type.__name__, tuple(extent(e) for e in arg.shape),
                              memspace=arg.memspace.name, assumed_align=arg._assumed_align,
                              stride=tuple(extent(s) for s in arg.stride), use_32bit_stride=arg._use_32bit_stride)
        if type(arg).__name__ == "_FakeStream":
            return StreamSpec(bool(getattr(arg, "use_tvm_ffi_env_stream", False)))
        if isinstance(arg, cutlass.Numeric) and hasattr(cutlass, type(arg).__name__):
            return ScalarSpec(type(arg).__name__)
        raise UnsupportedCall(f"argument {index} is a {type(arg).__module__}.{type(arg).__qualname__}; only fake "
                              "tensors and streams (cute.runtime.make_fake_*), CUTLASS scalars, Python "
                              "constants and None are planned")

    return tuple(one(i, arg) for i, arg in enumerate(args))


def fake_args(specs) -> list:
    """Arguments for ``cute.compile`` equivalent to those the specs were taken from."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.base_dsl.enums import AddressSpace
    from cutlass.cute.runtime import _FakeTensor, make_fake_compact_tensor, make_fake_stream

    symbols: dict[int, object] = {}

    def extent(value, spec: TensorSpec):
        if value is None:
            return cute.sym_int32(divisibility=spec.divisibility)
        if isinstance(value, SymSpec):
            if value.slot not in symbols:
                symbols[value.slot] = cute.sym_int(value.width, divisibility=value.divisibility, symbol=value.symbol)
            return symbols[value.slot]
        return value

    out = []
    for spec in specs:
        if isinstance(spec, TensorSpec):
            dtype, memspace = getattr(cutlass, spec.dtype), AddressSpace[spec.memspace]
            shape = tuple(extent(e, spec) for e in spec.shape)
            if spec.stride is None:
                out.append(make_fake_compact_tensor(dtype, shape, stride_order=spec.stride_order, memspace=memspace,
                                                    assumed_align=spec.assumed_align,
                                                    use_32bit_stride=spec.use_32bit_stride))
            else:  # the exact tensor the spec was taken from (make_fake_tensor has no use_32bit_stride)
                out.append(_FakeTensor(dtype, shape, stride=tuple(extent(s, spec) for s in spec.stride),
                                       memspace=memspace, assumed_align=spec.assumed_align,
                                       use_32bit_stride=spec.use_32bit_stride))
        elif isinstance(spec, StreamSpec):
            out.append(make_fake_stream(use_tvm_ffi_env_stream=spec.use_tvm_ffi_env_stream))
        elif isinstance(spec, ConstSpec):
            out.append(spec.value)
        elif isinstance(spec, ScalarSpec):
            out.append(getattr(cutlass, spec.dtype)(0))
        else:
            raise TypeError(f"not a CuTe DSL argument spec: {spec!r}")
    return out
