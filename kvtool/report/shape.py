"""Each row's batch, event and event shape, for the state kernel's issue 21 rules.

:class:`ShapeLearner` numbers batches across chunks and learns each (channel, group)'s
block size (metadata, else from its multi-hash stores), carrying that between chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.report import announce, attribution, kernel
from kvtool.report.arrays import I64, PREFIX_KINDS, int_column, mark_changes, pack_keys

if TYPE_CHECKING:
    from numpy.typing import NDArray


class ShapeLearner:
    """Batches numbered so far, and per (channel, group) the block size and Mamba flag.

    Args:
        group_kind: As for :class:`kvtool.report.builder.ReportBuilder` (its annotator,
            when it has one, gives each group's metadata shape).
    """

    def __init__(self, group_kind: attribution.GroupKind | None) -> None:
        self.group_kind = group_kind
        # Issue 21: batches numbered so far, and per (channel, group) the block size and
        # whether the channel has a Mamba group (metadata, else learned: shape).
        self._batches = 0
        self._group_shape: dict[tuple[int, int, bool], tuple[int, bool]] = {}
        self._learned_bs: dict[tuple[int, int, bool], int] = {}
        # Hit announcements (R6): per channel, its groups and its last batch number.
        self._announce_ctx = announce.ChannelContext()

    def shape(
        self,
        df: pl.DataFrame,
        channel: NDArray[Any],
        seq: NDArray[Any],
        group: NDArray[Any],
        no_group: NDArray[Any],
        is_store: NDArray[Any],
        counted: NDArray[Any],
    ) -> kernel.Shape:
        """Each row's batch, event and the event's shape, for the kernel's issue 21 rules.

        A batch is a run of rows of one message (channel, seq and receive time), numbered
        across chunks. A group's block size is its metadata's, else the smallest
        ``len(token_ids) / hashes`` of its multi-hash stores so far (exact for full
        attention; partial entries have one hash). For hit announcements (R6): the
        event's parent and ``origin`` (when the chunk has those columns), the group's
        window, the groups an announcement covers (the channel's metadata's, else those
        of its ``counted`` rows so far) and the channel's previous batch.
        """
        n = len(channel)
        log_time = df["log_time"].to_numpy()
        change = np.zeros(n, dtype=bool)
        change[0] = True
        for values in (channel, seq, log_time):
            mark_changes(values, change)
        batch = np.cumsum(change) + (self._batches - 1)
        self._batches = int(batch[-1]) + 1
        event = np.asarray(df["event_index"].fill_null(-1).to_numpy(), dtype=I64)
        ev_change = np.zeros(n, dtype=bool)
        ev_change[0] = True
        mark_changes(event, ev_change)
        ev_change |= change
        starts = np.flatnonzero(ev_change)
        of = np.cumsum(ev_change) - 1
        lengths = np.diff(np.append(starts, n))
        count = lengths[of]
        last = np.ones(n, dtype=bool)
        last[:-1] = ev_change[1:]
        tokens, _ = int_column(df, "tokens")
        tokens = tokens[starts][of]
        kind = df["kind"]
        flags = np.zeros(n, dtype=np.int8)
        flags[(kind == "mamba").fill_null(False).to_numpy()] |= kernel.FLAG_MAMBA
        window = df["sliding_window"].is_not_null() | kind.str.contains("sliding").fill_null(False)
        flags[window.to_numpy()] |= kernel.FLAG_WINDOW
        # Per event (a store's rows share its group; a remove's block size is not read):
        # its (channel, group)'s block size, and whether the channel has a Mamba group.
        ev_key = pack_keys([channel[starts], group[starts], no_group[starts].astype(I64)])
        _u, first, inv = np.unique(ev_key, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        annotator = getattr(self.group_kind, "__self__", None)
        # A multi-hash store's tokens per hash (else "none").
        none = np.iinfo(np.int64).max
        ev_tokens, ev_count = tokens[starts], lengths
        per_hash = np.where(is_store[starts] & (ev_count >= 2), ev_tokens // ev_count, none)
        ev_bs = np.zeros(len(starts), dtype=I64)
        ev_mamba = np.zeros(len(starts), dtype=bool)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(first) + 1))
        for j, r in enumerate(starts[first].tolist()):
            key = (int(channel[r]), int(group[r]), bool(no_group[r]))
            known = self._group_shape.get(key)
            if known is None:
                meta: tuple[int, bool] = (0, False)
                if annotator is not None and hasattr(annotator, "group_shape"):
                    meta = annotator.group_shape(key[0], None if key[2] else key[1])
                known = self._group_shape[key] = meta
            evs = order[bounds[j] : bounds[j + 1]]  # the key's events, in stream order
            size, mamba = known
            if size:
                ev_bs[evs] = size
            else:
                # Learned from the stores before each event (any chunking gives the same).
                run = np.minimum(
                    np.minimum.accumulate(per_hash[evs]), self._learned_bs.get(key, none)
                )
                self._learned_bs[key] = int(run[-1])
                ev_bs[evs] = np.where(run == none, 0, run)
            ev_mamba[evs] = mamba
        bs = ev_bs[of]
        flags[ev_mamba[of]] |= kernel.FLAG_CHANNEL_MAMBA
        flags[kind.is_in(PREFIX_KINDS).fill_null(False).to_numpy()] |= kernel.FLAG_PREFIX
        if "medium" in df.columns:
            medium = df["medium"]
            tier = ~(medium.is_null() | (medium == "GPU").fill_null(False))
            flags[tier.to_numpy()] |= kernel.FLAG_TIER
        win, _ = int_column(df, "sliding_window")
        if "parent" in df.columns:
            parent, parent_null = int_column(df, "parent")
            has_parent = ~parent_null if parent_null is not None else np.ones(n, dtype=bool)
        else:
            parent, has_parent = np.zeros(n, dtype=I64), np.ones(n, dtype=bool)
        if "origin" in df.columns:
            origin = np.asarray(df["origin"].fill_null(0).to_numpy(), dtype=np.int8)
        else:
            origin = np.zeros(n, dtype=np.int8)
        want, pbatch = announce.channel_context(
            channel, batch, group, no_group, counted, self._announce_ctx, annotator
        )
        return kernel.Shape(
            batch, event, tokens, count, last, bs, flags,
            has_parent, parent, origin, win, want, pbatch,
        )  # fmt: skip


__all__ = ["ShapeLearner"]
