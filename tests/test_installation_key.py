"""Triton's installation key, kept across processes (``jit_ahead/triton/installation_key.py``): a later
process reads Triton's own key instead of hashing Triton's install, only while the install is unchanged,
and a damaged file costs one line and is replaced."""
import json
import os
import shutil
import subprocess
import sys

from jit_ahead.triton import installation_key as ik

PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from triton.runtime.cache import triton_key
from jit_ahead.triton.installation_key import installation_key
key = installation_key()
print(json.dumps({"key": key, "triton_hashed": triton_key.cache_info().currsize}))
"""


def probe(cache) -> tuple[dict, str]:
    """A fresh process's installation key, and whether Triton hashed its install for it."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def kept(cache) -> dict:
    with open(cache / ik.KEPT) as f:
        return json.load(f)["keys"]


def test_a_later_process_reads_tritons_own_key_without_hashing(tmp_path):
    from triton.runtime.cache import triton_key

    cache = tmp_path / "cache"
    cache.mkdir()
    first, _ = probe(cache)
    assert first == {"key": triton_key(), "triton_hashed": 1}  # Triton's own result, computed once
    assert kept(cache) == {ik.install_identity(): triton_key()}
    second, log = probe(cache)
    assert second == {"key": triton_key(), "triton_hashed": 0}, "the kept key was not used"
    assert log == ""


def test_a_key_kept_for_another_install_is_not_used(tmp_path):
    from triton.runtime.cache import triton_key

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / ik.KEPT).write_text(json.dumps({"jit_ahead_installation_key": 1, "keys": {"0" * 64: "another"}}))
    result, _ = probe(cache)
    assert result == {"key": triton_key(), "triton_hashed": 1}
    assert kept(cache) == {"0" * 64: "another", ik.install_identity(): triton_key()}  # both installs kept


def test_the_identity_follows_every_file_of_the_install(tmp_path):
    import triton

    package = tmp_path / "triton"
    shutil.copytree(os.path.dirname(triton.__file__), package, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "bin"))
    before = ik.install_identity(str(package))
    assert ik.install_identity(str(package)) == before
    language = package / "language" / "core.py"
    stat = language.stat()
    os.utime(language, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    touched = ik.install_identity(str(package))
    assert touched != before
    (package / "backends" / "new_backend.py").write_text("")
    assert ik.install_identity(str(package)) not in (before, touched)


def test_a_damaged_file_is_one_line_and_replaced(tmp_path):
    from triton.runtime.cache import triton_key

    cache = tmp_path / "cache"
    cache.mkdir()
    whole = json.dumps({"jit_ahead_installation_key": 1, "keys": {ik.install_identity(): "a key"}}).encode()
    for damage in (b"\xff\xfe not text", b"[1, 2]", b'{"jit_ahead_installation_key": 1, "keys": {"a": 3}}',
                   b"{" * 100_000, b"x" * (ik.MAX_KEPT_BYTES + 10), whole[:len(whole) // 2]):  # the last: cut short
        (cache / ik.KEPT).write_bytes(damage)
        result, log = probe(cache)
        assert result == {"key": triton_key(), "triton_hashed": 1}
        lines = [line for line in log.splitlines() if line.strip()]
        assert len(lines) == 1 and ik.KEPT in lines[0] and "computed and kept again" in lines[0], log
        assert kept(cache) == {ik.install_identity(): triton_key()}


def test_a_cache_that_cannot_be_written_still_gives_the_key(tmp_path):
    from triton.runtime.cache import triton_key

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / ik.KEPT).mkdir()  # the file's place taken: nothing can be read or written there
    result, log = probe(cache)
    assert result == {"key": triton_key(), "triton_hashed": 1}
    assert len([line for line in log.splitlines() if line.strip()]) == 1, log
    assert (cache / ik.KEPT).is_dir()
