"""Reference model (issue 21): what each vLLM KV event meant physically, read from the wire alone.

A small, readable, pure-Python model over decoded events, one pass in stream order (a batch
is read as a whole before its events are applied: vLLM builds a batch in one engine step,
and some rules look at the rest of their batch). It is the spec the report kernel follows;
docs/SEMANTICS.md states every rule with its vLLM code reference and its evidence.

State is kept per (channel, rank, group): the live *keys* (``(group, hash)`` as vLLM's
``cached_block_hash_to_block`` holds them) and the inferred *physical blocks* each key sits
in (a block carries a primary key plus extra partial keys; a key can sit in two blocks).

Stores are classified as ``new_entry`` (a key never stored before), ``recompute`` (stored
before, not live now), ``stored_while_live`` (live in another block: a second physical
copy), ``partial_extra`` (a partial key added to an already-cached block), ``rekey`` (a new
key on a block that is already cached: a Mamba checkpoint re-key or a partial block promoted
to full) and ``announcement`` (a hit announced under ``kv_cache_report_mode="full"``).
A partial key that is its block's primary key (``partial_primary``) is also a new block and
counts in one of the first three classes. Removes are ``eviction`` (a physical block
reused), ``eviction_extra_key`` (the further keys of an evicted block), ``promotion``
(a partial primary key replaced when its block fills), ``rekey_remove`` and ``discard``
(Mamba checkpoints) and ``orphan`` (a key not live).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kvtool.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    hash_key,
)

ReportMode = Literal["auto", "full", "incremental"]

STORE_CLASSES = (
    "new_entry",
    "recompute",
    "stored_while_live",
    "partial_extra",
    "rekey",
    "announcement",
)
REMOVE_CLASSES = (
    "eviction",
    "eviction_extra_key",
    "promotion",
    "rekey_remove",
    "discard",
    "orphan",
)
MAKES_BLOCK = ("new_entry", "recompute", "stored_while_live")
_UNKNOWN_TAG = re.compile(r"unknown event type '(.*)'")
# Kinds whose hits need every block of the prefix (vLLM's FullAttentionManager family).
_PREFIX_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
_WINDOW_KINDS = frozenset({"sliding_window", "sliding_window_mla"})


def _age(removed: float, stored: float) -> float:
    """A lifetime in seconds, on whole microseconds of each ``ts`` as kvtool computes it."""
    return (round(removed * 1e6) - round(stored * 1e6)) / 1e6


@dataclass(frozen=True)
class GroupInfo:
    """One KV cache group as ``get_kv_cache_group_metadata()`` describes it."""

    kind: str | None
    block_size: int | None
    sliding_window: int | None


@dataclass(eq=False)
class Block:
    """One inferred physical block: its keys (primary first) and when each was stored."""

    keys: list[int]
    stored_ts: dict[int, float]
    partial_primary: bool
    store_class: str
    batch: int
    tokens: tuple[object, ...] = ()
    origin: int = 0
    last_of_event: bool = True


@dataclass
class Counts:
    """Everything the model counts for one group."""

    stores: Counter[str] = field(default_factory=Counter)
    removes: Counter[str] = field(default_factory=Counter)
    store_events: int = 0
    remove_events: int = 0
    tokens_stored: int = 0
    tokens_announced: int = 0
    partial_primary: int = 0
    blocks_cleared: int = 0
    entries_cleared: int = 0
    live_blocks: int = 0
    peak_live_blocks: int = 0
    hit_blocks: int = 0
    hit_tokens: int = 0
    failed_lookups: int = 0
    ambiguous_announcements: int = 0
    ambiguous_announced_blocks: int = 0
    ambiguous_taken_blocks: int = 0
    ambiguous_copy_evictions: int = 0
    evicted_same_batch: int = 0
    distinct: set[int] = field(default_factory=set)
    lifetimes: list[float] = field(default_factory=list)


class _Group:
    """The live state of one (channel, rank, group)."""

    def __init__(self, info: GroupInfo) -> None:
        self.info = info
        self.copies: dict[int, list[Block]] = {}
        self.ever: set[int] = set()
        self.partial_keys: set[int] = set()
        self.seen_block_size = 0

    @property
    def block_size(self) -> int:
        return self.info.block_size or self.seen_block_size

    def live(self, key: int) -> bool:
        return bool(self.copies.get(key))

    def add_key(self, block: Block, key: int, ts: float) -> None:
        block.keys.append(key)
        block.stored_ts[key] = ts
        self.copies.setdefault(key, []).append(block)

    def drop_key(self, block: Block, key: int) -> None:
        block.keys.remove(key)
        lst = self.copies[key]
        lst.remove(block)
        if not lst:
            del self.copies[key]

    def blocks(self) -> set[Block]:
        return {b for lst in self.copies.values() for b in lst}


@dataclass
class _Pending:
    """Per-batch bookkeeping of one group: what its later events in the batch resolve."""

    stored: dict[int, list[Block]] = field(default_factory=dict)
    full: list[Block] = field(default_factory=list)
    folded: Counter[int] = field(default_factory=Counter)
    rekey: Block | None = None
    promoted: dict[int, Block] = field(default_factory=dict)
    last_evicted_origin: int = -1


def _token_blocks(ev: BlockStored, n: int, bs: int) -> list[tuple[object, ...]]:
    """Each stored hash's tokens. ``token_ids`` spans skipped (null) blocks too; the hashed
    blocks are the last ``n`` of the range (the skipped ones precede them)."""
    toks = ev.token_ids
    if not bs or len(toks) < n * bs:
        return [() for _ in range(n)]
    base = len(toks) - n * bs
    return [tuple(toks[base + k * bs : base + (k + 1) * bs]) for k in range(n)]


def _contains(toks: tuple[object, ...], part: tuple[object, ...]) -> bool:
    """Whether ``part`` is one hash unit of ``toks`` (at a multiple of its length)."""
    n = len(part)
    return bool(n) and any(toks[j : j + n] == part for j in range(0, len(toks) - n + 1, n))


def _host(p: _Pending, toks: tuple[object, ...]) -> Block | None:
    """The full block cached earlier in this batch whose tokens hold a partial's."""
    for blk in reversed(p.full):
        if blk.keys and _contains(blk.tokens, toks):
            return blk
    return None


def _promotion_target(p: _Pending, toks: tuple[object, ...]) -> Block | None:
    """The promoted block (its partial primary key removed in this batch) a full block is."""
    for key, blk in list(p.promoted.items()):
        if _contains(toks, blk.tokens):
            del p.promoted[key]
            return blk
    return None


class _AnnouncementRules:
    """The rules that tell a hit announcement from a store (a part of SemanticsModel)."""

    report_mode: ReportMode
    meta: dict[int, GroupInfo]
    channels: dict[tuple[object, object], dict[int | None, _Group]]
    counts: dict[int | None, Counts]
    announcements_seen: int
    batch_index: int
    _last_hit: dict[tuple[object, object, int | None], tuple[int, int, int, int, bool]]

    def _group(
        self,
        groups: dict[int | None, _Group],
        gi: int | None,
        kind: str | None,
        window: int | None = None,
    ) -> _Group:
        raise NotImplementedError

    def _is_announcement(
        self, ck: tuple[object, object], events: Sequence[Event], run: list[int]
    ) -> bool:
        """Whether a run of parentless stores (one per group, same hashes) announces a hit.

        ``emit_cached_block_events`` announces, for each group with hit blocks, one
        ``BlockStored`` with every hit block's hash, ``parent_block_hash`` None, the group's
        block size and the prefix's tokens, one event per group in a row. A real store with
        no parent is a request computing from block 0, i.e. one whose lookup hit nothing:
        if its blocks *are* a valid hit in every group (by vLLM's per-kind hit rule, on the
        live keys), vLLM would have hit them, so it is an announcement. If a shorter prefix
        is a valid hit too, or a store continues the run in the same batch, it is certain;
        otherwise it could be a second copy of a block-aligned prompt whose lookup was
        capped at ``prompt_len - 1`` (ambiguous, bounded).
        """
        if self.report_mode == "incremental":
            return False
        groups = self.channels.setdefault(ck, {})
        full_ok, shorter, cont = True, None, False
        for j in run:
            ev = events[j]
            assert isinstance(ev, BlockStored)
            g = self._group(
                groups, ev.group_idx, ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window
            )
            hashes = [hash_key(h) for h in ev.block_hashes]
            bs = len(ev.token_ids) // len(hashes)
            full_ok = full_ok and self._valid(g, hashes, len(hashes))
            # the shorter hit lengths (in tokens) this group supports; a hybrid hit has one
            # length for all groups
            ok = {k * bs for k in range(1, len(hashes)) if self._valid(g, hashes, k)}
            shorter = ok if shorter is None else shorter & ok
            cont = cont or self._continues(events, run[-1] + 1, hashes[-1])
        # Every group of the channel announces a hit (each group's block list holds its
        # skipped null blocks too, so none is left out).
        want: set[int | None] = set(self.meta) or set(groups)
        covered = {getattr(events[j], "group_idx", None) for j in run}
        if not (full_ok and covered >= want):
            return False
        certain = bool(shorter) or cont or self.report_mode == "full"
        if certain:
            self.announcements_seen += 1
            return True
        # Auto mode: once the stream has shown certain announcements, an ambiguous run is
        # taken as one too; either way it widens the bound.
        taken = self.announcements_seen > 0
        for j in run:
            ev = events[j]
            assert isinstance(ev, BlockStored)
            c = self.counts[ev.group_idx]
            c.ambiguous_announcements += 1
            c.ambiguous_announced_blocks += len(ev.block_hashes)
            if taken:
                c.ambiguous_taken_blocks += len(ev.block_hashes)
        return taken

    def _run(self, events: Sequence[Event], i: int) -> list[int]:
        """The run of announcement-shaped stores from ``i``: one per group, one prefix length
        (the groups' hashes differ when their block sizes do)."""
        first = events[i]
        if not self._ann_shape(first):
            return []
        assert isinstance(first, BlockStored)
        run, seen = [i], {first.group_idx}
        j = i + 1
        while j < len(events):
            ev = events[j]
            if (
                not self._ann_shape(ev)
                or len(ev.token_ids) != len(first.token_ids)  # type: ignore[union-attr]
                or ev.group_idx in seen  # type: ignore[union-attr]
            ):
                break
            assert isinstance(ev, BlockStored)
            run.append(j)
            seen.add(ev.group_idx)
            j += 1
        return run

    def _ann_shape(self, ev: Event) -> bool:
        if not isinstance(ev, BlockStored) or ev.parent_block_hash is not None:
            return False
        if not ev.block_hashes or not isinstance(ev.block_size, int):
            return False
        info = self.meta.get(ev.group_idx) if ev.group_idx is not None else None
        if info is not None and info.block_size is not None and ev.block_size != info.block_size:
            return False
        return len(ev.token_ids) == len(ev.block_hashes) * ev.block_size

    def _valid(self, g: _Group, hashes: list[int], n: int) -> bool:
        kind = g.info.kind
        if kind in _PREFIX_KINDS:
            # FullAttentionManager.find_longest_cache_hit: every block up to the length.
            return all(g.live(h) for h in hashes[:n])
        if kind in _WINDOW_KINDS and g.info.sliding_window and g.block_size:
            # SlidingWindowManager: the last cdiv(window - 1, block_size) blocks.
            need = math.ceil((g.info.sliding_window - 1) / g.block_size)
            return all(g.live(h) for h in hashes[max(0, n - need) : n])
        if kind == "mamba":
            return g.live(hashes[n - 1])  # MambaManager (align): the state at the length
        # A kind whose hit rule the model does not know (or no kind at all: no metadata,
        # unannotated stores) cannot prove an announcement, unless every request announces.
        return self.report_mode == "full"

    @staticmethod
    def _continues(events: Sequence[Event], start: int, last: int) -> bool:
        for ev in events[start:]:
            parent = ev.parent_block_hash if isinstance(ev, BlockStored) else None
            if isinstance(parent, int | bytes) and hash_key(parent) == last:
                return True
        return False

    def _count_hit(
        self,
        ck: tuple[object, object],
        ev: BlockStored,
        keys: list[int],
        events: Sequence[Event],
        i: int,
    ) -> None:
        """Count an announced hit once per admitted request.

        A lookup whose allocation fails announces and stops the step: nothing is stored
        after it in its group in that batch, and the scheduler looks the same request up
        again in the next step, so the next batch announces the same prefix (its length may
        differ). That earlier announcement is taken back.
        """
        c = self.counts[ev.group_idx]
        k = (ck[0], ck[1], ev.group_idx)
        prev = self._last_hit.get(k)
        if prev is not None and prev[0] == self.batch_index - 1 and prev[1] == keys[0] and prev[4]:
            c.hit_blocks -= prev[2]
            c.hit_tokens -= prev[3]
            c.failed_lookups += 1
        tail = not any(
            isinstance(e, BlockStored) and e.group_idx == ev.group_idx for e in events[i + 1 :]
        )
        self._last_hit[k] = (self.batch_index, keys[0], len(keys), len(ev.token_ids), tail)
        c.hit_blocks += len(keys)
        c.hit_tokens += len(ev.token_ids)


class SemanticsModel(_AnnouncementRules):
    """The reference model: feed batches in stream order, read :attr:`counts` at the end.

    Args:
        groups: The group metadata per group index (``get_kv_cache_group_metadata()``).
        report_mode: ``incremental`` (no request announces its hits), ``full`` (every
            request does) or ``auto`` (decide from what the stream shows).
        copy_rule: Which copy of a key with two live copies a remove evicts: ``adjacent``
            (the model's rule, see :meth:`_evict`), ``oldest`` or ``newest`` (the two
            extremes, for the lifetime bound).
    """

    def __init__(
        self,
        groups: Sequence[dict[str, object]] | None = None,
        report_mode: ReportMode = "auto",
        copy_rule: Literal["adjacent", "oldest", "newest"] = "adjacent",
    ) -> None:
        self.copy_rule = copy_rule
        self.event_serial = 0
        self.meta: dict[int, GroupInfo] = {}
        for g in groups or ():
            bs, win = g.get("block_size"), g.get("sliding_window")
            self.meta[int(g["group_idx"])] = GroupInfo(  # type: ignore[call-overload]
                kind=str(g["kind"]) if g.get("kind") is not None else None,
                block_size=int(bs) if isinstance(bs, int) else None,
                sliding_window=int(win) if isinstance(win, int) else None,
            )
        self.report_mode: ReportMode = report_mode
        self.channels: dict[tuple[object, object], dict[int | None, _Group]] = {}
        self.last_seq: dict[tuple[object, object], int] = {}
        self.counts: dict[int | None, Counts] = defaultdict(Counts)
        self.kinds: dict[int | None, str] = {}
        self.kind_live: Counter[str] = Counter()
        self.kind_peak: Counter[str] = Counter()
        self.unknown_tags: Counter[str] = Counter()
        self.announcements_seen = 0
        self.batch_index = 0
        # The last counted announcement per (channel, group): a lookup repeated in the next
        # batch (its allocation failed) is counted once (see _count_hit).
        self._last_hit: dict[
            tuple[object, object, int | None], tuple[int, int, int, int, bool]
        ] = {}

    # ------------------------------------------------------------------ input

    def feed(
        self,
        events: Sequence[Event],
        ts: float,
        *,
        channel: object = 0,
        rank: object = None,
        seq: int | None = None,
        skipped: Iterable[str] = (),
    ) -> None:
        """Apply one batch.

        Args:
            events: The batch's decoded events in order.
            ts: The batch's ``ts``.
            channel: The channel the batch came on.
            rank: Its data-parallel rank.
            seq: Its sequence number (a seq going backwards is a publisher restart).
            skipped: ``KVEventBatch.skipped`` (unknown tags are counted, never dropped).
        """
        for msg in skipped:
            m = _UNKNOWN_TAG.search(msg)
            self.unknown_tags[m.group(1) if m else "<malformed>"] += 1
        ck = (channel, rank)
        if seq is not None:
            if ck in self.last_seq and seq <= self.last_seq[ck]:
                self._clear(ck, count=False)  # a restart: the state starts afresh
            self.last_seq[ck] = seq
        groups = self.channels.setdefault(ck, {})
        pend: dict[int | None, _Pending] = defaultdict(_Pending)
        announced: set[int] = set()
        run_end = -1
        for i, ev in enumerate(events):
            if i > run_end and isinstance(ev, BlockStored):
                # Judged on the live state where the run starts (earlier evictions count).
                run = self._run(events, i)
                if run:
                    run_end = run[-1]
                    if self._is_announcement(ck, events, run):
                        announced.update(run)
            if isinstance(ev, AllBlocksCleared):
                self._clear(ck, count=True)
                pend.clear()
            elif isinstance(ev, BlockStored):
                g = self._group(
                    groups, ev.group_idx, ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window
                )
                self._store(ck, ev, ts, g, pend[ev.group_idx], i in announced, events, i)
            elif isinstance(ev, BlockRemoved):
                gi = self._remove_group(groups, ev)
                g = self._group(groups, gi, None)
                for h in ev.block_hashes:
                    self._remove(gi, hash_key(h), ts, g, pend[gi], events, i)
                self.counts[gi].remove_events += 1
        for gi, p in pend.items():
            c = self.counts[gi]
            # An evicted block's extra key whose remove never came: vLLM pops every key of
            # the block, so this is only possible on a damaged stream.
            c.removes["extra_key_without_remove"] += sum(p.folded.values())
            # A promoted block whose full key never came was evicted after all.
            c.removes["promotion"] -= len(p.promoted)
            c.removes["eviction"] += len(p.promoted)
        self.batch_index += 1

    def _group(
        self,
        groups: dict[int | None, _Group],
        gi: int | None,
        kind: str | None,
        window: int | None = None,
    ) -> _Group:
        if gi not in groups:
            info = self.meta.get(gi) if gi is not None else None
            if info is None:
                info = GroupInfo(kind=kind, block_size=None, sliding_window=window)
            groups[gi] = _Group(info)
        g = groups[gi]
        if gi not in self.kinds or self.kinds[gi] == "unannotated":
            self.kinds[gi] = g.info.kind or kind or "unannotated"
        return g

    def _remove_group(self, groups: dict[int | None, _Group], ev: BlockRemoved) -> int | None:
        if ev.group_idx is not None or not ev.block_hashes:
            return ev.group_idx
        # Older vLLM: no group on removes. The group that holds the key, if only one does.
        key = hash_key(ev.block_hashes[0])
        holders = [gi for gi, g in groups.items() if g.live(key)]
        return holders[0] if len(holders) == 1 else None

    # ------------------------------------------------------------------ stores

    def _store(
        self,
        ck: tuple[object, object],
        ev: BlockStored,
        ts: float,
        g: _Group,
        p: _Pending,
        announced: bool,
        events: Sequence[Event],
        i: int,
    ) -> None:
        gi = ev.group_idx
        c = self.counts[gi]
        c.store_events += 1
        self.event_serial += 1
        keys = [hash_key(h) for h in ev.block_hashes]
        if announced:
            c.stores["announcement"] += len(keys)
            c.tokens_announced += len(ev.token_ids)
            self._count_hit(ck, ev, keys, events, i)
            return
        c.tokens_stored += len(ev.token_ids)
        bs = ev.block_size if isinstance(ev.block_size, int) else 0
        partial = len(keys) == 1 and 0 < bs < g.block_size and len(ev.token_ids) == bs
        if partial:
            self._store_partial(gi, keys[0], tuple(ev.token_ids), ts, g, p)
            return
        if not g.info.block_size:
            g.seen_block_size = max(g.seen_block_size, bs)
        blocks = _token_blocks(ev, len(keys), g.block_size)
        for n, (key, toks) in enumerate(zip(keys, blocks, strict=True)):
            target = _promotion_target(p, toks)
            if target is not None:
                # cache_full_blocks on a block that carries a partial primary key: the block
                # gets its full key (the partial key's remove came before).
                self._rekey(gi, target, key, ts, g, p)
            else:
                blk = self._new_block(gi, key, ts, g, p, partial=False)
            blk = target or blk
            blk.tokens = toks
            blk.last_of_event = n == len(keys) - 1
            p.full.append(blk)

    def _store_partial(
        self, gi: int | None, key: int, toks: tuple[object, ...], ts: float, g: _Group, p: _Pending
    ) -> None:
        c = self.counts[gi]
        g.partial_keys.add(key)
        if p.rekey is not None:
            # MambaManager re-keys its checkpoint block (replace_existing_hashes): the block's
            # old key was removed just before; the same block gets this key.
            self._rekey(gi, p.rekey, key, ts, g, p)
            return
        host = _host(p, toks)
        if host is not None:
            # cache_partial_block on a block cached (full) earlier in this step: an extra key.
            if key not in host.keys:
                g.add_key(host, key, ts)
                c.stores["partial_extra"] += 1
                g.ever.add(key)
                c.distinct.add(key)
            else:
                c.stores["partial_extra_noop"] += 1
            return
        blk = self._new_block(gi, key, ts, g, p, partial=True)
        blk.tokens = toks
        c.partial_primary += 1

    def _new_block(
        self, gi: int | None, key: int, ts: float, g: _Group, p: _Pending, *, partial: bool
    ) -> Block:
        c = self.counts[gi]
        if g.live(key):
            cls = "stored_while_live"
        elif key in g.ever:
            cls = "recompute"
        else:
            cls = "new_entry"
        c.stores[cls] += 1
        g.ever.add(key)
        c.distinct.add(key)
        blk = Block(keys=[], stored_ts={}, partial_primary=partial, store_class=cls, batch=0)
        blk.batch = self.batch_index
        blk.origin = self.event_serial
        g.add_key(blk, key, ts)
        p.stored.setdefault(key, []).append(blk)
        p.rekey = None
        self._live(gi, +1)
        return blk

    def _rekey(
        self, gi: int | None, blk: Block, key: int, ts: float, g: _Group, p: _Pending
    ) -> None:
        c = self.counts[gi]
        c.stores["rekey"] += 1
        if g.live(key):
            c.stores["rekey_of_live_key"] += 1  # the re-keyed block is a second copy
        g.ever.add(key)
        c.distinct.add(key)
        if blk.keys:
            blk.keys.clear()  # the old key was removed by the event that started the re-key
        blk.partial_primary = False
        g.add_key(blk, key, ts)
        p.stored.setdefault(key, []).append(blk)
        p.rekey = None
        self._live(gi, +1)  # the block was taken off the live count by its key's remove

    # ------------------------------------------------------------------ removes

    def _remove(
        self,
        gi: int | None,
        key: int,
        ts: float,
        g: _Group,
        p: _Pending,
        events: Sequence[Event],
        i: int,
    ) -> None:
        c = self.counts[gi]
        if p.folded[key] > 0:
            # _remove_cached_block_hashes: one remove per key of an evicted block.
            p.folded[key] -= 1
            if not p.folded[key]:
                del p.folded[key]
            c.removes["eviction_extra_key"] += 1
            return
        if not g.live(key):
            c.removes["orphan"] += 1
            return
        copies = g.copies[key]
        later = [e for e in events[i + 1 :] if getattr(e, "group_idx", None) == gi]
        if key in g.partial_keys:
            blk = next(
                (b for b in copies if b.keys and b.keys[0] == key and b.partial_primary), None
            )
            if blk is not None and any(
                isinstance(e, BlockStored)
                and len(e.block_hashes) == 1
                and hash_key(e.block_hashes[0]) == key
                for e in later
            ):
                # Partial -> full promotion (cache_full_blocks removes the partial primary
                # key, stores the full key, cache_partial_block re-stores the partial key).
                self._unkey_block(gi, blk, g, p)
                p.promoted[key] = blk
                c.removes["promotion"] += 1
                return
        fresh = p.stored.get(key, [])
        old = [b for b in copies if b not in fresh]
        if g.info.kind == "mamba" and not old:
            blk = fresh[-1]
            nxt = later[0] if later else None
            if (
                blk.last_of_event  # a checkpoint a later block of its store supersedes: discard
                and isinstance(nxt, BlockStored)
                and len(nxt.block_hashes) == 1
                and isinstance(nxt.block_size, int)
                and nxt.block_size < g.block_size
            ):
                # MambaManager re-keys its checkpoint block (replace_existing_hashes=True).
                self._unkey_block(gi, blk, g, p)
                p.rekey = blk
                c.removes["rekey_remove"] += 1
            else:
                # A transient checkpoint dropped by the Mamba manager (_maybe_evict_cached_block
                # outside get_new_blocks): stored and discarded in one step, never a block
                # the pool kept; it leaves blocks_stored again.
                self._unkey_block(gi, blk, g, p)
                c.removes["discard"] += 1
                c.stores[blk.store_class] -= 1
                c.stores["discarded"] += 1
            return
        self._evict(gi, key, ts, g, p, old or copies, later)

    def _unkey_block(self, gi: int | None, blk: Block, g: _Group, p: _Pending) -> None:
        """Take every key off ``blk`` (their removes follow, one per key, as folded)."""
        first = True
        for k in list(blk.keys):
            g.drop_key(blk, k)
            if not first:
                p.folded[k] += 1
            first = False
        self._live(gi, -1)

    def _evict(
        self,
        gi: int | None,
        key: int,
        ts: float,
        g: _Group,
        p: _Pending,
        candidates: list[Block],
        later: list[Event],
    ) -> None:
        """Evict the block ``key`` names, with all its keys.

        vLLM evicts whichever copy of a twice-cached key reaches the free-queue head first;
        the wire does not say which. The copy whose extra keys are removed next is the one
        (exact); otherwise ``copy_rule``: ``adjacent`` takes the copy made by the same store
        event as the block evicted just before (a request's blocks are freed together and
        sit side by side in the queue), else the oldest; ``oldest`` and ``newest`` are the
        extremes whose lifetime quantiles bound the truth's (docs/SEMANTICS.md).
        """
        c = self.counts[gi]
        blk = candidates[0]
        if len(candidates) > 1:
            c.ambiguous_copy_evictions += 1
            nxt = {
                hash_key(e.block_hashes[0])
                for e in later[:8]
                if isinstance(e, BlockRemoved) and e.block_hashes
            }
            named = [b for b in candidates if any(k in nxt for k in b.keys if k != key)]
            if named:
                blk = named[0]
            elif self.copy_rule == "newest":
                blk = candidates[-1]
            elif self.copy_rule == "adjacent":
                same = [b for b in candidates if b.origin == p.last_evicted_origin]
                blk = same[0] if same else candidates[0]
        p.last_evicted_origin = blk.origin
        if blk.batch == self.batch_index:
            c.evicted_same_batch += 1
        c.removes["eviction"] += 1
        c.lifetimes.append(_age(ts, blk.stored_ts[key]))
        for k in blk.keys:
            if k != key:  # its remove follows: folded into this eviction
                c.lifetimes.append(_age(ts, blk.stored_ts[k]))
                p.folded[k] += 1
        for k in list(blk.keys):
            g.drop_key(blk, k)
        self._live(gi, -1)

    # ------------------------------------------------------------------ clears

    def _clear(self, ck: tuple[object, object], *, count: bool) -> None:
        groups = self.channels.get(ck, {})
        for gi, g in groups.items():
            blocks = g.blocks()
            if count:
                c = self.counts[gi]
                c.blocks_cleared += len(blocks)
                c.entries_cleared += sum(len(b.keys) for b in blocks)
            for _ in blocks:
                self._live(gi, -1)
            g.copies.clear()
            if not count:
                g.ever.clear()
                g.partial_keys.clear()

    def _live(self, gi: int | None, d: int) -> None:
        c = self.counts[gi]
        c.live_blocks += d
        c.peak_live_blocks = max(c.peak_live_blocks, c.live_blocks)
        kind = self.kinds.get(gi, "unannotated")
        self.kind_live[kind] += d
        self.kind_peak[kind] = max(self.kind_peak[kind], self.kind_live[kind])
        self.kind_live["__total__"] += d
        self.kind_peak["__total__"] = max(self.kind_peak["__total__"], self.kind_live["__total__"])
