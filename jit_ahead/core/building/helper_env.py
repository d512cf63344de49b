"""The environment a helper process starts with.

Helpers inherit the server's environment so that every cache-invalidating variable is exactly the
server's, with four kinds of changes: no GPU is visible, launcher variables that could make the helper
join the job (MPI, PMI, Slurm, UCX, torch.distributed) are removed, CPU thread pools are limited to one
thread, and family-specific overrides such as the absolute cache directory are applied.
"""
from __future__ import annotations

import subprocess
from collections.abc import Mapping

_SCRUBBED_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "UCX_", "I_MPI_", "MPI_", "MV2_", "HYDRA_",
                      "TORCHELASTIC_")
_SCRUBBED_NAMES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                             "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "PMI_FD", "PMI_RANK", "PMI_SIZE"})
_HIDDEN_DEVICES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
SINGLE_THREADED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# Set in every helper: the start-up switch must never start a pool inside a helper.
HELPER_MARKER = "JIT_AHEAD_HELPER"


def start_helper_process(python: str, entry: str, fds: tuple[int, ...], env: dict[str, str]) -> subprocess.Popen:
    """``python -m entry FD...`` with the helper environment: the descriptors passed, no stdin, prints to
    stderr (never the server's stdout), in its own session (a Ctrl-C to the server's terminal is the
    server's to handle). Raises OSError if it cannot be started."""
    return subprocess.Popen([python, "-m", entry, *map(str, fds)], pass_fds=fds, env=env, stdin=subprocess.DEVNULL,
                            stdout=2, start_new_session=True)


def is_scrubbed(name: str) -> bool:
    return name in _SCRUBBED_NAMES or name.startswith(_SCRUBBED_PREFIXES)


def helper_environment(base: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not is_scrubbed(k)}
    for name in _HIDDEN_DEVICES:
        env[name] = ""
    # Helpers compile single-threaded; a library that runs a torch op at import would otherwise start a
    # thread pool per CPU in each helper (and in the fork server, whose forks then hold a stale pool).
    for name in SINGLE_THREADED:
        env[name] = "1"
    env["JIT_AHEAD"] = "0"
    env[HELPER_MARKER] = "1"
    env.update(overrides)
    return env
