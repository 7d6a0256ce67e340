"""What-if input: each pool's event order as numpy arrays, built once from the recordings.

The one extraction step (:func:`extract_pools`) iterates :class:`kvtool.replay.Replay`
(msgspec decoding, the reference decoder) and keeps, per pool (channel, rank), flat
integer arrays: ops (store, remove, clear, record start), keys (group, hash) interned to
integers, and the requests rebuilt from parent hashes. It is the only place that reads
events for what-if, so a columnar decoder can replace it without touching the kernel.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvtool.protocol import AllBlocksCleared, BlockRemoved, BlockStored, hash_key
from kvtool.replay import BatchFilter, Replay
from kvtool.report.whatif.kernel import (
    KIND_FULL,
    KIND_MAMBA,
    KIND_SLIDING,
    OP_CLEAR,
    OP_RECORD,
    OP_REMOVE,
    OP_STORE,
)

I64 = npt.NDArray[np.int64]
PoolKey = tuple[str, int | None]

SLIDING_KINDS = frozenset({"sliding_window", "sliding_window_mla"})


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


class _Builder:
    """Accumulates one pool's ops while the recording is read."""

    def __init__(self, channel: str, rank: int | None) -> None:
        self.channel = channel
        self.rank = rank
        self.groups: dict[int | None, GroupInfo] = {}
        self.keys: dict[tuple[int | None, int], int] = {}
        self.key_group: list[int | None] = []
        self.op_kind: list[int] = []
        self.op_a: list[int] = []
        self.op_depth: list[int] = []
        self.op_group: list[int | None] = []
        self.op_rec: list[int] = []
        self.inserts: list[tuple[int, int]] = []
        self.depth: dict[int, int] = {}
        self.tail_of: dict[int, int] = {}
        self.req_recs: list[list[int]] = []
        self.rec_req: list[int] = []
        self.rec_batch: list[int] = []
        self.rec_base: list[int] = []
        self.rec_end: list[int] = []
        self.rec_hashes: list[list[int] | None] = []
        self.batches = 0
        self.last_seq: int | None = None
        self.seq_regressions = 0
        self.removes_without_group = 0
        self.stores_without_group = 0
        self.clears = 0

    def _key(self, group: int | None, h: int) -> int:
        k = (group, h)
        v = self.keys.get(k)
        if v is None:
            v = self.keys[k] = len(self.key_group)
            self.key_group.append(group)
        return v

    def batch(self, seq: int, events: Sequence[object]) -> None:
        if self.last_seq is not None and seq <= self.last_seq:
            # A publisher restart: a new engine, a new pool.
            self.seq_regressions += 1
            self.tail_of.clear()
            self._op(OP_CLEAR, -1, 0, None, -1)
        self.last_seq = seq
        self.batches += 1
        b = self.batches
        cur: tuple[int, int | None, int | None, set[int | None]] | None = None
        lookup_pos = len(self.op_kind)
        for ev in events:
            if isinstance(ev, BlockRemoved):
                cur = None
                g = ev.group_idx
                if g is None:
                    self.removes_without_group += len(ev.block_hashes)
                for h in ev.block_hashes:
                    self._op(OP_REMOVE, self._key(g, hash_key(h)), 0, g, -1)
            elif isinstance(ev, AllBlocksCleared):
                cur = None
                self.clears += 1
                self.tail_of.clear()
                self._op(OP_CLEAR, -1, 0, None, -1)
                lookup_pos = len(self.op_kind)
            elif isinstance(ev, BlockStored):
                cur = self._store(ev, b, cur, lookup_pos)
                lookup_pos = len(self.op_kind)

    def _op(self, kind: int, a: int, depth: int, group: int | None, rec: int) -> None:
        self.op_kind.append(kind)
        self.op_a.append(a)
        self.op_depth.append(depth)
        self.op_group.append(group)
        self.op_rec.append(rec)

    def _store(
        self,
        ev: BlockStored,
        b: int,
        cur: tuple[int, int | None, int | None, set[int | None]] | None,
        lookup_pos: int,
    ) -> tuple[int, int | None, int | None, set[int | None]]:
        g = ev.group_idx
        info = self.groups.get(g)
        if info is None:
            info = self.groups[g] = GroupInfo(g)
        if ev.kv_cache_spec_kind is not None:
            info.kind = ev.kv_cache_spec_kind
            info.sliding_window = ev.kv_cache_spec_sliding_window
        if isinstance(ev.block_size, int):
            info.block_size = max(info.block_size, ev.block_size)
        hs = [hash_key(h) for h in ev.block_hashes]
        if g is None:
            self.stores_without_group += len(hs)
        bs = info.block_size or 1
        n_tok = len(ev.token_ids)
        span = n_tok // bs if n_tok else len(hs)
        span = max(span, len(hs))
        parent = ev.parent_block_hash
        par = hash_key(parent) if isinstance(parent, int | bytes) else None
        base = 0 if par is None else self.depth.get(par, 0)
        first = base + span - len(hs) + 1
        for i, h in enumerate(hs):
            self.depth.setdefault(h, first + i)
        last = hs[-1] if hs else None
        if cur is not None and cur[1] == par and cur[2] == last and g not in cur[3]:
            r = cur[0]
        else:
            r = len(self.rec_req)
            q = self.tail_of.pop(par, None) if par is not None else None
            if q is None:
                q = len(self.req_recs)
                self.req_recs.append([])
            self.req_recs[q].append(r)
            self.rec_req.append(q)
            self.rec_batch.append(b)
            self.rec_base.append(base)
            self.rec_end.append(base + span)
            self.rec_hashes.append(None)
            if last is not None:
                self.tail_of[last] = q
            cur = (r, par, last, set())
            self.inserts.append((lookup_pos, r))
        cur[3].add(g)
        known = self.rec_hashes[r]
        if span == len(hs) and (known is None or len(hs) > len(known)):
            self.rec_hashes[r] = hs
        for i, h in enumerate(hs):
            self._op(OP_STORE, self._key(g, h), first + i, g, r)
        return cur

    def finish(self) -> PoolStream:
        """Return the pool's arrays (merging record starts into the op order)."""
        store_groups = [g for g in self.groups]
        seen_groups = list(dict.fromkeys([*store_groups, *self.key_group]))
        # Removes without group_idx in a one-group pool belong to that group.
        alias: dict[int | None, int | None] = {}
        if len(store_groups) == 1 and None in seen_groups and store_groups[0] is not None:
            alias[None] = store_groups[0]
        groups_sorted = sorted(
            {alias.get(g, g) for g in seen_groups}, key=lambda x: (x is None, x or 0)
        )
        gpos = {g: i for i, g in enumerate(groups_sorted)}
        infos = [self.groups.get(g) or GroupInfo(g) for g in groups_sorted]
        # Keys: remap aliased groups onto the store group's keys.
        remap = np.arange(len(self.key_group), dtype=np.int64)
        if alias:
            for (g, h), v in self.keys.items():
                if g in alias:
                    tgt = self.keys.get((alias[g], h))
                    if tgt is not None:
                        remap[v] = tgt
        n = len(self.op_kind) + len(self.inserts)
        op_kind = np.empty(n, np.int64)
        op_a = np.empty(n, np.int64)
        op_depth = np.zeros(n, np.int64)
        op_group = np.zeros(n, np.int64)
        op_rec = np.full(n, -1, np.int64)
        j = 0
        o = 0
        ins = self.inserts
        for i in range(len(self.op_kind) + 1):
            while j < len(ins) and ins[j][0] == i:
                op_kind[o] = OP_RECORD
                op_a[o] = ins[j][1]
                j += 1
                o += 1
            if i == len(self.op_kind):
                break
            k = self.op_kind[i]
            op_kind[o] = k
            a = self.op_a[i]
            op_a[o] = remap[a] if a >= 0 else a
            op_depth[o] = self.op_depth[i]
            g = self.op_group[i]
            op_group[o] = gpos.get(alias.get(g, g), 0)
            op_rec[o] = self.op_rec[i]
            o += 1
        n_rec = len(self.rec_req)
        per_rec: list[list[int]] = [[] for _ in range(n_rec)]
        for i in range(len(self.op_kind)):
            if self.op_kind[i] == OP_STORE:
                per_rec[self.op_rec[i]].append(self.op_depth[i])
        rec_s0 = np.zeros(n_rec + 1, np.int64)
        flat: list[int] = []
        for r in range(n_rec):
            flat.extend(per_rec[r])
            rec_s0[r + 1] = len(flat)
        n_groups = len(groups_sorted)
        n_req = len(self.req_recs)
        req_l0 = np.zeros(n_req, np.int64)
        req_cap = np.zeros(n_req, np.int64)
        req_c0 = np.zeros(n_req + 1, np.int64)
        req_first = np.zeros(n_req, np.int64)
        rows: list[list[int]] = []
        for q, recs in enumerate(self.req_recs):
            l0 = self.rec_base[recs[0]]
            hashes: dict[int, int] = {}
            prev: int | None = None
            cap = l0
            for r in recs:
                # The prompt: the first record and the records that follow it at once or
                # store several blocks (decode stores one block every block_size steps).
                if prev is not None and not (
                    self.rec_end[r] - self.rec_base[r] >= 2
                    or self.rec_batch[r] - self.rec_batch[prev] <= 1
                ):
                    break
                hs = self.rec_hashes[r]
                if hs:
                    for i, h in enumerate(hs):
                        hashes[self.rec_base[r] + i + 1] = h
                cap = max(cap, self.rec_end[r])
                prev = r
            d = l0 + 1
            while d <= cap and d in hashes:
                h = hashes[d]
                row = []
                for g in groups_sorted:
                    v = self.keys.get((g, h), -1)
                    row.append(int(remap[v]) if v >= 0 else -1)
                rows.append(row)
                d += 1
            req_l0[q] = l0
            req_cap[q] = d - 1
            req_c0[q + 1] = len(rows)
            req_first[q] = recs[0]
        cand = (
            np.array(rows, np.int64).reshape(-1, n_groups)
            if rows
            else np.zeros((0, n_groups), np.int64)
        )
        gkind = np.array([_kernel_kind(i.kind) for i in infos], np.int64)
        gsw = np.array(
            [
                math.ceil((i.sliding_window - 1) / (i.block_size or 1))
                if _kernel_kind(i.kind) == KIND_SLIDING and i.sliding_window
                else 0
                for i in infos
            ],
            np.int64,
        )
        pool = PoolStream(self.channel, self.rank, infos)
        pool.arrays = {
            "op_kind": op_kind,
            "op_a": op_a,
            "op_depth": op_depth,
            "op_group": op_group,
            "op_rec": op_rec,
            "rec_req": np.array(self.rec_req, np.int64),
            "rec_s0": rec_s0,
            "rec_depths": np.array(flat, np.int64),
            "req_first_rec": req_first,
            "req_l0": req_l0,
            "req_cap": req_cap,
            "req_c0": req_c0,
            "cand": cand,
            "gkind": gkind,
            "gsw": gsw,
        }
        pool.n_keys = len(self.key_group)
        pool.removes_without_group = self.removes_without_group
        pool.stores_without_group = self.stores_without_group
        pool.seq_regressions = self.seq_regressions
        pool.clears = self.clears
        pool.requests = n_req
        pool.batches = self.batches
        return pool


def _kernel_kind(kind: str | None) -> int:
    if kind in SLIDING_KINDS:
        return KIND_SLIDING
    if kind == "mamba":
        return KIND_MAMBA
    return KIND_FULL


def extract_pools(
    paths: Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    batch_filter: BatchFilter | None = None,
) -> list[PoolStream]:
    """Read the recordings once and return every pool's event order as arrays.

    Args:
        paths: The recordings (merged in THE merge order of every command).
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        batch_filter: ``--channel/--rank/--since/--until``.

    Returns:
        One :class:`PoolStream` per (channel, rank), in order of first appearance.

    Raises:
        RecordingError: A recording cannot be opened.
        MetadataError: The group metadata is invalid.
    """
    builders: dict[PoolKey, _Builder] = {}
    with Replay(
        list(paths),
        annotate=True,
        groups_file=groups_file,
        group_flags=group_flags,
        batch_filter=batch_filter,
    ) as rp:
        for rb in rp:
            if rb.batch is None:
                continue
            key = (rb.message.channel.name, rb.dp_rank)
            b = builders.get(key)
            if b is None:
                b = builders[key] = _Builder(*key)
            b.batch(rb.message.seq, rb.events)
    return [b.finish() for b in builders.values()]


__all__ = ["GroupInfo", "PoolStream", "extract_pools"]
