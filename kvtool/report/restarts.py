"""Publisher restarts: a stream's kernel channels, and the kernel stepped over a chunk.

A stream's ``seq`` going backwards is a publisher restart (PROTOCOL.md): from it on the
stream gets a new kernel channel (:class:`KernelChannels`), and :func:`step` clears the
old one before the restart's row, as a clear drops its live blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.report import kernel
from kvtool.report.arrays import I64, inserted

if TYPE_CHECKING:
    from numpy.typing import NDArray


class KernelChannels:
    """The kernel channel of each stream now, the stream of each kernel channel, last seqs."""

    def __init__(self) -> None:
        self.kchan: dict[int, int] = {}
        self.kreal: list[int] = []
        self.last_seq: dict[int, int] = {}

    def restarts_at(self, channel: NDArray[Any], seq: NDArray[Any]) -> NDArray[Any]:
        """Whether each row begins a restart (as :meth:`split` finds them), changing nothing."""
        n = len(channel)
        back = np.zeros(n, dtype=bool)
        for c in np.flatnonzero(np.bincount(channel)).tolist() if n else []:
            idx = np.flatnonzero(channel == c)
            s = seq[idx]
            prev = np.empty_like(s)
            prev[1:] = s[:-1]
            prev[0] = self.last_seq.get(c, s[0])
            back[idx] = s < prev
        return back

    def split(
        self, channel: NDArray[Any], seq: NDArray[Any]
    ) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
        """Each row's kernel channel, the rows where a restart begins, the channels they end.

        A row whose ``seq`` is below the previous row's of its channel (in this chunk or an
        earlier one; rows of one batch share a seq) begins a restart (PROTOCOL.md: the
        publisher restarted, its cache is new): from it on, the stream gets a new kernel
        channel, so no key, eviction count or live list carries over.
        """
        n = len(channel)
        kchan = np.empty(n, dtype=I64)
        at_parts: list[NDArray[Any]] = []
        old_parts: list[NDArray[Any]] = []
        present = np.flatnonzero(np.bincount(channel)).tolist()
        for c in present:
            idx = np.arange(n) if len(present) == 1 else np.flatnonzero(channel == c)
            s = seq[idx]
            prev = np.empty_like(s)
            prev[1:] = s[:-1]
            prev[0] = self.last_seq.get(c, s[0])
            self.last_seq[c] = int(s[-1])
            base = self.kchan.get(c)
            if base is None:
                base = self.kchan[c] = len(self.kreal)
                self.kreal.append(c)
            back = s < prev
            if not back.any():
                kchan[idx] = base
                continue
            ids = [base]
            for _ in range(int(back.sum())):
                ids.append(len(self.kreal))
                self.kreal.append(c)
            self.kchan[c] = ids[-1]
            k = np.cumsum(back)
            kchan[idx] = np.asarray(ids, dtype=I64)[k]
            at_parts.append(idx[back])
            old_parts.append(np.asarray(ids[:-1], dtype=I64))
        if not at_parts:
            empty = np.zeros(0, dtype=I64)
            return kchan, empty, empty
        at, old = np.concatenate(at_parts), np.concatenate(old_parts)
        order = np.argsort(at, kind="stable")
        return kchan, at[order], old[order]


def step(
    kstate: kernel.State,
    size: int,
    mode: int,
    op: NDArray[Any],
    kchan: NDArray[Any],
    group: NDArray[Any],
    no_group: NDArray[Any],
    hashes: NDArray[Any],
    ts: NDArray[Any],
    gkey: NDArray[Any],
    at: NDArray[Any],
    old: NDArray[Any],
    shape: kernel.Shape | None = None,
) -> tuple[kernel.Out, NDArray[Any]]:
    """:func:`kernel.step` on the chunk, each restart preceded by a clear of its old channel.

    Before each restart's row ``at``, a clear of the kernel channel it ends (``old``):
    the old stream's live blocks are dropped as a clear drops them. The output is the
    chunk's rows' (drops at the restart's row), and per drop whether a restart made it.
    """
    if len(at) == 0:
        out = kernel.step(
            kstate, op, kchan, group, no_group, hashes, ts, gkey, size, shape,
            mode=mode,
        )  # fmt: skip
        return out, np.zeros(len(out.drop_row), dtype=bool)
    n, r = len(op), len(at)
    ins = np.insert
    out = kernel.step(
        kstate,
        ins(op, at, kernel.CLEAR),
        ins(kchan, at, old),
        ins(group, at, 0),
        ins(no_group, at, False),
        ins(hashes, at, 0),
        ins(ts, at, ts[at]),
        ins(gkey, at, 0),
        size,
        None if shape is None else inserted(shape, at),
        mode=mode,
    )
    rows = np.arange(n) + np.searchsorted(at, np.arange(n), side="right")
    orig = np.empty(n + r, dtype=I64)
    orig[rows] = np.arange(n)
    orig[at + np.arange(r)] = at
    synthetic = np.zeros(n + r, dtype=bool)
    synthetic[at + np.arange(r)] = True
    return kernel.Out(
        out.what[rows],
        out.ts[rows],
        out.gkey[rows],
        out.distance[rows],
        orig[out.drop_row],
        out.drop_gkey,
        out.drop_n,
        out.drop_keys,
        out.note[rows],
        out.back_blocks[rows],
        out.back_tokens[rows],
        out.back_gkey[rows],
    ), synthetic[out.drop_row]


def live_frame(kstate: kernel.State, kreal: list[int]) -> pl.DataFrame:
    """The live entries (channel_id, group_idx, hash, gkey), a key's oldest first."""
    kchan, group, no_group, h, _ts, gkey = kstate.live_entries()
    chan = np.asarray(kreal, dtype=I64)[kchan] if len(kchan) else kchan
    g = pl.Series("group_idx", group, dtype=pl.Int64)
    if no_group.any():
        g = g.scatter(np.flatnonzero(no_group), None)
    return pl.DataFrame(
        {
            "channel_id": pl.Series(chan, dtype=pl.UInt32),
            "group_idx": g,
            "hash": h,
            "gkey": pl.Series(gkey, dtype=pl.UInt32),
        }
    )


def count_restarts(
    restarts: dict[int, list[int]],
    channel: NDArray[Any],
    at: NDArray[Any],
    out: kernel.Out,
    restart_drop: NDArray[Any],
) -> None:
    """Add the chunk's restarts (rows ``at``) and the live blocks they dropped, per channel."""
    if not len(at):
        return
    per_chan = np.bincount(
        channel[out.drop_row[restart_drop]],
        weights=out.drop_n[restart_drop],
        minlength=int(channel.max()) + 1,
    )
    for c in channel[at].tolist():
        restarts.setdefault(c, [0, 0])[0] += 1
    for c in set(channel[at].tolist()):
        restarts[c][1] += int(per_chan[c])


__all__ = ["KernelChannels", "count_restarts", "live_frame", "step"]
