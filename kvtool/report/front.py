"""A chunk's work before the state kernel, and running it ahead in the decode thread.

:func:`front` is everything :meth:`kvtool.report.builder.ReportBuilder.add` does to a
chunk before the kernel's step: the rows' times, hashes, groups and kernel channels, the
attribution of removes without ``group_idx``, the report rows (``gkey``) and the shape
(:class:`kvtool.report.shape.ShapeLearner`). Of the builder's state it reads and writes
only its own part (the row numbering, time spans, registry, grouped channels, kernel
channels, shapes), never the kernel's, except for the attribution.

So a chunk without an unattributed-remove candidate (a remove with a hash and no
``group_idx``: what the attribution resolves through the live state, and what the kernel
may find orphaned and move to the ``unattributed`` row) is a *plain* chunk: its front
needs no kernel state, and its back (:meth:`ReportBuilder.back`) touches no front state.
:class:`Ahead` runs the fronts of plain chunks in the producer thread (the decode
prefetch), so the consumer's thread is left the kernel and what reads its output. A
chunk that is not plain is handed on as it is and added whole on the consumer's thread,
after every chunk before it and before any front after it: the same order of every
state change as a run of :meth:`ReportBuilder.add` alone, so the same report.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

import polars as pl

from kvtool.columns import CLEARED, REMOVED, STORED, np
from kvtool.report import attribution, kernel
from kvtool.report.arrays import I64, ReportRow, int_column, plausible_ts_array, tier_keys
from kvtool.report.restarts import live_frame
from kvtool.report.rows import gkeys
from kvtool.report.timeline import ts_ns

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.builder import ReportBuilder
    from kvtool.report.lifebound import Samples


class Front(NamedTuple):
    """A chunk made ready for the kernel (:func:`front`)."""

    chunk: pl.DataFrame  # as read (what the --by splits are fed: keys as on the wire)
    df: pl.DataFrame  # as the kernel keys it (each medium's hashes salted: arrays.tier_keys)
    is_clear: NDArray[Any]
    is_store: NDArray[Any]
    is_remove: NDArray[Any]
    ts: NDArray[Any]
    hashes: NDArray[Any]  # the kernel's keys (each medium's salted: arrays.tier_keys)
    wire_hashes: NDArray[Any]  # as on the wire (distinct_hashes)
    has_hash: NDArray[Any]
    group: NDArray[Any]
    no_group: NDArray[Any]
    channel: NDArray[Any]
    unattributed_orphan: NDArray[Any]
    gkey: NDArray[Any]
    op: NDArray[Any]
    shape: kernel.Shape
    kchan: NDArray[Any]
    at: NDArray[Any]
    old: NDArray[Any]
    size: int  # report rows registered after this chunk's
    rows: dict[int, ReportRow]  # gkey -> (group_idx, kind, window), as of ``size``


class Post(NamedTuple):
    """A chunk after the kernel (:meth:`ReportBuilder.kernel_step`), for ``after``."""

    front: Front  # its size and rows updated when an orphan remove moved rows
    gkey: NDArray[Any]  # the rows' report rows after the kernel (orphans moved)
    out: kernel.Out
    restart_drop: NDArray[Any]
    moved: NDArray[Any]
    samples: Samples


def plain(df: pl.DataFrame) -> bool:
    """Whether the chunk has no remove with a hash and no ``group_idx`` (see the module)."""
    if "group_idx" not in df.columns or df["group_idx"].null_count() == 0:
        return True
    tc = df["type_code"].to_numpy()
    candidate = df["group_idx"].is_null().to_numpy() & (tc != STORED) & (tc != CLEARED)
    if "hash" in df.columns and df["hash"].null_count():
        candidate &= df["hash"].is_not_null().to_numpy()
    return not bool(candidate.any())


def front(b: ReportBuilder, df: pl.DataFrame) -> Front:
    """The chunk's work before the kernel, on ``b``'s front state (see the module).

    Args:
        b: The builder.
        df: A non-empty chunk of :func:`kvtool.columns.iter_annotated`, in stream order.
    """
    chunk = df
    n = df.height
    first_row = b.rows
    b.rows += n
    tc = df["type_code"].to_numpy()
    is_clear = tc == CLEARED
    is_store = tc == STORED
    is_remove = tc == REMOVED
    ts = plausible_ts_array(df)
    lo, hi = float(ts.min()), float(ts.max())
    b.first_ts = lo if b.first_ts is None else min(b.first_ts, lo)
    b.last_ts = hi if b.last_ts is None else max(b.last_ts, hi)
    log_time = df["log_time"]
    rx_lo, rx_hi = int(log_time.min()), int(log_time.max())  # type: ignore[arg-type]
    b.first_rx = rx_lo if b.first_rx is None else min(b.first_rx, rx_lo)
    b.last_rx = rx_hi if b.last_rx is None else max(b.last_rx, rx_hi)
    if b.origin_ns is None and b.every_ns is not None:
        b.origin_ns = int(log_time[0]) if b.clock == "receive" else ts_ns(ts[0])
    wire_hashes, _ = int_column(df, "hash")  # distinct_hashes: keys as on the wire
    if b.media_apart:
        df = tier_keys(df)  # each medium is a cache of its own (arrays.tier_keys)
    hashes, hash_null = int_column(df, "hash")
    has_hash = ~hash_null if hash_null is not None else np.ones(n, dtype=bool)
    group, group_null = int_column(df, "group_idx")
    no_group = group_null if group_null is not None else np.zeros(n, dtype=bool)
    channel = np.asarray(df["channel_id"].to_numpy(), dtype=I64)
    # The channels whose stores carry group_idx: there a remove without one needs the
    # (hash -> group) state; elsewhere -- old vLLM, no group_idx at all -- it is keyed
    # by (channel, no group, hash) like its stores.
    grouped = channel[is_store & ~no_group]
    if len(grouped):
        b.grouped_channels |= set(np.flatnonzero(np.bincount(grouped)).tolist())
    unattributed = unattributed_orphan = np.zeros(n, dtype=bool)
    if group_null is not None and (is_remove & no_group & has_hash).any():
        seq_now, _ = int_column(df, "seq")
        restart = b.channels.restarts_at(channel, seq_now)
        df = _attribute(
            b, df.with_columns(row=pl.int_range(first_row, first_row + n), restart=restart)
        )
        if "unattributed" in df.columns:
            group, group_null = int_column(df, "group_idx")
            no_group = group_null if group_null is not None else np.zeros(n, dtype=bool)
            unattributed = df["unattributed"].to_numpy() & is_remove
            unattributed_orphan = df["unattributed_orphan"].to_numpy()
    gkey = gkeys(b.registry, df, is_clear, unattributed, group, no_group, by_medium=b.by_medium)
    block = has_hash & ~is_clear & ~unattributed
    op = np.zeros(n, dtype=np.int8)
    op[block & is_store] = kernel.STORE
    op[block & ~is_store] = kernel.REMOVE
    op[is_clear] = kernel.CLEAR
    seq, _ = int_column(df, "seq")
    shape = b.shapes.shape(df, channel, seq, group, no_group, is_store, block)
    kchan, at, old = b.channels.split(channel, seq)
    rows: dict[int, ReportRow] = {i: (k[0], k[1], k[2]) for k, i in b.registry.items()}
    return Front(
        chunk, df, is_clear, is_store, is_remove, ts, hashes, wire_hashes, has_hash, group,
        no_group, channel, unattributed_orphan, gkey, op, shape, kchan, at, old,
        len(b.registry), rows,
    )  # fmt: skip


def _attribute(b: ReportBuilder, df: pl.DataFrame) -> pl.DataFrame:
    """Resolve removes without group_idx on grouped channels (see attribution)."""
    if not attribution.needs_resolution(df, b.grouped_channels):
        return df
    kind_of_gkey = {i: (key[1], key[2]) for key, i in b.registry.items()}
    live = live_frame(b.kstate, b.channels.kreal)
    resolved, ambiguous = attribution.resolve_ungrouped(
        df, live, b.grouped_channels, kind_of_gkey, b.group_kind
    )
    b.ambiguous_removes += ambiguous
    found = pl.col("resolved").fill_null(False)
    return df.join(resolved, on="row", how="left", maintain_order="left").with_columns(
        kind=pl.when(found).then(pl.col("resolved_kind")).otherwise(pl.col("kind")),
        sliding_window=pl.when(found)
        .then(pl.col("resolved_window"))
        .otherwise(pl.col("sliding_window")),
        group_idx=pl.when(found).then(pl.col("resolved_group")).otherwise(pl.col("group_idx")),
        unattributed=pl.col("unattributed").fill_null(False),
        unattributed_orphan=pl.col("unattributed_orphan").fill_null(False),
    )


class Ahead:
    """Fronts of plain chunks in the producer's thread, the rest in the consumer's.

    :meth:`produce` wraps the chunks in the producer thread (inside
    :func:`kvtool.columns.prefetch`); the consumer passes each item it gets to
    :meth:`add`, which steps the kernel and hands what reads its output
    (:meth:`ReportBuilder.after`) to one more thread, in chunk order. A non-plain chunk
    goes on as it is: it is added whole once the chunks before it are, and the producer
    waits until then before it fronts the next chunk. :meth:`close` waits for the last
    chunk's ``after`` (and raises what a thread raised).

    Args:
        builder: The builder fed (its fronts here, its kernel by :meth:`add`).
    """

    def __init__(self, builder: ReportBuilder) -> None:
        self.builder = builder
        self._cond = threading.Condition()
        self._waiting = 0  # non-plain chunks handed on, not yet added
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtool-after")
        self._pending: deque[Future[None]] = deque()

    def produce(self, chunks: Iterator[pl.DataFrame]) -> Iterator[Front | pl.DataFrame]:
        """The chunks, each plain non-empty one as its :class:`Front` (producer thread)."""
        for df in chunks:
            with self._cond:
                while self._waiting and not self._closed:
                    self._cond.wait(0.1)
                if self._closed:
                    return
                whole = df.height == 0 or not plain(df)
                self._waiting += whole
            yield df if whole else front(self.builder, df)

    def add(self, item: Front | pl.DataFrame) -> pl.DataFrame:
        """Add an item of :meth:`produce` to the builder (consumer thread); its chunk."""
        if isinstance(item, Front):
            post = self.builder.kernel_step(item)
            self._drain()  # one chunk's after at a time (each holds a chunk's arrays)
            self._pending.append(self._pool.submit(self.builder.after, post))
            return item.chunk
        try:
            self._drain()
            self.builder.add(item)
        finally:
            with self._cond:
                self._waiting -= 1
                self._cond.notify_all()
        return item

    def _drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        """Let a waiting producer stop; wait for the chunks' ``after`` (raising its error)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        try:
            self._drain()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["Ahead", "Front", "Post", "front", "plain"]
