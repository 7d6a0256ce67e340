"""Issue 19: numba's cache of kvtool's kernels is a folder of kvtool's sources.

numba checks a cached kernel against its own file only: a change in a helper inlined from
another module (or a constant read from one) would leave the old machine code in use. The
console entry points numba at ``<user cache>/kvtool/numba/<digest of every source file>``
(tests/test_scan.py runs a cold and a warm report through it).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import kvtool
from kvtool import _jit

PACKAGE = Path(kvtool.__file__).resolve().parent


def _copy(tmp_path: Path) -> Path:
    pkg = tmp_path / "kvtool"
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.nb[ic]"))
    return pkg


def test_issue19_the_digest_changes_with_any_source_file(tmp_path: Path) -> None:
    pkg = _copy(tmp_path)
    first = _jit.source_digest(pkg)
    assert first == _jit.source_digest(PACKAGE) == _jit.source_digest()
    assert len(first) == 16 and int(first, 16) >= 0
    helper = pkg / "report" / "kstate.py"  # inlined into kplain's loop, another file
    helper.write_bytes(helper.read_bytes() + b"\n")
    second = _jit.source_digest(pkg)
    assert second != first
    (pkg / "report" / "kstate.py").rename(pkg / "report" / "kstate2.py")  # a name counts
    assert _jit.source_digest(pkg) not in (first, second)
    os.utime(pkg / "report" / "kplain.py", (1, 1))  # a time does not
    (pkg / "report" / "kstate2.py").rename(pkg / "report" / "kstate.py")
    assert _jit.source_digest(pkg) == second


def test_issue19_the_console_cache_folder_and_what_it_leaves(tmp_path: Path) -> None:
    assert "numba" in sys.modules  # this test process: left as it is
    assert _jit.use_a_cache_of_these_sources({"XDG_CACHE_HOME": str(tmp_path)}) is None
    saved = sys.modules.pop("numba")
    try:
        env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
        base = tmp_path / "xdg" / "kvtool" / "numba"
        base.mkdir(parents=True)
        old = [f"{i:016x}" for i in range(6)]  # other digests, unused for 8 days and more
        for i, name in enumerate(old):
            (base / name).mkdir()
            when = time.time() - (14 - i) * 86400
            os.utime(base / name, (when, when))
        recent = "abcdef0123456789"  # another kvtool's, used an hour ago
        (base / recent).mkdir()
        when = time.time() - 3600
        os.utime(base / recent, (when, when))
        (base / "notes").mkdir()  # not a name kvtool gives: never removed
        os.utime(base / "notes", (1, 1))
        folder = _jit.use_a_cache_of_these_sources(env)
        assert folder == base / _jit.source_digest() and folder.is_dir()
        assert env["NUMBA_CACHE_DIR"] == str(folder)
        # the newest used are kept (this one and three others), and any used this week
        assert sorted(p.name for p in base.iterdir()) == sorted(
            [folder.name, recent, old[4], old[5], "notes"]
        )
        # a folder the user named is theirs
        mine = {"NUMBA_CACHE_DIR": str(tmp_path / "mine"), "XDG_CACHE_HOME": str(tmp_path)}
        assert _jit.use_a_cache_of_these_sources(mine) is None
        assert mine["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")
        # a cache that cannot be made: numba's own policy
        blocked = tmp_path / "file"
        blocked.write_text("")
        env = {"XDG_CACHE_HOME": str(blocked)}
        assert _jit.use_a_cache_of_these_sources(env) is None and "NUMBA_CACHE_DIR" not in env
    finally:
        sys.modules["numba"] = saved
