"""Rebuilding a DeepGEMM kernel from its record, in a process with neither a GPU nor DeepGEMM's ``_C``.

A record is what DeepGEMM itself leaves in a cache entry: the kernel source (``kernel.cu``) and
``meta.json`` (the nvcc command, the runtime's configuration, the full ``nvcc --version`` text and the
compiler options), under the entry's name ``<kernel name>.<key>``. A rebuild runs only where it would give
the very entry the server's DeepGEMM looks for: this machine's ``nvcc --version`` text must be the
recorded one, and the key recomputed over the record with this machine's DeepGEMM headers must be the
recorded key (a changed header changes it). Then nvcc runs with the recorded flags and this machine's
include paths (at the calling process's priority: a helper's is the lowest), and the entry is published
as DeepGEMM publishes its own.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import disk_cache
from .key import SourceDigest, cache_key

FAMILY = "deep_gemm"  # the family's name, which its build requests carry
SOURCE = "kernel.cu"
CUBIN = disk_cache.CUBIN
META = disk_cache.META


class RebuildRefused(RuntimeError):
    """The record cannot give the server's entry here (another nvcc, other headers, a post hook)."""


@dataclass(frozen=True)
class RecordedKernel:
    name: str  # DeepGEMM's kernel name (the entry's tag)
    key: str
    source: str
    meta: dict

    @classmethod
    def from_entry(cls, folder: Path) -> "RecordedKernel":
        """The record held by a cache entry folder ``<name>.<key>``."""
        name, _, key = folder.name.rpartition(".")
        if not name or not key:
            raise ValueError(f"{folder} is not named <kernel name>.<key>")
        meta = json.loads((folder / META).read_text())
        return cls(name, key, (folder / SOURCE).read_text(), meta)

    # how the stats log and the coverage report name it: kernel deep_gemm.<name>
    module = "deep_gemm"

    @property
    def qualname(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        return f"deep_gemm {self.name}.{self.key[:12]}"

    @property
    def nvcc_version(self) -> str:
        return self.meta["compiler_info"]["version"]

    @property
    def signature(self) -> str:
        return self.meta["config"]["extra_signature"]

    @property
    def options(self) -> dict:
        return self.meta["compiler_options"]

    def to_json(self) -> dict:
        return {"name": self.name, "key": self.key, "source": self.source, "meta": self.meta}

    @classmethod
    def from_json(cls, entry: dict) -> "RecordedKernel":
        return cls(str(entry["name"]), str(entry["key"]), str(entry["source"]), dict(entry["meta"]))

    # -- the variant (core/requests.py) ------------------------------------------------------------------------
    @property
    def entry(self) -> str:
        """The family's artifact key: DeepGEMM's entry name."""
        return disk_cache.entry_name(self.name, self.key)

    def build_request(self):
        from ..core.requests import BuildRequest

        return BuildRequest(family=FAMILY, key=self.entry, payload=self, label=self.label)

    def is_built(self) -> bool:
        return disk_cache.find(disk_cache.cache_roots(), self.name, self.key) is not None


def nvcc_flags(options: dict) -> list[str]:
    """The nvcc flags DeepGEMM derives from its compiler options (meta.json's ``compiler_options``), in
    its order; their space-joined text is part of the key."""
    def on(name: str) -> bool:
        return bool(options.get(name))

    if not options.get("arch") or options.get("optimize_level") in (None, "") \
            or options.get("ptxas_register_usage_level") is None:
        raise RebuildRefused("the record's compiler options lack the arch, the optimization level or the "
                             "register usage level")
    level = options["optimize_level"]
    flags = [f"--gpu-architecture=sm_{options['arch']}", f"-O{level}", f"--compiler-options=-O{level}"]
    if on("use_fast_math"):
        flags.append("--use_fast_math")
    if on("ptxas_verbose"):
        flags.append("--ptxas-options=--verbose")
    flags.append(f"--ptxas-options=--register-usage-level={options['ptxas_register_usage_level']}")
    if on("check_no_spills"):
        flags.append("--ptxas-options=--warn-on-spills")
    if on("check_no_local_memory"):
        flags.append("--ptxas-options=--warn-on-local-memory-usage")
    if on("with_line_info"):
        flags.append("--generate-line-info")
    return flags + list(options.get("nvcc_flags") or []) + list(options.get("extra_nvcc_flags") or [])


def nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout


def check(record: RecordedKernel, include_dirs: list[Path], nvcc: str = "nvcc") -> list[str]:
    """The flags to rebuild ``record`` with, once it is known to give the recorded entry here; raises
    RebuildRefused naming what differs."""
    try:
        return _check(record, include_dirs, nvcc)
    except (KeyError, TypeError, AttributeError) as exc:
        raise RebuildRefused(f"{record.name}: its meta.json is not DeepGEMM's ({type(exc).__name__}: {exc})") from exc


def _check(record: RecordedKernel, include_dirs: list[Path], nvcc: str) -> list[str]:
    if record.options.get("post_hook"):
        raise RebuildRefused(f"{record.name}: built with a post hook ({record.options['post_hook']}), which a "
                             "rebuild does not run")
    version = nvcc_version(nvcc)
    if version != record.nvcc_version:
        raise RebuildRefused(f"{record.name}: this nvcc is not the recorded one ({_release(version)} here, "
                             f"{_release(record.nvcc_version)} recorded)")
    flags = nvcc_flags(record.options)
    if " ".join(flags) not in record.meta.get("command", ""):
        raise RebuildRefused(f"{record.name}: the recorded command does not hold the flags its options give")
    key = cache_key(record.signature, version, flags, SourceDigest(include_dirs).of_source(record.source))
    if key != record.key:
        raise RebuildRefused(f"{record.name}: the key over this machine's DeepGEMM headers is {key}, not the "
                             f"recorded {record.key} (the headers or the source differ)")
    return flags


def rebuild(record: RecordedKernel, roots: list[Path], include_dirs: list[Path], nvcc: str = "nvcc",
            timeout: float = 600.0) -> tuple[Path, bool]:
    """Build ``record`` into the first of ``roots`` unless an entry is there already; returns the entry and
    whether it was built here. Raises RebuildRefused (nothing written) or the build's error."""
    flags = check(record, include_dirs, nvcc)
    found = disk_cache.find(roots, record.name, record.key)
    if found is not None:
        return found, False

    def build(folder: Path) -> None:
        (folder / SOURCE).write_text(record.source)
        command = [nvcc, str(folder / SOURCE), "--cubin", "--output-file", str(folder / CUBIN), *flags]
        for include_dir in include_dirs:
            command += ["--include-path", str(include_dir)]
        # its own process group: at the timeout nvcc goes with the compilers it runs (cicc, ptxas)
        proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"nvcc spent over {timeout:.0f}s on {record.name}; killed") from None
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for {record.name} (exit {proc.returncode}):\n{stderr[-4000:]}")
        cubin = folder / CUBIN
        if not cubin.is_file() or cubin.stat().st_size == 0:
            raise RuntimeError(f"nvcc produced no cubin for {record.name}")
        meta = {**record.meta, "command": " ".join(command),
                "config": {**record.meta["config"], "include_dirs": [str(d) for d in include_dirs]}}
        (folder / META).write_text(json.dumps(meta))

    return disk_cache.publish(roots[0], record.name, record.key, build), True


def _release(version_text: str) -> str:
    for line in version_text.splitlines():
        if "release" in line:
            return line.strip()
    return version_text.strip()[:80]
