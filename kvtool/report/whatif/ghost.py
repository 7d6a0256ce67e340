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
def wait(k: int, t: int, n_keys: int, pend: I64, heap: I64, hn: I64) -> None:
    """Key ``k``'s larger-pool copy waits at its older place, freed at about op ``t``."""
    pend[1, k] = t
    v = t * n_keys + k
    i = hn[0]
    hn[0] += 1
    while i > 0:
        up = (i - 1) // 2
        if heap[up] <= v:
            break
        heap[i] = heap[up]
        i = up
    heap[i] = v


@kernel
def _pop(heap: I64, hn: I64) -> int:
    """Take the smallest entry of the heap."""
    top = heap[0]
    hn[0] -= 1
    n = hn[0]
    v = heap[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= v:
            break
        heap[i] = heap[c]
        i = c
    if n > 0:
        heap[i] = v
    return int(top)


@kernel
def remove(
    k: int,
    n0: I32,
    ph: I32,
    kin: I32,
    gc: I32,
    pend: I64,
    heap: I64,
    hn: I64,
    ent_key: I64,
    ent_alive: Bools,
    ent_prev: I64,
    key_last: I64,
    tail: int,
    head: int,
    free: int,
) -> tuple[I64, Bools, I64, int, int, int, int]:
    """One recorded remove of key ``k``.

    The waiting copies (:func:`wait`) freed before ``k``'s last use join the ghost list
    first: the queue is in order of freeing, and ``k`` was freed after that use.

    Returns:
        The (maybe grown) ghost arrays, tail, head, free room, and 1 for a remove of a key
        not live (an orphan), else 0.
    """
    n_keys = n0.shape[0]
    lim = pend[0, k]
    while hn[0] > 0 and heap[0] // n_keys < lim:
        v = _pop(heap, hn)
        x = v % n_keys
        if pend[1, x] == v // n_keys:
            pend[1, x] = -1
            kin[x] -= 1
            ent_key, ent_alive, ent_prev, tail = push(
                x, ent_key, ent_alive, ent_prev, key_last, gc, tail
            )
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


__all__ = ["push", "remove", "take", "unlink_last", "wait"]
