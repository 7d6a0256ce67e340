"""The one way kvtool compiles a kernel: numba ``njit``, cached on disk, GIL-free.

Every numba kernel in kvtool (the columnar decoder, the state kernel, what-if) is
decorated with :func:`kernel`, so they share one cache policy: ``cache=True`` (numba
keeps the machine code beside the module, or in the user's cache folder when
site-packages is read-only; ``NUMBA_CACHE_DIR`` is honoured by numba itself) and
``nogil=True`` (so a kernel runs in a thread beside decompression). numba is imported
here only, the first time a kernel is defined.

numba knows a cached kernel is stale by its own file only: a change in a helper or a
constant of another module (``kstate``'s inlined helpers in ``kplain``'s loop, ``schema``'s
field positions in the decoder) would leave the old machine code in use. So the console
entry gives numba a cache folder named by a digest of every source file of kvtool
(:func:`use_a_cache_of_these_sources`); any change in the package is another folder, and a
cold compile.

A compile says so, once a process, on stderr (:data:`COMPILE_NOTICE`): when the console
entry asked for it (:func:`say_when_compiling`), numba's compile event of a kvtool
kernel prints it. numba raises that event only when it really compiles (a cache miss),
not when it loads a kernel from its cache, so a warm run says nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

COMPILE_NOTICE = "kvtool: compiling its numba kernels (first run only; cached after)…"
"""The line a process prints on stderr before its first compile of a kvtool kernel."""


KEEP_CACHES = 4
"""How many kvtool cache folders (the newest used) :func:`use_a_cache_of_these_sources` keeps
at least; of the others, those unused for :data:`KEEP_CACHE_DAYS` are removed."""
KEEP_CACHE_DAYS = 7
_DIGEST_NAME = re.compile(r"[0-9a-f]{16}")


def source_digest(root: Path | None = None) -> str:
    """A digest of every ``*.py`` file of the package at ``root`` (default: this kvtool).

    Args:
        root: The package folder.

    Returns:
        16 hexadecimal digits: the same for the same files, names and bytes alike.
    """
    root = Path(__file__).resolve().parent if root is None else root
    h = hashlib.blake2b(digest_size=8)
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def use_a_cache_of_these_sources(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Give numba a cache folder of this kvtool's sources: ``<user cache>/kvtool/numba/DIGEST``.

    The console entry (:func:`kvtool.cli.main`) calls it before numba is imported; a
    library call never does (it sets ``NUMBA_CACHE_DIR`` for the process). The user cache
    is ``$XDG_CACHE_HOME`` or ``~/.cache``. Left as it is: a ``NUMBA_CACHE_DIR`` the user
    set, numba already imported, or a cache folder that cannot be made (numba's own policy
    then: beside the modules, or its user folder). Of the other kvtool folders there, the
    :data:`KEEP_CACHES` newest used are kept, and the rest once unused for
    :data:`KEEP_CACHE_DAYS` days (another kvtool may be using one) are removed.

    Args:
        environ: The environment to set it in (default: this process's).

    Returns:
        The folder, or None where it was left to numba.
    """
    env = os.environ if environ is None else environ
    if env.get("NUMBA_CACHE_DIR") or "numba" in sys.modules:
        return None
    try:
        base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtool" / "numba"
        folder = base / source_digest()
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)  # its mtime says when it was last used
        if not os.access(folder, os.W_OK):
            return None
    except (OSError, RuntimeError):  # RuntimeError: no home directory
        return None
    env["NUMBA_CACHE_DIR"] = str(folder)
    _prune(base, folder)
    return folder


def _prune(base: Path, keep: Path) -> None:
    """Remove old kvtool cache folders in ``base`` (see :func:`use_a_cache_of_these_sources`)."""
    import time

    try:
        # Only folders this function names (a digest: 16 hexadecimal digits) are kvtool's.
        used = {
            p: p.stat().st_mtime
            for p in base.iterdir()
            if _DIGEST_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
        }
    except OSError:
        return
    used.pop(keep, None)
    since = time.time() - KEEP_CACHE_DAYS * 86400
    for old in sorted(used, key=used.__getitem__, reverse=True)[KEEP_CACHES - 1 :]:
        if used[old] < since:
            shutil.rmtree(old, ignore_errors=True)


class _Notice:
    """Whether the notice is wanted, its listener registered, and the line said."""

    wanted = False
    registered = False
    said = threading.Lock()  # taken by the one compile that says it


def say_when_compiling() -> None:
    """Print :data:`COMPILE_NOTICE` once on stderr when this process compiles a kernel.

    The console entry (:func:`kvtool.cli.main`) calls it, not a library call: a program
    that imports kvtool gets no line on its stderr. numba is not imported for it; the
    listener is registered with the first kernel (or now, if numba is loaded).
    """
    _Notice.wanted = True
    if "numba" in sys.modules:
        _listen()


def _listen() -> None:
    """Register the listener of numba's compile events, once (when the notice is wanted)."""
    if _Notice.registered or not _Notice.wanted:
        return
    from numba.core import event

    class _OnCompile(event.Listener):
        def on_start(self, ev: Any) -> None:
            data = ev.data if isinstance(ev.data, dict) else {}
            func = getattr(data.get("dispatcher"), "py_func", None)
            module = getattr(func, "__module__", "") or ""
            if not module.startswith("kvtool.") or not _Notice.said.acquire(blocking=False):
                return
            if sys.stderr is not None:
                print(COMPILE_NOTICE, file=sys.stderr, flush=True)

        def on_end(self, ev: Any) -> None:
            pass

    _Notice.registered = True
    event.register("numba:compile", _OnCompile())  # type: ignore[no-untyped-call]


def kernel(func: F) -> F:
    """Compile ``func`` with numba: nopython, cached, without the GIL.

    Args:
        func: A function written in numba's subset of Python.

    Returns:
        The compiled dispatcher (called like ``func``).
    """
    import numba

    _listen()
    return numba.njit(cache=True, nogil=True)(func)  # type: ignore[return-value]


def helper_kernel(func: F) -> F:
    """:func:`kernel` for a helper that only other kernels call, never Python.

    numba gives every compiled function a CPython wrapper (unboxing each argument) and a
    C wrapper, links them into every kernel that calls it and optimises them again there,
    at each level of calls; a helper called only from kernels never runs them. Without
    them a cold first run compiles in less CPU (the decoder's 16 helpers: -6 to -11 % of a
    cold report, bench/RESULTS.md); the machine code of the calls is the same.

    Args:
        func: A function written in numba's subset of Python.

    Returns:
        The compiled dispatcher, callable from kernels only.
    """
    import numba

    _listen()
    # numba's target options for its own helpers (numba.core.extending's overloads).
    wrappers: dict[str, Any] = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}
    return numba.njit(cache=True, nogil=True, **wrappers)(func)  # type: ignore[no-any-return]


def inline_kernel(func: F) -> F:
    """:func:`kernel` for a small helper inlined into its callers (numba ``inline="always"``).

    A call of a compiled helper that takes named tuples of arrays costs a reference count
    of every array each time; inlined, a helper of a per-row loop costs nothing.

    Args:
        func: A function written in numba's subset of Python.

    Returns:
        The compiled dispatcher.
    """
    import numba

    _listen()
    return numba.njit(cache=True, nogil=True, inline="always")(func)  # type: ignore[return-value]


_PREFETCH: list[Any] = []


def prefetcher() -> Any:
    """A kernel-only ``prefetch(array, index)``: LLVM's ``llvm.prefetch`` of that element.

    A hint to the CPU (read, keep in every cache level), nothing more: no load, no
    result, no bounds check (an address out of range is not touched). The state kernel
    names the table slots of a row a few rows ahead with it, so that their cache misses
    overlap the rows between instead of stalling each probe in turn.

    Returns:
        The numba intrinsic (the same one on every call).
    """
    if _PREFETCH:
        return _PREFETCH[0]
    from llvmlite import ir  # type: ignore[import-untyped]
    from numba import types
    from numba.extending import intrinsic

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty, idxty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = builder.gep(ary.data, [context.cast(builder, args[1], idxty, types.intp)])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        ptr = builder.bitcast(ptr, i8p)  # one declaration, whatever the element type
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.globals.get("llvm.prefetch.p0")
        if fn is None:
            fn = ir.Function(builder.module, fnty, "llvm.prefetch.p0")
        # (address, 0: read, 3: keep in all levels, 1: data cache)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    def prefetch(typingctx: Any, arr: Any, idx: Any) -> Any:
        if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
            return None
        return types.void(arr, idx), codegen

    _PREFETCH.append(intrinsic(prefetch))
    return _PREFETCH[0]


__all__ = [
    "COMPILE_NOTICE",
    "helper_kernel",
    "inline_kernel",
    "kernel",
    "prefetcher",
    "say_when_compiling",
]
