"""The one way kvtool compiles a kernel: numba ``njit``, cached on disk, GIL-free.

Every numba kernel in kvtool (the columnar decoder, the state kernel, what-if) is
decorated with :func:`kernel`, so they share one cache policy: ``cache=True`` (numba
keeps the machine code beside the module, or in the user's cache folder when
site-packages is read-only; ``NUMBA_CACHE_DIR`` is honoured by numba itself) and
``nogil=True`` (so a kernel runs in a thread beside decompression). numba is imported
here only, the first time a kernel is defined.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def kernel(func: F) -> F:
    """Compile ``func`` with numba: nopython, cached, without the GIL.

    Args:
        func: A function written in numba's subset of Python.

    Returns:
        The compiled dispatcher (called like ``func``).
    """
    import numba

    return numba.njit(cache=True, nogil=True)(func)  # type: ignore[return-value]


def helper_kernel(func: F) -> F:
    """:func:`kernel` for a helper that only other kernels call, never Python.

    numba gives every compiled function a CPython wrapper (unboxing each argument) and a
    C wrapper, links them into every kernel that calls it and optimises them again there,
    at each level of calls; a helper called only from kernels never runs them. Without
    them a cold first run compiles the decoder and the state kernel in ~15 % less CPU
    (bench/RESULTS.md, issue 19 start-up); the machine code of the calls is the same.

    Args:
        func: A function written in numba's subset of Python.

    Returns:
        The compiled dispatcher, callable from kernels only.
    """
    import numba

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

    return numba.njit(cache=True, nogil=True, inline="always")(func)  # type: ignore[return-value]


__all__ = ["helper_kernel", "inline_kernel", "kernel"]
