"""Small layers and providers for the planning tests: a layer that launches one kernel over its tokens,
its provider, and a gate that planner processes see too."""
import threading

import torch

from jit_ahead.core.priority import Priority
from jit_ahead.providers import PlannedLaunch, Provider

from .kernels import basic as k


class ScaleLayer(torch.nn.Module):
    """A layer whose forward launches tests.kernels.scale_kernel over its tokens."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        block = 1024 if self.hidden >= 1024 else 256
        k.scale_kernel[(triton_cdiv(n, block),)](x, x, n, 0.5, BLOCK=block)
        return x


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


class ScaleProvider(Provider):
    """A provider for ScaleLayer: every token count up to max_num_tokens, CUDA-graph sizes first."""

    name = "test-scale"
    library = "tests"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def find_layers(self, model):
        if self.gate is not None:
            self.gate.wait(30)  # stands in for a slow model walk: plan_model must not block on it
        return [m for m in model.modules() if isinstance(m, ScaleLayer)]

    def launches(self, layers, limits):
        for layer in {layer.hidden: layer for layer in layers}.values():
            for dtype in limits.torch_dtypes():
                for tokens in range(1, limits.max_num_tokens + 1):
                    x = torch.empty(tokens, layer.hidden, device="meta", dtype=dtype)
                    warm = tokens in limits.cuda_graph_batch_sizes
                    yield PlannedLaunch(Priority.WARMUP if warm else Priority.BACKGROUND,
                                        lambda layer=layer, x=x: layer(x), f"{layer.hidden}x{tokens}")


class BrokenProvider(ScaleProvider):
    name = "test-broken"

    def launches(self, layers, limits):
        raise RuntimeError("this library changed its API")


def model():
    return torch.nn.Sequential(ScaleLayer(1024), ScaleLayer(1000), ScaleLayer(1024))


class FileGate:
    """A gate that planner processes (forks of this one) see opened too: a file that appears."""

    def __init__(self, path) -> None:
        self.path = path

    def set(self) -> None:
        self.path.touch()

    def wait(self, timeout: float) -> bool:
        import time

        deadline = time.monotonic() + timeout
        while not self.path.exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def _logged_launch(log_path, pause: float, run, label: str):
    with open(log_path, "a") as f:  # one line per launch run, from whichever process runs it
        f.write(label + "\n")
    if pause:
        import time

        time.sleep(pause)
    return run()


class LoggedProvider(ScaleProvider):
    """ScaleProvider that writes each launch it runs to a file (planners are forked processes) and may
    take ``pause`` seconds per launch: a planning long enough to be stopped halfway."""

    name = "test-logged"

    def __init__(self, log_path, pause: float = 0.0) -> None:
        super().__init__()
        self.log_path, self.pause = str(log_path), pause

    def launches(self, layers, limits):
        import functools

        for launch in super().launches(layers, limits):
            yield PlannedLaunch(launch.priority,
                                functools.partial(_logged_launch, self.log_path, self.pause, launch.run, launch.label),
                                launch.label)
