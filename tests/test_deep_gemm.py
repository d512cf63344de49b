"""DeepGEMM kernels rebuilt from their records without a GPU: the cache key (against DeepGEMM's own hashing
code), its disk cache's layout and publishing, and rebuilds with nvcc for sm_90a that refuse what would
not give the server's entry."""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jit_ahead.deep_gemm import disk_cache
from jit_ahead.deep_gemm.key import NonStandardInclude, SourceDigest, cache_key, digest, included_name
from jit_ahead.deep_gemm.rebuild import RebuildRefused, RecordedKernel, nvcc_flags, nvcc_version, rebuild

from .conftest import REPO

VECTORS = json.loads((REPO / "tests" / "data" / "deep_gemm_key_vectors.json").read_text())
NVCC = shutil.which("nvcc") or "nvcc"
# DeepGEMM's default compiler options for an H200 (as its meta.json records them)
OPTIONS = {"optimize_level": "3", "use_fast_math": False, "ptxas_verbose": False, "ptxas_register_usage_level": 10,
           "check_no_spills": False, "check_no_local_memory": False, "with_line_info": False, "dump_ptx": False,
           "dump_sass": False, "arch": "90a",
           "nvcc_flags": ["-std=c++20", "--compiler-options=-fPIC", "--compiler-options=-fconcepts",
                          "--expt-relaxed-constexpr", "--expt-extended-lambda",
                          "--diag-suppress=39,161,174,177,186,940",
                          "--compiler-options=-Wno-deprecated-declarations,-Wno-abi"],
           "extra_nvcc_flags": [], "post_hook": None}
HEADER = "#pragma once\nnamespace jit_ahead_test { __device__ inline int answer() { return 42; } }\n"
SOURCE = ("#include <deep_gemm/common.cuh>\n#include <cuda_runtime.h>\n"
          "extern \"C\" __global__ void jit_ahead_kernel(int* out) { *out = jit_ahead_test::answer(); }\n")


def test_the_key_matches_deep_gemms_own_hashing_code_on_the_committed_vectors(tmp_path):
    for case in VECTORS["strings"]:
        assert digest(case["text"]) == case["digest"], case["text"][:40]
    for name, text in VECTORS["tree"].items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(text.encode())
    sources = SourceDigest([tmp_path])
    for case in VECTORS["sources"]:
        assert sources.of_source(case["text"]) == case["digest"], case["text"][:60]
    for case in VECTORS["keys"]:
        assert cache_key(case["signature"], case["nvcc_version"], case["flags"], case["source_digest"]) == case["key"]
    # the nvcc text, the flags and the source each change the key
    assert len(VECTORS["keys"]) == 8 and len({case["key"] for case in VECTORS["keys"]}) == 8


def test_includes_are_read_as_deep_gemms_parser_reads_them():
    prefixes = ("deep_gemm/",)
    assert included_name("  #  include\t<deep_gemm/a.cuh>", prefixes) == "deep_gemm/a.cuh"
    assert included_name("#include <cute/tensor.hpp>", prefixes) is None  # not hashed: outside the prefix
    assert included_name("// #include <deep_gemm/a.cuh>", prefixes) is None
    with pytest.raises(NonStandardInclude):
        included_name('#include "deep_gemm/a.cuh"', prefixes)
    with pytest.raises(NonStandardInclude):
        included_name("#include < deep_gemm/a.cuh>", prefixes)


def test_cache_roots_follow_deep_gemms_variables():
    assert disk_cache.cache_roots({"DG_JIT_CACHE_DIR": "/a:/b", "DJ_JIT_CACHE_DIR": "/c"}) == [Path("/a"), Path("/b")]
    assert disk_cache.cache_roots({"DJ_JIT_CACHE_DIR": "/c"}) == [Path("/c")]
    assert disk_cache.cache_roots({"HOME": "/home/u"}) == [Path("/home/u/.dj")]
    with pytest.raises(ValueError, match="empty path"):
        disk_cache.cache_roots({"DG_JIT_CACHE_DIR": "/a::/b"})
    with pytest.raises(ValueError, match="letters, digits and underscores"):
        disk_cache.entry_name("sm90-gemm", "0" * 32)


def make_record(tmp_path: Path, version: str | None = None) -> tuple[RecordedKernel, Path]:
    """A record as DeepGEMM leaves it in an entry of a GPU machine's cache, for a kernel including one of
    (our stand-in) DeepGEMM's headers."""
    include = tmp_path / "include"
    (include / "deep_gemm").mkdir(parents=True, exist_ok=True)
    (include / "deep_gemm" / "common.cuh").write_text(HEADER)
    flags = nvcc_flags(OPTIONS)
    version = version or nvcc_version(NVCC)
    key = cache_key("cutlass-421", version, flags, SourceDigest([include]).of_source(SOURCE))
    gpu_entry = "/root/.dj/cache/sm90_jit_ahead_test." + key
    command = " ".join([NVCC, f"{gpu_entry}/kernel.cu", "--cubin", "--output-file", f"{gpu_entry}/kernel.cubin",
                        *flags, "--include-path", "/usr/lib/python3/dist-packages/deep_gemm/include"])
    meta = {"command": command,
            "config": {"python_library_root": "/usr/lib/python3/dist-packages/deep_gemm",
                       "extra_signature": "cutlass-421",
                       "include_dirs": ["/usr/lib/python3/dist-packages/deep_gemm/include"]},
            "compiler_info": {"path": NVCC, "version": version}, "compiler_options": OPTIONS}
    return RecordedKernel("sm90_jit_ahead_test", key, SOURCE, meta), include


def test_a_record_is_rebuilt_into_deep_gemms_cache_once(tmp_path):
    record, include = make_record(tmp_path)
    roots = [tmp_path / "dj", tmp_path / "read-only"]
    entry, built = rebuild(record, roots, [include], nvcc=NVCC)
    assert built and entry == roots[0] / "cache" / f"sm90_jit_ahead_test.{record.key}"
    assert (entry / disk_cache.COMMITTED).exists() and (entry / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    assert disk_cache.find(roots, record.name, record.key) == entry
    assert not list((roots[0] / "tmp").iterdir())  # the private build folder became the entry
    again = RecordedKernel.from_entry(entry)  # what was published is a record of the same kernel
    assert (again.name, again.key, again.source) == (record.name, record.key, record.source)
    assert rebuild(again, roots, [include], nvcc=NVCC) == (entry, False)


def test_a_changed_header_or_nvcc_is_refused_with_one_line_and_nothing_written(tmp_path):
    record, include = make_record(tmp_path)
    (include / "deep_gemm" / "common.cuh").write_text(HEADER.replace("42", "43"))
    with pytest.raises(RebuildRefused, match="key over this machine's DeepGEMM headers"):
        rebuild(record, [tmp_path / "dj"], [include], nvcc=NVCC)
    other, include = make_record(tmp_path / "other", version="Cuda compilation tools, release 12.9, V12.9.86\n")
    with pytest.raises(RebuildRefused, match="not the recorded one"):
        rebuild(other, [tmp_path / "dj"], [include], nvcc=NVCC)
    assert not (tmp_path / "dj").exists()


def test_a_record_whose_meta_is_not_deep_gemms_is_refused_with_one_line(tmp_path):
    record, include = make_record(tmp_path)
    broken = RecordedKernel(record.name, record.key, record.source, {"command": record.meta["command"]})
    with pytest.raises(RebuildRefused, match="not DeepGEMM's"):
        rebuild(broken, [tmp_path / "dj"], [include], nvcc=NVCC)


@pytest.mark.parametrize("damage", ["cubin-cut-short", "cubin-missing", "meta-broken"])
def test_a_committed_entry_whose_files_are_damaged_is_one_line_removed_and_built_again(tmp_path, caplog, damage):
    # before: the marker alone made it an entry, so DeepGEMM was handed a cubin it cannot load, for good
    caplog.set_level(logging.WARNING, logger="jit_ahead")
    record, include = make_record(tmp_path)
    roots = [tmp_path / "dj"]
    entry, built = rebuild(record, roots, [include], nvcc=NVCC)
    cubin = entry / "kernel.cubin"
    whole = cubin.read_bytes()
    if damage == "cubin-cut-short":
        cubin.write_bytes(whole[: len(whole) // 2])
    elif damage == "cubin-missing":
        cubin.unlink()
    else:
        (entry / "meta.json").write_text('{"command": ')
    assert disk_cache.find(roots, record.name, record.key) is None and not entry.exists()
    lines = [r.getMessage() for r in caplog.records if str(entry) in r.getMessage()]
    assert len(lines) == 1 and "damaged" in lines[0] and "built again" in lines[0], lines
    again, built = rebuild(record, roots, [include], nvcc=NVCC)
    assert built and again == entry and (entry / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    assert disk_cache.find(roots, record.name, record.key) == entry
    # a damaged entry in a read-only lookup root is passed over, not removed
    lookup = tmp_path / "lookup"
    shutil.copytree(roots[0] / "cache", lookup / "cache")
    (lookup / "cache" / entry.name / "kernel.cubin").write_bytes(whole[:100])
    assert disk_cache.find([tmp_path / "empty", lookup], record.name, record.key) is None
    assert (lookup / "cache" / entry.name).exists()


def test_a_leftover_folder_without_a_marker_at_an_entrys_place_is_replaced(tmp_path):
    record, include = make_record(tmp_path)
    root = tmp_path / "dj"
    leftover = root / "cache" / f"{record.name}.{record.key}"
    leftover.mkdir(parents=True)
    (leftover / "kernel.cu").write_text("half written")
    entry, built = rebuild(record, [root], [include], nvcc=NVCC)
    assert built and entry == leftover and (entry / disk_cache.COMMITTED).exists()
    assert (entry / "kernel.cu").read_text() == record.source


def test_an_entry_another_process_published_first_is_kept(tmp_path):
    root = tmp_path / "dj"
    first = disk_cache.publish(root, "k", "0" * 32, lambda folder: (folder / "kernel.cubin").write_bytes(b"first"))
    second = disk_cache.publish(root, "k", "0" * 32, lambda folder: (folder / "kernel.cubin").write_bytes(b"second"))
    assert first == second and (first / "kernel.cubin").read_bytes() == b"first"
    assert not list((root / "tmp").iterdir())


REBUILD = """
import json, sys
from pathlib import Path
from jit_ahead.deep_gemm.rebuild import RecordedKernel, rebuild
record = RecordedKernel(**json.loads(Path(sys.argv[1]).read_text()))
rebuild(record, [Path(sys.argv[2])], [Path(sys.argv[3])], nvcc=sys.argv[4])
"""


def tree_of(pid: int) -> list[psutil.Process]:
    """The process and its descendants now (none once it is gone)."""
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def name_of(process: psutil.Process) -> str | None:
    """Its name; None if it ended since it was listed (a shell's short-lived child)."""
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return None


def test_a_rebuild_killed_midway_leaves_no_entry_and_the_next_one_builds_it(tmp_path):
    record, include = make_record(tmp_path)
    (tmp_path / "record.json").write_text(json.dumps(record.to_json()))
    root = tmp_path / "dj"
    # nvcc as a build sees it, held at its start so that the kill lands mid-build whatever the machine's speed
    held = tmp_path / "nvcc-held"
    held.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec {NVCC} --version\nsleep 60\nexec {NVCC} "$@"\n')
    held.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-c", REBUILD, str(tmp_path / "record.json"), str(root), str(include),
                             str(held)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 120
        compiling = []
        while not compiling and time.monotonic() < deadline and proc.poll() is None:
            compiling = [p for p in tree_of(proc.pid)[1:] if name_of(p) == "sleep"]
            time.sleep(0.01)
        assert compiling, "the build never started"
        assert list((root / "tmp").iterdir())  # its private folder, mid-build
    finally:
        for p in tree_of(proc.pid):  # as a crash would (and, if the test failed above, nothing left behind)
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        proc.wait()
    assert disk_cache.find([root], record.name, record.key) is None
    assert not (root / "cache").exists() or not list((root / "cache").iterdir())
    entry, built = rebuild(record, [root], [include], nvcc=NVCC)
    assert built and (entry / disk_cache.COMMITTED).exists()


def test_a_kernel_deep_gemm_compiled_is_recorded_and_rebuilt_by_a_helper_at_the_next_start(tmp_path, monkeypatch):
    from jit_ahead.core.priority import Priority
    from jit_ahead.session import Session

    record, include = make_record(tmp_path)
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    monkeypatch.setenv("JIT_AHEAD_RECORD_DIR", str(records))
    monkeypatch.setenv("JIT_AHEAD_DEEP_GEMM_INCLUDE", str(include))
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "gpu-machine"))
    first = Session(families=("deep_gemm",), deep_gemm={"workers": 1}).start()
    try:
        assert first.families["deep_gemm"].wait_replay(60)
        # the server's DeepGEMM compiles a kernel into its cache (here by the same rebuild: no GPU)
        rebuild(record, [tmp_path / "gpu-machine"], [include], nvcc=NVCC)
    finally:
        first.close()
    # another machine (an empty DeepGEMM cache), same record folder: a helper rebuilds it before it is asked
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "second-machine"))
    second = Session(families=("deep_gemm",), deep_gemm={"workers": 1})
    events = []
    second.stats.subscribe(events.append)
    second.start()
    try:
        assert second.families["deep_gemm"].wait_replay(60)
        assert second.wait_ready(300, priority=Priority.REPLAY)
    finally:
        second.close()
    assert [(e["variants"], e["queued"]) for e in events if e["event"] == "replay"] == [(1, 1)]
    builds = [e for e in events if e["event"] == "build_finish"]
    assert len(builds) == 1 and builds[0]["ok"] and builds[0]["helper"].startswith("helper-"), builds
    entry = disk_cache.find([tmp_path / "second-machine"], record.name, record.key)
    assert entry is not None and (entry / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"


def test_where_deep_gemm_kernels_cannot_be_rebuilt_the_family_is_left_out_with_one_line(tmp_path, monkeypatch, caplog):
    from jit_ahead.session import Session

    monkeypatch.setenv("JIT_AHEAD_DEEP_GEMM_INCLUDE", str(tmp_path / "nowhere"))
    session = Session(families=("deep_gemm",), skip_unavailable=True)
    assert session.families == {}
    lines = [r.getMessage() for r in caplog.records if "deep_gemm" in r.getMessage()]
    assert len(lines) == 1 and "no deep_gemm/ header folder" in lines[0], lines
