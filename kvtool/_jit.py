"""The one way kvtool compiles a kernel: numba ``njit``, cached on disk, GIL-free.

Every numba kernel in kvtool (the columnar decoder, the state kernel, what-if) is
decorated with :func:`kernel`, so they share one cache policy: ``cache=True`` (numba
keeps the machine code beside the module, or in the user's cache folder when
site-packages is read-only; ``NUMBA_CACHE_DIR`` is honoured by numba itself) and
``nogil=True`` (so a kernel runs in a thread beside decompression). numba is imported
here only, the first time a kernel is defined.

A compile says so, once a process, on stderr (:data:`COMPILE_NOTICE`): when the console
entry asked for it (:func:`say_when_compiling`), numba's compile event of a kvtool
kernel prints it. numba raises that event only when it really compiles (a cache miss),
not when it loads a kernel from its cache, so a warm run says nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

COMPILE_NOTICE = "kvtool: compiling its numba kernels (first run only; cached after)…"
"""The line a process prints on stderr before its first compile of a kvtool kernel."""


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
