"""Rows of the flat table from decoded columns (:class:`_Pending`, :func:`_build`).

Each block's events are taken apart into columns right away (one C-level pass per field,
while they are in the CPU cache), whether the numba scanner or the msgspec path decoded
them; rows are then built from the columns with numpy: one per hash, one per clear, one
with a null ``hash`` per store of zero hashes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import chain
from typing import Any

import polars as pl

try:  # optional: numpy makes the byte-level parsing of hashes and token counts faster
    import numpy as np
except ImportError:  # pragma: no cover - exercised by tests that hide numpy
    np = None  # type: ignore[assignment]
from kvtool.columns.base import (
    _LABELS,
    EVENT_TYPE,
    EVENT_TYPE_NAMES,
    EXTRA_SCHEMA,
    ORIGIN_CODES,
    STORED,
    TABLE_SCHEMA,
    ReadStats,
    _Codes,
    _Ints,
    _key,
)
from kvtool.columns.hashes import _block_sizes, _hash_columns, _np_headers, _np_joined, _parent_keys

_BATCH_SCHEMA = {
    "log_time": pl.Int64,
    "ts": pl.Float64,
    "seq": pl.Int64,
    "channel_id": pl.UInt32,
    "dp_rank": pl.Int64,
    "payload_rank": pl.Int64,
}


def _str_codes(values: list[str | None]) -> _Codes:
    """Encode strings as codes into their vocabulary (one value for all: no Python loop)."""
    n = len(values)
    if not n or values.count(values[0]) == n:
        one = values[0] if n else None
        words = [] if one is None else [one]
        return np.full(n, -1 if one is None else 0, dtype=np.int32), words
    vocab: dict[str | None, int] = {}
    codes = [vocab.setdefault(v, len(vocab)) for v in values]
    arr = np.array(codes, dtype=np.int32)
    if None in vocab:
        none = vocab[None]
        arr[arr == none] = -1
        arr[arr > none] -= 1
    return arr, [w for w in vocab if w is not None]


def _int_column(values: list[Any]) -> _Ints:
    """Nullable int64 values (an int no vLLM sends, outside int64, becomes null)."""
    s = pl.Series(values, dtype=pl.Int64, strict=False)
    if not s.null_count():
        return s.to_numpy(), np.ones(len(s), dtype=bool)
    return s.fill_null(0).to_numpy(), s.is_not_null().to_numpy()


def _merge_codes(parts: list[_Codes]) -> tuple[Any, list[str | None]]:
    """One code array over one vocabulary; None's code is ``len(vocab) - 1``."""
    vocab: dict[str, int] = {}
    out = []
    for codes, words in parts:
        remap = np.array([vocab.setdefault(w, len(vocab)) for w in words] + [-1], dtype=np.int32)
        out.append(remap[codes] if len(words) else np.full(len(codes), -1, dtype=np.int32))
    codes = np.concatenate(out) if out else np.zeros(0, dtype=np.int32)
    codes = np.where(codes < 0, len(vocab), codes)
    return codes, [*vocab, None]


def _nullable(values: Any, valid: Any) -> pl.Series:
    """An Int64 series, null where not ``valid``."""
    s = pl.Series(values, dtype=pl.Int64)
    if valid.all():
        return s
    return s.scatter(np.flatnonzero(~valid), None)


class _Pending:
    """Batches decoded but not yet turned into a table chunk, as columns.

    Per batch: receive time, ts, seq, channel, rank and event count. Per event: type
    code, hash count (and all the keys), ``group_idx`` and ``medium`` (codes into a
    vocabulary). Per store (the only type with them): ``len(token_ids)``, kind and
    window. The msgspec path (:meth:`add`) and the numba scanner (:meth:`add_scanned`)
    append the same numpy columns.
    """

    def __init__(self, media: bool = True) -> None:
        self.want_media = media  # False: the caller reads no ``medium`` (one pass fewer)
        self.log_time: list[int] = []
        self.ts: list[float] = []
        self.seq: list[int] = []
        self.chan: list[int] = []
        self.rank: list[int | None] = []
        self.payload_rank: list[int | None] = []
        self.n_events: list[int] = []
        self.n_ev = 0
        self.types: list[Any] = []
        self.counts: list[Any] = []
        self.keys: list[Any] = []
        self.invalid: list[int] = []
        self.groups: list[_Ints] = []
        self.media: list[_Codes] = []
        self.tokens: list[Any] = []
        self.kinds: list[_Codes] = []
        self.windows: list[_Ints] = []
        self.parents: list[_Ints] = []
        self.origins: list[_Codes] = []
        self.block_sizes: list[_Ints] = []

    def __len__(self) -> int:
        return len(self.ts)

    def _batches(
        self,
        ts: list[float],
        n_events: list[int],
        log_time: list[int],
        seq: list[int],
        chan: list[int],
        rank: list[int | None],
        payload_rank: list[int | None],
    ) -> None:
        self.log_time += log_time
        self.payload_rank += payload_rank
        self.seq += seq
        self.chan += chan
        self.rank += rank
        self.ts += ts
        self.n_events += n_events

    def add(
        self,
        batches: list[Any],
        log_time: list[int],
        seq: list[int],
        chan: list[int],
        rank: list[int | None],
        payload_rank: list[int | None],
    ) -> None:
        """Take a block of msgspec-decoded batches apart into the columns.

        One C-level pass per field; the raw hash and token lists are parsed here, while
        the block's bytes are in cache, with small arrays numpy allocates without new
        pages (a whole chunk's temporaries would be fresh memory every time).
        """
        evl = [b.events for b in batches]
        self._batches(
            [b.ts for b in batches], list(map(len, evl)), log_time, seq, chan, rank, payload_rank
        )
        events = list(chain.from_iterable(evl))
        base = self.n_ev
        self.n_ev += len(events)
        types = np.frombuffer(bytes([e.type_code for e in events]), dtype=np.uint8)
        self.types.append(types)
        counts, keys, invalid = _hash_columns([e.block_hashes for e in events])
        self.counts.append(counts)
        self.keys.append(keys)
        if invalid:
            self.invalid += [base + i for i in invalid]
        self.groups.append(_int_column([e.group_idx for e in events]))
        if self.want_media:
            self.media.append(_str_codes([e.medium for e in events]))
        at = np.flatnonzero(types == STORED).tolist()
        stores = events if len(at) == len(events) else list(map(events.__getitem__, at))
        if stores:
            # len(token_ids), read from each list's msgpack header.
            a, off, _lens = _np_joined([e.token_ids for e in stores])
            n_tok, _hl = _np_headers(a, off)
            self.tokens.append(np.maximum(n_tok, 0))
            self.kinds.append(_str_codes([e.kv_cache_spec_kind for e in stores]))
            self.windows.append(_int_column([e.kv_cache_spec_sliding_window for e in stores]))
            self.parents.append(_parent_keys([e.parent_block_hash for e in stores]))
            self.origins.append(_str_codes([e.origin for e in stores]))
            self.block_sizes.append(_block_sizes([e.block_size for e in stores]))

    def add_scanned(
        self,
        sc: Any,
        b: slice,
        e: slice,
        k: slice,
        log_time: list[int],
        seq: list[int],
        chan: list[int],
        rank: list[int | None],
        payload_rank: list[int | None],
    ) -> None:
        """Append payloads ``b`` of a :func:`kvtool.scan.scan` (their events ``e``, keys ``k``)."""
        ts, n_events = sc.ts[b].tolist(), sc.n_events[b].tolist()
        self._batches(ts, n_events, log_time, seq, chan, rank, payload_rank)
        types = sc.type_code[e]
        self.n_ev += len(types)
        self.types.append(types)
        self.counts.append(sc.n_hashes[e])
        self.keys.append(sc.keys[k])
        g = sc.group_idx[e]
        self.groups.append((g, g != scan_null()))
        if self.want_media:
            self.media.append((sc.medium[e], sc.vocab))
        store = types == STORED
        if store.any():
            all_stores = bool(store.all())

            def pick(a: Any) -> Any:
                return a[e] if all_stores else a[e][store]

            self.tokens.append(pick(sc.tokens))
            self.kinds.append((pick(sc.kind), sc.vocab))
            w = pick(sc.window)
            self.windows.append((w, w != scan_null()))
            self.parents.append((pick(sc.parent), pick(sc.has_parent).astype(bool)))
            self.origins.append((pick(sc.origin), sc.vocab))
            bs = pick(sc.block_size)
            self.block_sizes.append((bs, bs != scan_null()))

    def medium_column(self, keep: Any, row_event: Any, n_rows: int) -> pl.Series:
        """The ``medium`` of each row (constant when every event has the same one)."""
        if not self.media:
            return pl.Series([None], dtype=pl.String).new_from_index(0, n_rows)
        codes, vocab = _merge_codes(self.media)
        if keep is not None:
            codes = codes[keep]
        if not len(codes) or codes.min() == codes.max():
            one = vocab[int(codes[0])] if len(codes) else None
            return pl.Series([one], dtype=pl.String).new_from_index(0, n_rows)
        return pl.Series(vocab, dtype=pl.String).gather(np.take(codes, row_event))


def scan_null() -> Any:
    """The scanner's null marker of ints (:data:`kvtool.scan.NULL`)."""
    from kvtool import scan

    return scan.NULL


def _to_rows(s: pl.Series, index: Any) -> pl.Series:
    """The value of ``s`` at each of ``index`` (numpy unless it has nulls)."""
    if s.null_count():
        return s.gather(index)
    return pl.Series(np.take(s.to_numpy(), index), dtype=s.dtype)


def _build(
    p: _Pending,
    first_event: int,
    stats: ReadStats,
    wanted: tuple[str, ...] | None = None,
    streams: dict[int, tuple[str, str]] | None = None,
) -> pl.DataFrame:
    """Turn pending batches into one table chunk (only the ``wanted`` columns, if given).

    ``streams`` (``channel_id`` → endpoint, topic) keys the problems it notes.

    numpy over whole columns (no Python per event or hash): each event-level or
    batch-level column is taken to rows by one index.
    """
    n_batch = len(p)
    n_per_batch = np.array(p.n_events, dtype=np.int64)
    batches = pl.DataFrame(
        {
            "log_time": p.log_time,
            "ts": p.ts,
            "seq": p.seq,
            "channel_id": p.chan,
            "dp_rank": p.rank,
            "payload_rank": p.payload_rank,
        },
        schema=_BATCH_SCHEMA,
        strict=False,  # an int no vLLM sends (outside int64) becomes null, not an error
    )
    types = np.concatenate(p.types) if p.types else np.zeros(0, dtype=np.uint8)
    counts = np.concatenate(p.counts) if p.counts else np.zeros(0, dtype=np.int64)
    keys = np.concatenate(p.keys) if p.keys else np.zeros(0, dtype=np.int64)
    g_val = np.concatenate([v for v, _m in p.groups]) if p.groups else np.zeros(0, np.int64)
    g_ok = np.concatenate([m for _v, m in p.groups]) if p.groups else np.zeros(0, bool)
    # Each store's place among the stores; n_store (the null appended to kinds and
    # windows below) for the other types.
    n_store = sum(len(t) for t in p.tokens)
    store_of = np.full(len(types), n_store, dtype=np.int64)
    store_of[types == STORED] = np.arange(n_store, dtype=np.int64)
    ev_kept = None
    if p.invalid:
        # block_hashes that is not a list of hashes: the event is skipped (as the protocol
        # decoder would), its neighbours kept.
        batch_of = np.repeat(np.arange(n_batch, dtype=np.int64), n_per_batch)
        seqs = batches["seq"]
        for i in p.invalid[:5]:
            b = int(batch_of[i])
            stats.note(
                f"seq {seqs[b]}: malformed {EVENT_TYPE_NAMES[types[i]]} "
                "(block_hashes is not a list of hashes)",
                _key(streams or {}, p.log_time[b], p.chan[b], p.seq[b]),
            )
        stats.skipped_events += len(p.invalid)
        keep = np.ones(len(types), dtype=bool)
        keep[p.invalid] = False
        types, counts, store_of = types[keep], counts[keep], store_of[keep]
        g_val, g_ok = g_val[keep], g_ok[keep]
        n_per_batch = np.bincount(batch_of[keep], minlength=n_batch)
        ev_kept = keep
    n_ev = len(types)
    is_store = types == STORED
    # event -> rows: one per hash, one for an event without hashes.
    rows_per_event = np.maximum(counts, 1)
    ends = np.cumsum(rows_per_event)
    row_start = ends - rows_per_event
    n_rows = int(ends[-1]) if n_ev else 0
    batch_rows = np.concatenate(([0], ends))[np.cumsum(n_per_batch)]
    rows_per_batch = np.diff(batch_rows, prepend=0)
    row_event = np.repeat(np.arange(n_ev, dtype=np.int64), rows_per_event)
    row_batch = np.repeat(np.arange(n_batch, dtype=np.int64), rows_per_batch)

    # Stores alone carry token_ids, kind and window (the other types: 0, null, null).
    tokens = np.zeros(n_rows, dtype=np.int64)
    if n_store:
        tokens[row_start[is_store]] = np.concatenate(p.tokens)[store_of[is_store]]
    store_rows = np.take(store_of, row_event)

    def kind_rows() -> pl.Series:
        codes, vocab = _merge_codes(p.kinds)
        codes = np.append(codes, len(vocab) - 1)  # the null of the other types
        return pl.Series(vocab, dtype=pl.String).gather(np.take(codes, store_rows))

    def window_rows() -> pl.Series:
        w_val = np.concatenate([v for v, _m in p.windows] + [np.zeros(1, np.int64)])
        w_ok = np.concatenate([m for _v, m in p.windows] + [np.zeros(1, bool)])
        return _nullable(np.take(w_val, store_rows), np.take(w_ok, store_rows))

    def parent_rows() -> pl.Series:
        v = np.concatenate([v for v, _m in p.parents] + [np.zeros(1, np.int64)])
        ok = np.concatenate([m for _v, m in p.parents] + [np.zeros(1, bool)])
        return _nullable(np.take(v, store_rows), np.take(ok, store_rows))

    def origin_rows() -> pl.Series:
        codes, vocab = _merge_codes(p.origins)
        table = np.array([ORIGIN_CODES.get(str(v), 0) for v in vocab] or [0], dtype=np.int8)
        codes = np.append(codes, len(vocab) - 1)  # the other types: none
        return pl.Series(np.take(table, np.take(codes, store_rows)), dtype=pl.Int8)

    def block_size_rows() -> pl.Series:
        v = np.concatenate([v for v, _m in p.block_sizes] + [np.zeros(1, np.int64)])
        ok = np.concatenate([m for _v, m in p.block_sizes] + [np.zeros(1, bool)])
        return _nullable(np.take(v, store_rows), np.take(ok, store_rows))

    if n_rows == len(keys):
        hash_col = pl.Series(keys, dtype=pl.Int64)
    else:
        has = np.take(counts > 0, row_event)
        full = np.zeros(n_rows, dtype=np.int64)
        full[has] = keys
        hash_col = pl.Series(full, dtype=pl.Int64).scatter(np.flatnonzero(~has), None)
    # Each column is made only if wanted (a worker's consumer may read only some).
    make: dict[str, Callable[[], pl.Series]] = {
        "type_code": lambda: pl.Series(np.take(types, row_event), dtype=pl.UInt8),
        "group_idx": lambda: _nullable(np.take(g_val, row_event), np.take(g_ok, row_event)),
        "kind": kind_rows,
        "sliding_window": window_rows,
        "medium": lambda: p.medium_column(ev_kept, row_event, n_rows),
        "tokens": lambda: pl.Series(tokens, dtype=pl.Int64),
        "block_count": lambda: pl.Series(
            np.take(counts.astype(np.int32), row_event), dtype=pl.Int32
        ),
        **{c: partial(_to_rows, batches[c], row_batch) for c in _BATCH_SCHEMA},
        "event_index": lambda: pl.Series(
            row_event + first_event if first_event else row_event, dtype=pl.Int64
        ),
        "hash": lambda: hash_col,
        "block_index": lambda: pl.Series(
            (np.arange(n_rows, dtype=np.int64) - np.take(row_start, row_event)).astype(np.int32),
            dtype=pl.Int32,
        ),
    }
    extra: dict[str, Callable[[], pl.Series]] = {"parent": parent_rows, "origin": origin_rows}
    on_request: dict[str, Callable[[], pl.Series]] = {"block_size": block_size_rows}
    df = pl.DataFrame(
        {c: f() for c, f in make.items() if wanted is None or c in wanted}
        | {c: f() for c, f in extra.items() if wanted is None or c in wanted}
        | {c: f() for c, f in on_request.items() if wanted is not None and c in wanted}
    )
    stats.rows += n_rows
    stats.events += n_ev
    return df


def _finish(df: pl.DataFrame, stats: ReadStats, labels: bool) -> pl.DataFrame:
    if not labels:
        have = set(df.columns)  # a worker may have returned only some (RawChunk.keep)
        return df.select(
            [c for c in (*TABLE_SCHEMA, *EXTRA_SCHEMA) if c not in _LABELS and c in have]
            + ["type_code"]
        )
    names = {cid: (ref.recording, ref.info.name) for cid, ref in stats.channels.items()}
    recs = pl.DataFrame(
        {
            "channel_id": list(names),
            "recording": [v[0] for v in names.values()],
            "channel": [v[1] for v in names.values()],
        },
        schema={"channel_id": pl.UInt32, "recording": pl.String, "channel": pl.String},
    )
    df = df.join(recs, on="channel_id", how="left", maintain_order="left").with_columns(
        type=pl.col("type_code")
        .cast(pl.Int64)
        .replace_strict([0, 1, 2], list(EVENT_TYPE_NAMES), return_dtype=EVENT_TYPE)
    )
    return df.select([*TABLE_SCHEMA, "type_code"])
