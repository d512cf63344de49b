"""meta_stands_for_the_gpu: a gated modeling function takes the kernel path for meta inputs in a planning
thread only; every other thread, at the same moment, sees the devices transformers listed."""
import sys
import threading
import types

import pytest
import torch

from jit_ahead.providers import device_gates
from jit_ahead.providers.device_gates import meta_stands_for_the_gpu


def gate(kernel, reference, supported_devices=("cuda", "xpu")):
    """The shape of transformers' ``use_kernel_func_from_hub_with_fallback`` wrapper: the devices the kernel
    library runs on in the closure (None: no check), the reference for inputs anywhere else."""
    def wrapped(x):
        if supported_devices is not None and x.device.type not in supported_devices:
            return reference(x)
        return kernel(x)
    return wrapped


def as_func_module(function):
    """The shape of the ``kernels`` package's ``Func``: a module whose class's forward calls the function."""
    class Func(torch.nn.Module):
        def forward(self, *args):
            return function(*args)
    return Func()


@pytest.fixture
def modeling(monkeypatch):
    """A fake ``transformers.models`` modeling module holding a gated function, plain and as a module."""
    module = types.ModuleType("transformers.models.jit_ahead_gate_test.modeling")
    module.chunk_rule = gate(lambda x: "kernel", lambda x: "reference")
    module.ChunkRule = as_func_module(gate(lambda x: "kernel", lambda x: "reference"))
    module.untouched = gate(lambda x: "kernel", lambda x: "reference", supported_devices=None)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_a_planning_thread_takes_meta_as_the_gpu_while_another_thread_does_not(modeling):
    meta = torch.empty(2, device="meta")
    calls = (lambda: modeling.chunk_rule(meta), lambda: modeling.ChunkRule(meta))
    assert [call() for call in calls] == ["reference", "reference"]  # transformers' own answer on meta
    inside, other_seen = threading.Event(), []

    def other_thread():
        inside.wait(10)
        other_seen.extend(call() for call in calls)

    thread = threading.Thread(target=other_thread)
    thread.start()
    with meta_stands_for_the_gpu():
        inside.set()
        thread.join(10)
        planned = [call() for call in calls]
        with meta_stands_for_the_gpu():  # nested: still open, and still open after the inner block
            assert [call() for call in calls] == ["kernel", "kernel"]
        assert [call() for call in calls] == ["kernel", "kernel"]
    assert planned == ["kernel", "kernel"]
    assert other_seen == ["reference", "reference"]
    assert [call() for call in calls] == ["reference", "reference"]  # after the block, in this thread
    # the devices transformers listed are kept: a CPU input still takes the reference
    with meta_stands_for_the_gpu():
        assert modeling.chunk_rule(torch.empty(2)) == "reference"


def test_gates_of_modules_imported_later_are_opened_and_nothing_else_is_touched(modeling, monkeypatch):
    with meta_stands_for_the_gpu():
        pass
    late = types.ModuleType("transformers.models.jit_ahead_gate_test.late")
    late.rule = gate(lambda x: "kernel", lambda x: "reference")
    monkeypatch.setitem(sys.modules, late.__name__, late)
    elsewhere = types.ModuleType("not_transformers_gate_test")
    elsewhere.rule = gate(lambda x: "kernel", lambda x: "reference")
    monkeypatch.setitem(sys.modules, elsewhere.__name__, elsewhere)
    meta = torch.empty(1, device="meta")
    with meta_stands_for_the_gpu():
        assert late.rule(meta) == "kernel"
        assert elsewhere.rule(meta) == "reference"  # only transformers' modeling modules are opened
        assert modeling.untouched(meta) == "kernel"  # no library devices (None): left as it was
    monkeypatch.setattr(device_gates, "_scanned_modules", 0)  # a full rescan
    assert device_gates.open_gates() == 0  # each function is opened once


def closure_of(function) -> dict:
    """A function's closure variables by name, empty cells left out."""
    variables = {}
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        try:
            variables[name] = cell.cell_contents
        except ValueError:
            pass
    return variables


def test_transformers_gated_functions_are_found_where_transformers_has_them():
    """A canary for transformers' own decorator: its wrapped functions keep the devices in a closure
    variable of the name the gate opener reads, so a rename in a later release fails here."""
    hub_kernels = pytest.importorskip("transformers.integrations.hub_kernels")
    decorator = getattr(hub_kernels, "use_kernel_func_from_hub_with_fallback", None)
    if decorator is None:
        pytest.skip("this transformers release has no device-gated kernel functions")
    pytest.importorskip("fla")

    def reference(x):
        return "reference"

    module = types.ModuleType("transformers.models.jit_ahead_gate_test.real")
    module.rule = decorator("chunk_gated_delta_rule", "fla")(reference)
    sys.modules[module.__name__] = module
    try:
        assert device_gates.open_gates() >= 1
        gated = [f for f in device_gates._functions_reached(module.rule)
                 if isinstance(closure_of(f).get("supported_devices"), device_gates.PlanningDevices)]
        assert gated, "transformers' wrapper holds no opened supported_devices"
        devices = closure_of(gated[0])
        assert "meta" not in devices["supported_devices"]  # outside a planning thread
        with meta_stands_for_the_gpu():
            assert "meta" in devices["supported_devices"]
    finally:
        del sys.modules[module.__name__]
