"""Process-wide settings a command asks for its own process, never a library call.

A command module names them in ``PROCESS_SETTINGS`` (command name -> function); the
console script's entry, :func:`kvtool.cli.main`, makes them for the command it runs. The
command function itself (called in-process by tests and other programs through
``kvtool.cli.app``) changes nothing process-wide.
"""

from __future__ import annotations

__all__ = ["give_back_big_buffers"]

_M_MMAP_THRESHOLD = -3


def give_back_big_buffers() -> bool:
    """Have glibc's malloc map every buffer of 1 MiB or more, and unmap it when freed.

    For a process that runs for days (``kvtool serve``): glibc's threshold otherwise rises
    to each freed mapping's size (up to 32 MiB), and the state's tables of ~16 MiB arrays,
    rebuilt now and then, are then carved from the heap, whose holes are never given back:
    RSS grew by each rebuild. A process-wide setting: only the process's entry calls it
    (``PROCESS_SETTINGS`` of :mod:`kvtool.commands.serve`).

    Returns:
        True if set (glibc); False elsewhere (nothing changed).
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 20))
