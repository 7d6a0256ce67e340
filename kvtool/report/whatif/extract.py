"""What-if input: each pool's event order as numpy arrays, built once from the recordings.

:func:`extract_pools` is the one extraction step. It iterates :class:`kvtool.replay.Replay`
(msgspec, the reference decoder) and keeps per pool (channel, rank) one row per event
and one per hash in flat lists; everything after that is numpy and the numba kernel
:func:`kvtool.report.whatif.build.build`, which interns (group, hash) keys, rebuilds
requests from parent hashes and lays out the ops :func:`kvtool.report.whatif.kernel.simulate`
replays. Only :func:`_Columns.batch` reads events, so a columnar decoder can replace
it without touching the kernels.
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
from kvtool.report.whatif.build import EV_CLEAR, EV_REMOVE, EV_STORE, build
from kvtool.report.whatif.kernel import KIND_FULL, KIND_MAMBA, KIND_SLIDING

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


class _Columns:
    """One pool's events as flat rows, appended while the recording is read."""

    def __init__(self, channel: str, rank: int | None) -> None:
        self.channel = channel
        self.rank = rank
        self.groups: dict[int | None, GroupInfo] = {}
        self.ev_type: list[int] = []
        self.ev_group: list[int] = []
        self.ev_nh: list[int] = []
        self.ev_parent: list[object] = []
        self.ev_ntok: list[int] = []
        self.ev_batch: list[int] = []
        self.hashes: list[object] = []
        self.batches = 0
        self.last_seq: int | None = None
        self.seq_regressions = 0
        self.clears = 0

    def batch(self, seq: int, events: Sequence[object]) -> None:
        """Append one batch's events (the only place what-if reads events)."""
        if self.last_seq is not None and seq <= self.last_seq:
            # A publisher restart: a new engine, a new pool.
            self.seq_regressions += 1
            self._row(EV_CLEAR, _NONE, 0, None, 0)
        self.last_seq = seq
        self.batches += 1
        groups = self.groups
        hashes = self.hashes
        ev_type = self.ev_type
        ev_group = self.ev_group
        ev_nh = self.ev_nh
        ev_parent = self.ev_parent
        ev_ntok = self.ev_ntok
        for ev in events:
            if isinstance(ev, BlockRemoved):
                g = ev.group_idx
                hs = ev.block_hashes
                hashes.extend(hs)
                ev_type.append(EV_REMOVE)
                ev_group.append(_NONE if g is None else g)
                ev_nh.append(len(hs))
                ev_parent.append(None)
                ev_ntok.append(0)
            elif isinstance(ev, BlockStored):
                g = ev.group_idx
                info = groups.get(g)
                if info is None:
                    info = groups[g] = GroupInfo(g)
                if ev.kv_cache_spec_kind is not None:
                    info.kind = ev.kv_cache_spec_kind
                    info.sliding_window = ev.kv_cache_spec_sliding_window
                bs = ev.block_size
                if isinstance(bs, int) and bs > info.block_size:
                    info.block_size = bs
                hs = ev.block_hashes
                hashes.extend(hs)
                ev_type.append(EV_STORE)
                ev_group.append(_NONE if g is None else g)
                ev_nh.append(len(hs))
                ev_parent.append(ev.parent_block_hash)
                ev_ntok.append(len(ev.token_ids))
            elif isinstance(ev, AllBlocksCleared):
                self.clears += 1
                self._row(EV_CLEAR, _NONE, 0, None, 0)
                continue
        # Every row of this batch carries its number (clears appended theirs already).
        self.ev_batch.extend([self.batches] * (len(ev_type) - len(self.ev_batch)))

    def _row(self, t: int, g: int, nh: int, parent: object, ntok: int) -> None:
        self.ev_type.append(t)
        self.ev_group.append(g)
        self.ev_nh.append(nh)
        self.ev_parent.append(parent)
        self.ev_ntok.append(ntok)
        self.ev_batch.append(self.batches)

    def finish(self) -> PoolStream:
        """Return the pool's kernel arrays."""
        ev_type = np.array(self.ev_type, np.int64)
        ev_group = np.array(self.ev_group, np.int64)
        ev_nh = np.array(self.ev_nh, np.int64)
        store_groups = sorted(
            {g for g in self.groups if g is not None}
        )  # groups that stored, by index
        has_none = bool((ev_group[ev_type != EV_CLEAR] == _NONE).any())
        removes_none = int(ev_nh[(ev_type == EV_REMOVE) & (ev_group == _NONE)].sum())
        stores_none = int(ev_nh[(ev_type == EV_STORE) & (ev_group == _NONE)].sum())
        if has_none and len(store_groups) == 1 and None not in self.groups:
            # Removes without group_idx in a one-group pool belong to that group.
            ev_group[ev_group == _NONE] = store_groups[0]
            has_none = bool((ev_group[ev_type != EV_CLEAR] == _NONE).any())
        seen = sorted({int(g) for g in np.unique(ev_group[ev_type != EV_CLEAR]) if g != _NONE})
        order: list[int | None] = [*seen, *([None] if has_none else [])]
        lut = {(_NONE if g is None else g): i for i, g in enumerate(order)}
        ev_gpos = _map_small(ev_group, lut)
        infos = [self.groups.get(g) or GroupInfo(g) for g in order]
        n_groups = max(len(order), 1)
        occ_hash = _hash_array(self.hashes)
        par_hash, par_has = _parent_array(self.ev_parent)
        # Hash ids over hashes and parents; key ids over (group position, hash id).
        universe, inv = np.unique(
            np.concatenate([occ_hash, par_hash[par_has]]), return_inverse=True
        )
        occ_hid = inv[: len(occ_hash)].astype(np.int64)
        ev_parent = np.full(len(ev_type), -1, np.int64)
        ev_parent[par_has] = inv[len(occ_hash) :]
        ev_h0 = (
            np.concatenate([[0], np.cumsum(ev_nh)[:-1]]).astype(np.int64) if len(ev_nh) else ev_nh
        )
        occ_g = np.repeat(ev_gpos, ev_nh)
        codes = occ_hid * n_groups + occ_g
        ucodes, occ_key = np.unique(codes, return_inverse=True)
        gbs = np.array([max(i.block_size, 1) for i in infos] or [1], np.int64)
        arrays = build(
            ev_type,
            ev_gpos,
            ev_h0,
            ev_nh,
            ev_parent,
            np.array(self.ev_ntok, np.int64),
            np.array(self.ev_batch, np.int64),
            occ_hid,
            occ_key.astype(np.int64),
            ucodes.astype(np.int64),
            len(universe),
            n_groups,
            gbs,
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
        pool.n_keys = len(ucodes)
        pool.removes_without_group = removes_none if has_none else 0
        pool.stores_without_group = stores_none
        pool.seq_regressions = self.seq_regressions
        pool.clears = self.clears
        pool.requests = len(pool.arrays["req_l0"])
        pool.batches = self.batches
        return pool


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
    has = np.array([isinstance(p, int | bytes) for p in parents], np.bool_)
    vals = [p if isinstance(p, int | bytes) else 0 for p in parents]
    return _hash_array(vals), has


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
    cols: dict[PoolKey, _Columns] = {}
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
            c = cols.get(key)
            if c is None:
                c = cols[key] = _Columns(*key)
            c.batch(rb.message.seq, rb.events)
    return [c.finish() for c in cols.values()]


__all__ = ["GroupInfo", "PoolStream", "extract_pools"]
