"""Issue 19, start-up: process-wide settings are made by the process's entry only.

``kvtool serve`` has glibc's malloc map every buffer of 1 MiB or more (a server runs for
days; see :mod:`kvtool.commands._process`). That is a setting of the whole process, so the
console script's entry (:func:`kvtool.cli.main`) makes it, and the command function, which
tests and other programs call in their own process through ``kvtool.cli.app``, does not.

The setting is observed, not assumed: after an 8 MiB block is freed, glibc's default
(dynamic) threshold has risen past 4 MiB, so a 4 MiB block comes from the heap; with the
fixed 1 MiB threshold it is a mapping of its own (``mallinfo2().hblks`` counts them).
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

RECORDING = Path(__file__).parent.parent / "recordings" / "gemma3.mcap"

_PROBE = """
import ctypes, sys

class _Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = _Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]


def fixed_threshold():
    libc.free(libc.malloc(8 << 20))  # the default threshold follows it up to 8 MiB
    before = libc.mallinfo2().hblks
    block = libc.malloc(4 << 20)
    mapped = libc.mallinfo2().hblks > before
    libc.free(block)
    return mapped


ARGS = ["serve", sys.argv[2], "--speed", "0", "--exit-at-end", "--metrics", "127.0.0.1:0"]
if sys.argv[1] == "library":
    import typer.main
    from kvtool.cli import app

    typer.main.get_command(app).main(args=ARGS, prog_name="kvtool", standalone_mode=False)
elif sys.argv[1] == "entry":
    from kvtool.cli import main

    sys.argv = ["kvtool", *ARGS]
    try:
        main()
    except SystemExit as end:
        assert not end.code, end.code
print("fixed" if fixed_threshold() else "dynamic")
"""


def _glibc_with_mallinfo2() -> bool:
    if platform.libc_ver()[0] != "glibc":
        return False
    return hasattr(ctypes.CDLL(None), "mallinfo2")


def _serve_then_probe(how: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, how, str(RECORDING)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only")
def test_issue19_probe_sees_the_default_threshold_without_serve() -> None:
    assert _serve_then_probe("none") == "dynamic"


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only")
def test_issue19_serve_called_in_process_changes_nothing_process_wide() -> None:
    assert _serve_then_probe("library") == "dynamic"


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only")
def test_issue19_serve_process_entry_fixes_the_mmap_threshold() -> None:
    assert _serve_then_probe("entry") == "fixed"


_JIT_MODULE = """
from kvtool._jit import helper_kernel, kernel


@helper_kernel
def twice(x):
    return 2 * x


@kernel
def total(a):
    s = 0
    for v in a:
        s += twice(v)
    return s
"""

_JIT_RUN = """
import numpy as np
import jitmod

print(jitmod.total(np.arange(5, dtype=np.int64)), sum(jitmod.total.stats.cache_hits.values()))
"""


def test_issue19_helper_kernel_is_called_from_a_kernel_and_cached(tmp_path: Path) -> None:
    """A helper without Python wrappers (``helper_kernel``) computes as a kernel does, and
    its caller is loaded from numba's disk cache by the next process."""
    (tmp_path / "jitmod.py").write_text(_JIT_MODULE)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env["PYTHONPATH"] = str(tmp_path)
    runs = [
        subprocess.run(
            [sys.executable, "-c", _JIT_RUN],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=env,
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert [r.stdout.split() for r in runs] == [["20", "0"], ["20", "1"]]
