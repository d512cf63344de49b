"""From a real ``cute.compile`` call to its build request, for planning's capture and the executor's misses.

The request is taken from the call itself: the ``@cute.jit`` function (module and qualified name, which
must resolve to the very object called, so a helper builds the same code), the specs of its arguments,
the options string, and the arch of the server's GPU (its device view). Nothing is compiled to find it.
"""
from __future__ import annotations

import inspect

from .build import make_request
from .request import CuteCompileRequest, resolve
from .arg_specs import UnsupportedCall, specs_of


def request_from_call(compile_callable, func, args, kwargs, arch: str) -> CuteCompileRequest:
    """The build request of ``cute.compile(func, *args, **kwargs)``; UnsupportedCall says why there is none."""
    import cutlass.cute as cute

    if compile_callable is not cute.compile:
        raise UnsupportedCall("cute.compile[...] with bracket options is compiled in place")
    extra = set(kwargs) - {"options"}
    if extra:
        raise UnsupportedCall(f"cute.compile keyword(s) {', '.join(sorted(extra))} are compiled in place")
    options = kwargs.get("options") or ""
    if not isinstance(options, str):
        raise UnsupportedCall("options other than a string are compiled in place")
    if not inspect.isfunction(func):
        raise UnsupportedCall(f"{type(func).__qualname__} is not a module-level @cute.jit function")
    module, qualname = func.__module__, func.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        raise UnsupportedCall(f"{module}.{qualname} cannot be imported by a helper")
    try:
        same = resolve(module, qualname) is func
    except (ImportError, AttributeError):
        same = False
    if not same:
        raise UnsupportedCall(f"{module}.{qualname} does not name the function called")
    return make_request(module, qualname, specs_of(args), arch=arch, options=options)
