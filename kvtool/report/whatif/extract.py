"""What-if input: each pool's event order as numpy arrays, built once from the recordings.

:class:`PoolFeed` takes the input's raw chunks (:class:`kvtool.columns.RawChunk`, the
report's own read: with ``--what-if`` the report hands each chunk it reads to the feed,
so the file is read once) and scans them with THE numba decoder, the report's
(:func:`kvtool.scan.scan`: its parent and block size columns too), into per-pool
(channel, rank) numpy pieces; a payload that decoder does not take goes through msgspec
(:mod:`kvtool.report.whatif.lean`, the reference). :func:`extract_pools` reads the
input itself for callers without a report. Everything after that is numpy and the
numba kernel :func:`kvtool.report.whatif.build.build`, which interns (group, hash) keys,
rebuilds requests from parent hashes and lays out the ops
:func:`kvtool.report.whatif.kernel.simulate` replays.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import numpy.typing as npt

from kvtool.annotate import Annotation, ChannelRule, event_rank, resolve_groups
from kvtool.errors import ProtocolError
from kvtool.inputs import resolve_annotation
from kvtool.protocol import hash_key
from kvtool.recording.format import channel_topic
from kvtool.replay import BatchFilter
from kvtool.report.whatif import lean
from kvtool.report.whatif.build import EV_CLEAR, EV_REMOVE, EV_STORE, build, intern
from kvtool.report.whatif.errors import WhatIfRefused
from kvtool.report.whatif.kernel import KIND_FULL, KIND_MAMBA, KIND_SLIDING
from kvtool.report.whatif.lean import CODES, count_arrays, parse_ints
from kvtool.scan import NULL, Scanned, scan

if TYPE_CHECKING:
    from kvtool.columns import RawChunk

I64 = npt.NDArray[np.int64]
PoolKey = tuple[str, int | None]

SLIDING_KINDS = frozenset({"sliding_window", "sliding_window_mla"})


def _hash_keys(raw: object) -> list[int]:
    """The keys of one raw ``block_hashes`` list (msgspec decodes it).

    Raises:
        WhatIfRefused: It is not a list of ints and bytes: the report skips such an event
            as malformed, and a prediction without it would be silently off.
    """
    try:
        hashes = msgspec.msgpack.decode(raw)  # type: ignore[call-overload]
    except msgspec.DecodeError as err:
        raise WhatIfRefused(f"what-if: an event's block_hashes is not msgpack ({err})") from err
    if hashes is None:
        return []
    if not isinstance(hashes, list) or not all(
        isinstance(h, int | bytes) and not isinstance(h, bool) for h in hashes
    ):
        raise WhatIfRefused(
            "what-if: an event's block_hashes is not a list of int or bytes hashes (the report "
            "skips it as malformed); the eviction order is incomplete, so no prediction"
        )
    return [hash_key(h) for h in hashes]


@dataclass
class GroupInfo:
    """What the stores of one group said: kind, window and block size."""

    group_idx: int | None
    kind: str | None = None
    sliding_window: int | None = None
    block_size: int = 0


@dataclass
class PoolStream:
    """One pool's event order, ready for :func:`kvtool.report.whatif.kernel.simulate`.

    Attributes:
        channel: Channel name.
        rank: Data-parallel rank (None when the stream carries none).
        groups: The pool's groups, in kernel position order.
        arrays: The kernel's input arrays by name.
        n_keys: Number of (group, hash) keys.
        removes_without_group: Removed blocks whose event had no ``group_idx``.
        stores_without_group: Stored blocks whose event had no ``group_idx``.
        seq_regressions: Times the publisher's seq went backwards (restarts or merges).
        clears: ``AllBlocksCleared`` events.
        requests: Requests rebuilt from parent hashes.
        batches: Batches of the pool.
    """

    channel: str
    rank: int | None
    groups: list[GroupInfo]
    arrays: dict[str, I64] = field(default_factory=dict)
    n_keys: int = 0
    removes_without_group: int = 0
    stores_without_group: int = 0
    seq_regressions: int = 0
    clears: int = 0
    requests: int = 0
    batches: int = 0


_NONE = -1  # group_idx None in the event rows
_RESTART = lean.restart()  # a publisher restart: an event row that clears the pool
_GROUP = attrgetter("group_idx")
_HASHES = attrgetter("block_hashes")
_PARENT = attrgetter("parent_block_hash")
_TOKENS = attrgetter("token_ids")
_KIND = attrgetter("kv_cache_spec_kind")
_WINDOW = attrgetter("kv_cache_spec_sliding_window")
_SIZE = attrgetter("block_size")
assert (lean.CODE_STORE, lean.CODE_REMOVE, lean.CODE_CLEAR) == (EV_STORE, EV_REMOVE, EV_CLEAR)


_FLUSH = 1 << 16
_NARROW_LIMIT = 2**31
"""Values below this fit the what-if's 32-bit columns (a larger input keeps 64 bits)."""
"""Events kept as Python objects before they are turned into arrays (bounds memory)."""


class _Columns:
    """One pool's events as flat rows: lean events per batch, arrays every ``_FLUSH``."""

    def __init__(self, channel: str, rank: int | None) -> None:
        self.channel = channel
        self.rank = rank
        self._reset()
        self.pieces: list[tuple[npt.NDArray[np.signedinteger[Any]], ...]] = []
        self.batches = 0
        self.last_seq: int | None = None
        self.seq_regressions = 0
        self.said: dict[int | None, tuple[object, object]] = {}
        self.sizes_seen: dict[int | None, int] = {}
        self.stored: set[int | None] = set()
        self.info: dict[int | None, GroupInfo] = {}

    def _reset(self) -> None:
        self.codes: list[int] = []
        self.groups: list[object] = []
        self.hraws: list[object] = []
        self.parents: list[object] = []
        self.traws: list[object] = []
        self.kinds: list[object] = []
        self.windows: list[object] = []
        self.sizes: list[object] = []
        self.sgroups: list[object] = []
        self.ev_batch: list[int] = []

    def batch(self, seq: int, events: Sequence[object]) -> None:
        """Append one batch's lean events (the only place what-if reads events)."""
        if self.last_seq is not None and seq <= self.last_seq:
            # A publisher restart: a new engine, a new pool.
            self.seq_regressions += 1
            events = [_RESTART, *events]
        self.last_seq = seq
        self.batches += 1
        codes: list[int] = list(map(CODES.__getitem__, map(type, events)))
        self.codes.extend(codes)
        self.groups.extend(map(_GROUP, events))
        self.hraws.extend(map(_HASHES, events))
        # Parents, tokens, kinds and sizes only matter on stores (most events are removes).
        stores = list(compress(events, [c == EV_STORE for c in codes]))
        self.parents.extend(map(_PARENT, stores))
        self.traws.extend(map(_TOKENS, stores))
        self.kinds.extend(map(_KIND, stores))
        self.windows.extend(map(_WINDOW, stores))
        self.sizes.extend(map(_SIZE, stores))
        self.sgroups.extend(map(_GROUP, stores))
        self.ev_batch.extend([self.batches] * len(events))
        if len(self.codes) >= _FLUSH:
            self._flush()

    def restart(self) -> None:
        """A publisher restart before the next batch: a row that clears the pool."""
        self.seq_regressions += 1
        z = np.zeros(1, np.int64)
        e = np.zeros(0, np.int64)
        clear = np.full(1, EV_CLEAR, np.int64)
        self.pieces.append(_narrow(clear, z - 1, z, z, e, z, z, z + self.batches + 1))

    def scanned(
        self,
        cols: tuple[I64, ...],
        keys: I64,
        n_events: I64,
        vocab: list[str],
    ) -> None:
        """Append a run of batches the numba decoder read (their events, in order).

        Args:
            cols: Per event: type, group (``NULL``: none), hashes, tokens, parent,
                has parent, kind code, window (``NULL``: none), block size (negative: none).
            keys: The run's hash keys, in order.
            n_events: Events per batch of the run.
            vocab: The strings of the kind codes.
        """
        ev_type, group, nh, tok, par, has_par, kind, window, bsize = cols
        self._flush()  # rows kept from msgspec batches go first
        first = self.batches + 1
        self.batches += len(n_events)
        ev_group = np.where(group == NULL, _NONE, group)
        store = ev_type == EV_STORE
        clear = ev_type == EV_CLEAR
        ev_group[clear] = _NONE
        ev_nh = np.where(clear, 0, nh)
        ev_ntok = np.where(store, tok, 0)
        has = store & (has_par != 0)
        batch = np.repeat(np.arange(first, first + len(n_events), dtype=np.int64), n_events)
        self.pieces.append(
            _narrow(ev_type, ev_group, ev_nh, ev_ntok, keys, np.where(has, par, 0), has, batch)
        )
        if not store.any():
            return
        sg = ev_group[store]
        for g in np.unique(sg).tolist():
            self.stored.add(None if g == _NONE else int(g))
        sk, sw, sb = kind[store], window[store], bsize[store]
        said = np.flatnonzero(sk >= 0)
        if len(said):
            # The last store that said something wins (as in _flush).
            g_said = sg[said]
            order = np.argsort(g_said, kind="stable")
            gs = g_said[order]
            last = said[order[np.flatnonzero(np.append(gs[1:] != gs[:-1], True))]]
            for i in last.tolist():
                g = int(sg[i])
                w = int(sw[i])
                self.said[None if g == _NONE else g] = (vocab[int(sk[i])], None if w == NULL else w)
        sized = sb >= 0
        if sized.any():
            for g, b in zip(*_group_max(sg[sized], sb[sized]), strict=True):
                gi = None if g == _NONE else g
                if b > self.sizes_seen.get(gi, 0):
                    self.sizes_seen[gi] = b

    def _flush(self) -> None:
        """Turn the rows kept so far into arrays (one piece) and note what groups said."""
        if not self.codes:
            return
        # What a group's stores said: the last store that said something wins.
        last: dict[object, tuple[object, object]] = {}
        for g, k, w in zip(self.sgroups, self.kinds, self.windows, strict=True):
            if k is not None:
                last[g] = (k, w)
        for g, kw in last.items():
            self.said[g if isinstance(g, int) else None] = kw
        for g, b in set(zip(self.sgroups, self.sizes, strict=True)):
            gi = g if isinstance(g, int) else None
            self.stored.add(gi)
            # An int outside int64 is no size (the scanner reads it as none too).
            if isinstance(b, int) and self.sizes_seen.get(gi, 0) < b < 1 << 63:
                self.sizes_seen[gi] = b
        ev_type = np.array(self.codes, np.int64)
        gobj = np.array(self.groups, dtype=object)
        gobj[gobj == None] = _NONE  # noqa: E711 (elementwise)
        ev_group = gobj.astype(np.int64)
        ev_group[ev_type == EV_CLEAR] = _NONE
        hbuf, hstarts = _joined(self.hraws)
        ev_nh = np.maximum(count_arrays(hbuf, hstarts), 0)
        ev_nh[ev_type == EV_CLEAR] = 0
        tbuf, tstarts = _joined(self.traws)
        ev_ntok = np.zeros(len(ev_type), np.int64)
        is_store = ev_type == EV_STORE
        ev_ntok[is_store] = np.maximum(count_arrays(tbuf, tstarts), 0)
        bad = np.flatnonzero((count_arrays(hbuf, hstarts) < 0) & (ev_type != EV_CLEAR))
        occ_hash, ok = parse_ints(hbuf, hstarts, ev_nh)
        if not ok or len(bad):
            occ_hash = np.array([h for r in self.hraws for h in _hash_keys(r)], np.int64)
        s_hash, s_has = _parent_array(self.parents)
        par_hash = np.zeros(len(ev_type), np.int64)
        par_has = np.zeros(len(ev_type), np.bool_)
        par_hash[is_store] = s_hash
        par_has[is_store] = s_has
        batch = np.array(self.ev_batch, np.int64)
        self.pieces.append(
            _narrow(ev_type, ev_group, ev_nh, ev_ntok, occ_hash, par_hash, par_has, batch)
        )
        self._reset()

    def _group_infos(self, rule: ChannelRule | None) -> None:
        said, sizes = self.said, self.sizes_seen
        for g in sorted({*said, *sizes, *self.stored}, key=lambda x: (x is None, x or 0)):
            info = GroupInfo(g, block_size=sizes.get(g, 0))
            kw = rule.group(g) if rule is not None and g is not None else None
            if kw is None and g in said:
                k, w = said[g]
                kw = (str(k), w if isinstance(w, int) else None)
            if kw is not None:
                info.kind, info.sliding_window = kw
            self.info[g] = info

    def finish(self, rule: ChannelRule | None = None) -> PoolStream:
        """Return the pool's kernel arrays.

        Args:
            rule: The annotation rule of the pool's channel and rank (kinds, windows).
        """
        self._flush()
        self._group_infos(rule)
        # One column at a time, each column's pieces let go as it is joined (the pieces
        # and the joined columns are never all held at once).
        by_col = [list(c) for c in zip(*self.pieces, strict=True)] or [[] for _ in range(8)]
        self.pieces = []
        cols: list[npt.NDArray[np.signedinteger[Any]]] = []
        for i in range(len(by_col)):
            parts, by_col[i] = by_col[i], []
            cols.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
            del parts
        ev_type, ev_group, ev_nh, ev_ntok, occ_hash, par_hash, par_has_i, ev_batch = cols
        del cols
        par_has = par_has_i.astype(np.bool_)
        del par_has_i
        self.clears = int((ev_type == EV_CLEAR).sum()) - self.seq_regressions
        store_groups = sorted(g for g in self.info if g is not None)  # groups that stored
        has_none = bool((ev_group[ev_type != EV_CLEAR] == _NONE).any())
        removes_none = int(ev_nh[(ev_type == EV_REMOVE) & (ev_group == _NONE)].sum())
        stores_none = int(ev_nh[(ev_type == EV_STORE) & (ev_group == _NONE)].sum())
        if has_none and len(store_groups) == 1 and None not in self.info:
            # Removes without group_idx in a one-group pool belong to that group.
            ev_group[ev_group == _NONE] = store_groups[0]
            has_none = bool((ev_group[ev_type != EV_CLEAR] == _NONE).any())
        seen = sorted({int(g) for g in np.unique(ev_group[ev_type != EV_CLEAR]) if g != _NONE})
        order: list[int | None] = [*seen, *([None] if has_none else [])]
        lut = {(_NONE if g is None else g): i for i, g in enumerate(order)}
        ev_gpos = _map_small(ev_group, lut)
        del ev_group
        infos = [self.info.get(g) or GroupInfo(g) for g in order]
        n_groups = max(len(order), 1)
        # Hash ids over hashes and parents; key ids over (group position, hash id).
        occ_hid, par_hid, occ_key, key_of, n_hid, n_keys = intern(
            occ_hash, par_hash[par_has], ev_gpos, ev_nh, n_groups
        )
        del occ_hash, par_hash  # the hashes are numbered now
        ev_parent = np.full(len(ev_type), -1, np.int64)
        ev_parent[par_has] = par_hid
        ev_h0 = (
            np.concatenate([[0], np.cumsum(ev_nh)[:-1]]).astype(np.int64) if len(ev_nh) else ev_nh
        )
        gbs = np.array([max(i.block_size, 1) for i in infos] or [1], np.int64)
        # The op columns in 32 bits unless a key, record or depth could pass them (a depth
        # is at most the blocks every store spans together).
        span = int(np.maximum(ev_ntok, ev_nh).sum()) if len(ev_nh) else 0
        wide = len(occ_hid) + len(ev_type) + span + 2 >= _NARROW_LIMIT
        like: npt.NDArray[np.signedinteger[Any]] = (
            np.zeros(0, np.int64) if wide else np.zeros(0, np.int32)
        )
        arrays = build(
            ev_type,
            ev_gpos,
            ev_h0,
            ev_nh,
            ev_parent,
            ev_ntok.astype(np.int64),
            ev_batch,
            occ_hid,
            occ_key,
            key_of,
            n_hid,
            n_groups,
            gbs,
            like,
            all(_kernel_kind(i.kind) != KIND_MAMBA for i in infos),
        )
        names = [
            "op_kind",
            "op_a",
            "op_depth",
            "op_group",
            "op_rec",
            "rec_req",
            "rec_s0",
            "rec_depths",
            "req_first_rec",
            "req_l0",
            "req_cap",
            "req_c0",
            "cand",
            "req_p0",
            "pre",
            "resumed",
        ]
        pool = PoolStream(self.channel, self.rank, infos)
        pool.arrays = dict(zip(names, arrays, strict=True))
        pool.arrays["gkind"] = np.array([_kernel_kind(i.kind) for i in infos], np.int64)
        pool.arrays["gsw"] = np.array(
            [
                math.ceil((i.sliding_window - 1) / (i.block_size or 1))
                if _kernel_kind(i.kind) == KIND_SLIDING and i.sliding_window
                else 0
                for i in infos
            ],
            np.int64,
        )
        pool.n_keys = n_keys
        pool.removes_without_group = removes_none if has_none else 0
        pool.stores_without_group = stores_none
        pool.seq_regressions = self.seq_regressions
        pool.clears = self.clears
        pool.requests = len(pool.arrays["req_l0"])
        pool.batches = self.batches
        return pool


def _narrow(
    ev_type: I64,
    ev_group: I64,
    ev_nh: I64,
    ev_ntok: I64,
    hashes: I64,
    parent: I64,
    has_parent: npt.NDArray[np.bool_] | I64,
    batch: I64,
) -> tuple[npt.NDArray[np.signedinteger[Any]], ...]:
    """One piece of event rows, each column in the narrowest type that holds it.

    The pieces of a large input are kept until the end: a type code needs a byte, not
    eight. Hashes and parents stay 64-bit; a column whose values do not fit 32 bits stays
    64-bit.
    """

    def fit(a: I64) -> npt.NDArray[np.signedinteger[Any]]:
        if len(a) == 0 or (int(a.min()) >= -_NARROW_LIMIT and int(a.max()) < _NARROW_LIMIT):
            return a.astype(np.int32)
        return a

    return (
        ev_type.astype(np.int8),
        fit(ev_group),
        fit(ev_nh),
        fit(ev_ntok),
        hashes,
        parent,
        np.asarray(has_parent).astype(np.int8),
        fit(batch),
    )


def _joined(raws: list[object]) -> tuple[npt.NDArray[np.uint8], I64]:
    """The raw msgpack lists joined in one buffer, and where each begins."""
    lens = np.fromiter(map(len, raws), np.int64, len(raws))  # type: ignore[arg-type]
    starts = np.zeros(len(raws), np.int64)
    if len(raws) > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    buf = np.frombuffer(b"".join(raws), np.uint8)  # type: ignore[arg-type]
    return buf, starts


def _map_small(values: I64, lut: dict[int, int]) -> I64:
    out = np.zeros(len(values), np.int64)
    for g, i in lut.items():
        out[values == g] = i
    return out


def _hash_array(hashes: Sequence[object]) -> I64:
    """Hashes as signed 64-bit keys (:func:`kvtool.protocol.hash_key`), fast for uint64."""
    try:
        return np.array(hashes, np.uint64).view(np.int64)
    except (OverflowError, TypeError, ValueError):
        return np.array([hash_key(h) for h in hashes], np.int64)  # type: ignore[arg-type]


def _parent_array(parents: list[object]) -> tuple[I64, npt.NDArray[np.bool_]]:
    obj = np.array(parents, dtype=object)
    has = obj != None  # noqa: E711 (elementwise)
    vals = np.zeros(len(parents), np.int64)
    vals[has] = _hash_array(list(obj[has]))
    return vals, has


def _kernel_kind(kind: str | None) -> int:
    if kind in SLIDING_KINDS:
        return KIND_SLIDING
    if kind == "mamba":
        return KIND_MAMBA
    return KIND_FULL


def _group_max(groups: I64, values: I64) -> tuple[list[int], list[int]]:
    """The largest value per group."""
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    last = np.flatnonzero(np.append(g[1:] != g[:-1], True))
    return g[last].tolist(), v[last].tolist()


class PoolFeed:
    """Takes raw chunks in stream order and keeps each pool's event rows (see the module)."""

    def __init__(self) -> None:
        self.cols: dict[PoolKey, _Columns] = {}
        self.chunks = 0

    def _pool(self, key: PoolKey) -> _Columns:
        c = self.cols.get(key)
        if c is None:
            c = self.cols[key] = _Columns(*key)
        return c

    def __call__(self, raw: RawChunk) -> None:
        """Take one raw chunk (the report's, or :func:`extract_pools`'s own read)."""
        self.chunks += 1
        data = raw.data
        n = len(data)
        if n == 0:
            return
        lens = np.fromiter(map(len, data), np.int64, n)
        offs = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        buf = np.frombuffer(b"".join(data), np.uint8)
        ws = scan(buf, offs)
        ev_end = np.cumsum(ws.n_events)
        key_end = np.concatenate([[0], np.cumsum(ws.n_hashes)]).astype(np.int64)
        cols = (
            ws.type_code.astype(np.int64),
            ws.group_idx,
            ws.n_hashes,
            ws.tokens,
            ws.parent,
            ws.has_parent.astype(np.int64),
            ws.kind.astype(np.int64),
            ws.window,
            ws.block_size,
        )
        if self._one_run(raw, ws, cols):
            return
        names: dict[int, str] = {}
        run: tuple[_Columns, int] | None = None  # (pool, first payload of the run)

        def close(upto: int) -> None:
            if run is None:
                return
            c, i0 = run
            e0 = int(ev_end[i0 - 1]) if i0 else 0
            e1 = int(ev_end[upto - 1]) if upto else 0
            k0, k1 = int(key_end[e0]), int(key_end[e1])
            c.scanned(tuple(a[e0:e1] for a in cols), ws.keys[k0:k1], ws.n_events[i0:upto], ws.vocab)

        for i in range(n):
            cid = raw.channel_id[i]
            name = names.get(cid)
            if name is None:
                endpoint, topic = raw.streams.get(cid, (raw.where.get(cid, ""), ""))
                name = names[cid] = channel_topic(endpoint, topic)
            seq = raw.seq[i]
            if ws.err[i]:
                close(i)
                run = None
                try:
                    batch_rank, events = lean.decode(bytes(data[i]), seq)
                except ProtocolError:
                    continue  # the report counts and names undecodable payloads
                rank = event_rank(raw.dp_rank[i], batch_rank)
                if raw.ranks is not None and rank not in raw.ranks:
                    continue
                c = self._pool((name, rank))
                c.batch(seq, events)
                c._flush()
                continue
            b_rank = int(ws.rank[i])
            rank = event_rank(raw.dp_rank[i], b_rank if b_rank >= 0 else None)
            if raw.ranks is not None and rank not in raw.ranks:
                close(i)
                run = None
                continue
            c = self._pool((name, rank))
            restart = c.last_seq is not None and seq <= c.last_seq
            if run is None or run[0] is not c or restart:
                close(i)
                if restart:
                    c.restart()
                run = (c, i)
            c.last_seq = seq
        close(n)

    def _one_run(self, raw: RawChunk, ws: Scanned, cols: tuple[I64, ...]) -> bool:
        """The usual chunk at once: one stream, one rank, every payload scanned, seq rising."""
        cids = set(raw.channel_id)
        ranks = set(raw.dp_rank)
        if len(cids) != 1 or len(ranks) != 1 or raw.ranks is not None or ws.err.any():
            return False
        (cid,) = cids
        (ch_rank,) = ranks
        if ch_rank is None:
            b = ws.rank
            if (b != b[0]).any():
                return False
            rank = event_rank(None, int(b[0]) if b[0] >= 0 else None)
        else:
            rank = ch_rank
        if not all(a < b for a, b in zip(raw.seq, raw.seq[1:], strict=False)):
            return False
        endpoint, topic = raw.streams.get(cid, (raw.where.get(cid, ""), ""))
        c = self._pool((channel_topic(endpoint, topic), rank))
        if c.last_seq is not None and raw.seq[0] <= c.last_seq:
            return False
        c.scanned(cols, ws.keys, ws.n_events, ws.vocab)
        c.last_seq = raw.seq[-1]
        return True

    def finish(self, annotation: Annotation) -> list[PoolStream]:
        """Return every pool's arrays, in order of first appearance.

        Args:
            annotation: THE annotation of the input (kinds and windows per group).
        """
        return [c.finish(annotation.rule(c.channel, c.rank)) for c in self.cols.values()]


def input_annotation(
    paths: Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
) -> Annotation:
    """THE annotation of the input, as the what-if reads kinds and windows.

    Args:
        paths: The recordings.
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.

    Raises:
        RecordingError: A recording cannot be opened.
        MetadataError: The group metadata is invalid.
    """
    if groups_file is not None or group_flags:
        return Annotation(resolve_groups(groups_file, group_flags, None))
    return resolve_annotation(list(paths))


def extract_pools(
    paths: Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    batch_filter: BatchFilter | None = None,
    chunk_bytes: int | None = None,
) -> list[PoolStream]:
    """Read the recordings once and return every pool's event order as arrays.

    Args:
        paths: The recordings (merged in THE merge order of every command).
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        batch_filter: ``--channel/--rank/--since/--until``.
        chunk_bytes: Payload bytes per raw chunk (default: the report's).

    Returns:
        One :class:`PoolStream` per (channel, rank), in order of first appearance.

    Raises:
        RecordingError: A recording cannot be opened.
        MetadataError: The group metadata is invalid.
    """
    from kvtool.columns import DEFAULT_CHUNK_BYTES, ReadStats, iter_raw_chunks

    annotation = input_annotation(paths, groups_file=groups_file, group_flags=group_flags)
    feed = PoolFeed()
    for raw in iter_raw_chunks(
        list(paths),
        stats=ReadStats(),
        chunk_bytes=chunk_bytes or DEFAULT_CHUNK_BYTES,
        select=batch_filter,
    ):
        feed(raw)
    return feed.finish(annotation)


__all__ = ["GroupInfo", "PoolFeed", "PoolStream", "extract_pools", "input_annotation"]
