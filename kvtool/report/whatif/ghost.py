"""The what-if kernel's ghost list: the larger pool's copies the recorded pool evicted.

A FIFO of keys in recorded eviction order (oldest first), one entry per copy, with a
per-key chain to its newest live copy (``key_last``, ``ent_prev``) so a hit can take that
copy out; ``gc`` counts each key's live entries. :func:`kvtool.report.whatif.kernel.simulate`
owns the arrays; these are its operations on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvtool._jit import kernel

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Bools = npt.NDArray[np.bool_]
IArr = npt.NDArray[np.signedinteger[Any]]


@kernel
def _grow(key: I64, alive: Bools, prev: I64) -> tuple[I64, Bools, I64]:
    """Return the ghost list's arrays with room for twice as many entries."""
    n = key.shape[0]
    k2 = np.zeros(2 * n + 1, np.int64)
    a2 = np.zeros(2 * n + 1, np.bool_)
    p2 = np.full(2 * n + 1, -1, np.int64)
    k2[:n] = key
    a2[:n] = alive
    p2[:n] = prev
    return k2, a2, p2


@kernel
def push(
    k: int, ent_key: I64, ent_alive: Bools, ent_prev: I64, key_last: I64, gc: I32, tail: int
) -> tuple[I64, Bools, I64, int]:
    """Free a copy of key ``k`` to the ghost queue's tail; the (maybe grown) arrays, new tail."""
    if tail >= ent_key.shape[0]:
        ent_key, ent_alive, ent_prev = _grow(ent_key, ent_alive, ent_prev)
    ent_key[tail] = k
    ent_alive[tail] = True
    ent_prev[tail] = key_last[k]
    key_last[k] = tail
    gc[k] += 1
    return ent_key, ent_alive, ent_prev, tail + 1


@kernel
def take(
    head: int, tail: int, free: int, ent_key: I64, ent_alive: Bools, gc: I32
) -> tuple[int, int]:
    """A block for a store: a free one, else the queue's head is evicted; (head, free)."""
    if free > 0:
        return head, free - 1
    while head < tail:
        e = head
        head += 1
        if ent_alive[e]:
            ent_alive[e] = False
            gc[ent_key[e]] -= 1
            break
    return head, free


@kernel
def unlink_last(k: int, ent_alive: Bools, ent_prev: I64, key_last: I64, gc: I32) -> None:
    """Take key ``k``'s newest live copy out of the queue (a hit touches it)."""
    e = key_last[k]
    while e >= 0 and not ent_alive[e]:
        e = ent_prev[e]
    ent_alive[e] = False
    gc[k] -= 1
    key_last[k] = ent_prev[e]


@kernel
def remove(
    k: int,
    n0: I32,
    ph: I32,
    kin: I32,
    gc: I32,
    pend: I64,
    ent_key: I64,
    ent_alive: Bools,
    ent_prev: I64,
    key_last: I64,
    tail: int,
    head: int,
    free: int,
) -> tuple[I64, Bools, I64, int, int, int, int]:
    """One recorded remove of key ``k``.

    Returns the (maybe grown) ghost arrays, tail, head, free room, and 1 for a remove of a
    key not live (an orphan), else 0.
    The keys waiting on ``k`` (sliding-window blocks a longer hit left at their older place,
    see :func:`simulate`) join the ghost list first: they were freed just before it.
    """
    x = pend[1, k]
    pend[1, k] = -1
    while x >= 0:
        nx = pend[2, x]
        pend[3, x] = 0
        if pend[0, x] == k:
            pend[0, x] = -1
            kin[x] -= 1
            ent_key, ent_alive, ent_prev, tail = push(
                x, ent_key, ent_alive, ent_prev, key_last, gc, tail
            )
        x = nx
    if n0[k] <= 0:
        return ent_key, ent_alive, ent_prev, tail, head, free, 1
    n0[k] -= 1
    if ph[k] > 0:
        ph[k] -= 1
    else:
        ent_key, ent_alive, ent_prev, tail = push(
            k, ent_key, ent_alive, ent_prev, key_last, gc, tail
        )
    head, free = take(head, tail, free, ent_key, ent_alive, gc)
    return ent_key, ent_alive, ent_prev, tail, head, free, 0


__all__ = ["push", "remove", "take", "unlink_last"]
