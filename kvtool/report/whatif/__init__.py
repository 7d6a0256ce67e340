"""What-if sizing: the blocks a pool K blocks larger would still recompute, from one recording.

``kvtool report FILE --what-if +K[,+K…]``: every pool (channel, data-parallel rank) of
the input is replayed in its recorded event order against a pool K blocks larger
(:mod:`kvtool.report.whatif.kernel`), per kind, sliding window and group. The
prediction assumes the same requests in the same order; where the stream says an
assumption fails, the entry's ``conditions`` say so, and a pool whose stream cannot
support a prediction at all is refused (:class:`WhatIfRefused`, exit status 2).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from kvtool.annotate import kind_label
from kvtool.errors import KvtoolError, UsageError
from kvtool.recording.reader import open_recording
from kvtool.recording.unconfirmed import SHOWN, lost_line
from kvtool.replay import BatchFilter
from kvtool.report.whatif.build import RESUME_BATCHES, RESUME_TAIL_BATCHES
from kvtool.report.whatif.errors import WhatIfRefused
from kvtool.report.whatif.extract import (
    GroupInfo,
    PoolFeed,
    PoolStream,
    extract_pools,
    input_annotation,
)
from kvtool.report.whatif.kernel import KIND_MAMBA, simulate
from kvtool.report.whatif.kernel import recorded as recorded_counts
from kvtool.text import printable

COLUMNS = ("blocks_recomputed", "blocks_recomputed_saved", "hit_tokens_gained")
"""The predicted columns of every what-if row (plus ``blocks_recomputed_recorded``)."""

_EXTRA = re.compile(r"^\+?(\d+(?:\.\d+)?)(%?)$")


MAX_EXTRA_BLOCKS = 2**31 - 1
"""The largest ``+K`` (the kernels count blocks in 64-bit; vLLM's pools are far smaller)."""


@dataclass(frozen=True)
class Extra:
    """One ``--what-if`` value: K blocks, or P percent of the pool.

    Attributes:
        text: As given (``+60``, ``+10%``).
        blocks: K, when given in blocks.
        percent: P, when given in percent.
    """

    text: str
    blocks: int | None = None
    percent: float | None = None

    def resolve(self, pool_blocks: int | None) -> int | None:
        """Return K in blocks for a pool of ``pool_blocks`` (None: size unknown).

        Args:
            pool_blocks: The pool's ``num_gpu_blocks``, when known.

        Returns:
            The extra blocks, or None when a percentage meets an unknown pool size.

        Raises:
            UsageError: The percentage comes to more than ``MAX_EXTRA_BLOCKS``, the cap on
                K given in blocks.
        """
        if self.blocks is not None:
            return self.blocks
        if pool_blocks is None or self.percent is None:
            return None
        k = pool_blocks * self.percent / 100.0
        if not k <= MAX_EXTRA_BLOCKS:  # also catches an infinite percentage
            raise UsageError(
                f"--what-if {self.text}: more than +{MAX_EXTRA_BLOCKS:,} blocks for a pool of "
                f"{pool_blocks:,} (a pool is far smaller)"
            )
        return round(k)


def parse_what_if(text: str) -> list[Extra]:
    """Parse ``--what-if +K[,+K…]`` (blocks) or ``+P%`` values.

    Args:
        text: The option's value.

    Returns:
        The extras, in the order given.

    Raises:
        UsageError: A value is neither ``+K`` nor ``+P%``, or a size is given twice
            (``+60,+60``, ``+60,+060``, ``+10%,+10.0%``): one prediction each, said once.
    """
    out: list[Extra] = []
    for part in (p.strip() for p in text.split(",")):
        m = _EXTRA.match(part)
        if not part or m is None:
            raise UsageError(
                f"--what-if {text!r}: expected +K blocks or +P% (e.g. +60,+10%), got {part!r}"
            )
        value, pct = m.group(1), m.group(2)
        if pct:
            e = Extra(part, percent=float(value))
        elif "." in value:
            raise UsageError(f"--what-if {part!r}: a count of blocks is a whole number")
        elif int(value) > MAX_EXTRA_BLOCKS:
            raise UsageError(
                f"--what-if {part!r}: at most +{MAX_EXTRA_BLOCKS:,} blocks (a pool is far smaller)"
            )
        else:
            e = Extra(part, blocks=int(value))
        same = next((o for o in out if (o.blocks, o.percent) == (e.blocks, e.percent)), None)
        if same is not None:
            raise UsageError(f"--what-if {text!r}: {_twice(same.text, part)}; give each size once")
        out.append(e)
    return out


def _twice(first: str, again: str) -> str:
    """``+60 is given twice``, or ``+060 is +60 again`` when written differently."""
    return f"{first} is given twice" if first == again else f"{again} is {first} again"


@dataclass(frozen=True)
class LostBatches:
    """Batches one recording's gap ledger lists as lost while recording.

    Attributes:
        path: The recording.
        lost: Batches lost (exact).
        ranges: The lost seq ranges ``(first, last)`` the ledger lists.
        more: Ranges were left out of ``ranges`` (the ledger's ``lost_ranges_omitted``).
    """

    path: str
    lost: int
    ranges: tuple[tuple[int, int], ...] = ()
    more: bool = False

    def line(self) -> str:
        """The one wording of it (:func:`kvtool.recording.unconfirmed.lost_line`)."""
        return lost_line(self.path, self.lost, self.ranges, more=self.more)


def lost_batches(paths: Sequence[str | os.PathLike[str]]) -> list[LostBatches]:
    """Read what each recording's gap ledger lists as lost (record headers only).

    Args:
        paths: The recordings; one that cannot be opened is left to the report.

    Returns:
        One entry per recording that lost batches.
    """
    out: list[LostBatches] = []
    for path in paths:
        try:
            with open_recording(path) as reader:
                ledger = reader.gap_ledger
        except (KvtoolError, OSError):
            continue
        if ledger is None or ledger.lost <= 0:
            continue
        ranges = tuple((int(a), int(b)) for a, b in ledger.lost_ranges)
        more = bool(ledger.lost_ranges_omitted)
        out.append(LostBatches(printable(os.fspath(path)), ledger.lost, ranges, more))
    return out


@dataclass
class WhatIf:
    """The what-if result: JSON-ready entries (one per pool and K) and findings.

    Attributes:
        entries: The ``what_if`` list of ``--format json``.
        findings: One line per condition that weakens a prediction.
    """

    entries: list[dict[str, object]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)


def _kind(info: GroupInfo) -> str:
    # The report's label rule: a kind spelled like kvtool's labels stays apart (issue 24).
    return kind_label(info.kind)


def _unannotated(pool: PoolStream) -> list[GroupInfo]:
    """The pool's groups no source gave a kind: the replay gives them the full-attention rule."""
    return [g for g in pool.groups if g.kind is None or g.kind == "unknown"]


def _group_names(groups: Sequence[GroupInfo]) -> str:
    names = [str(g.group_idx) if g.group_idx is not None else "none" for g in groups]
    shown = ", ".join(names[:SHOWN]) + (", …" if len(names) > SHOWN else "")
    return f"group{'s' if len(names) > 1 else ''} {shown}"


def _conditions(
    pool: PoolStream, lost: Sequence[LostBatches], evictions: int, orphans: int = 0
) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    bare = _unannotated(pool)
    if bare:
        out.append(
            {
                "condition": "unannotated_groups",
                "detail": f"{_group_names(bare)} of {len(pool.groups)} "
                f"{'carry' if len(bare) > 1 else 'carries'} no kind (no kv_cache_spec_kind, "
                "groups file or flag), so the replay gives "
                f"{'them' if len(bare) > 1 else 'it'} the full-attention hit rule; a sliding-"
                "window or Mamba group is then mispredicted: give --group-meta "
                "IDX=KIND[:WINDOW] or --groups FILE",
            }
        )
    if orphans:
        out.append(
            {
                "condition": "orphan_removes",
                "detail": f"{orphans} removed blocks were not live (the stream began mid-way "
                "or batches were lost): evictions before the recording are not in the order",
            }
        )
    if lost:
        out.append(
            {
                "condition": "lost_batches",
                "detail": "the eviction order is incomplete: "
                + "; ".join(one.line() for one in lost),
            }
        )
    if pool.removes_without_group:
        out.append(
            {
                "condition": "removes_without_group_idx",
                "detail": f"{pool.removes_without_group} removed blocks carry no group_idx "
                "(layouts before vLLM 0.21); attributed to the pool's only group",
            }
        )
    if pool.seq_regressions:
        out.append(
            {
                "condition": "publisher_restart",
                "detail": f"the publisher's seq went backwards {pool.seq_regressions} time(s); "
                "each restart starts the pool afresh",
            }
        )
    resumed = resumed_requests(pool)
    if heavy_preemption(resumed, pool.requests):
        out.append(
            {
                "condition": "heavy_preemption",
                "detail": f"{resumed:,} of {pool.requests:,} requests look like preempted "
                "requests resuming (a request stores again another's abandoned tail within "
                f"{RESUME_TAIL_BATCHES} batches, or within {RESUME_BATCHES} going on past it; "
                "only preemptions whose freed blocks were evicted show): a larger pool "
                "preempts less and reorders the requests, so the prediction is less certain",
            }
        )
    if any(g.kind == "mamba" for g in pool.groups):
        out.append(
            {
                "condition": "mamba",
                "detail": "Mamba states are cached where chunks ended, which a larger pool "
                "changes: the prediction is a band (blocks_recomputed_band)",
            }
        )
    if evictions == 0:
        out.append(
            {
                "condition": "no_evictions",
                "detail": "the pool never evicted: a larger pool saves nothing",
            }
        )
    out.append(
        {
            "condition": "same_requests",
            "detail": "assumes the same requests in the same order; preemption, "
            "connectors/offload and speculative decoding are not modelled",
        }
    )
    return out


HEAVY_PREEMPTION_SHARE = 0.005
"""Requests taken for preempted ones resuming, as a share of all, that make preemption heavy.

Only a preemption whose freed blocks were evicted before it resumed shows on the wire (the
victim stores them again); one that finds them all cached continues its chain like any
running request. On vLLM 0.33's KVCacheManager that is about a third of the preemptions
(12-13 shown of 37-44 preemptions in 714-725 requests, bench/RESULTS.md), so half a percent
shown is one or two percent preempted."""
HEAVY_PREEMPTION_MIN = 5
"""And at least this many (a few preemptions change little)."""


def resumed_requests(pool: PoolStream) -> int:
    """Requests of the pool taken for preempted ones resuming (:func:`build.build`'s rule)."""
    a = pool.arrays.get("resumed")
    return int(a[0]) if a is not None and len(a) else 0


def heavy_preemption(resumed: int, requests: int) -> bool:
    """The ``heavy_preemption`` rule: at least 5 resumed requests and 0.5 % of all.

    Args:
        resumed: Requests taken for preempted ones resuming.
        requests: Requests rebuilt from the stream.
    """
    return resumed >= max(HEAVY_PREEMPTION_MIN, HEAVY_PREEMPTION_SHARE * requests)


def _refusal(pool: PoolStream) -> str | None:
    name = f"{pool.channel} rank {pool.rank if pool.rank is not None else 'none'}"
    multi = len([g for g in pool.groups if g.group_idx is not None]) > 1
    if multi and pool.removes_without_group:
        return (
            f"what-if refused for {name}: {pool.removes_without_group} removed blocks carry "
            "no group_idx in a pool of several groups, so the eviction order cannot be "
            "attributed (record with vLLM 0.21 or later)"
        )
    if multi and pool.stores_without_group:
        return (
            f"what-if refused for {name}: {pool.stores_without_group} stored blocks carry no "
            "group_idx in a pool of several groups"
        )
    if pool.seq_regressions > max(2, pool.batches // 100):
        return (
            f"what-if refused for {name}: the seq goes backwards {pool.seq_regressions} "
            "times: several pools are merged in one stream without ranks"
        )
    return None


def _rows(
    pool: PoolStream,
    keyname: str,
    rec: np.ndarray,
    pred: np.ndarray,
    band: tuple[np.ndarray, np.ndarray] | None,
    hit_tokens: int,
) -> list[dict[str, object]]:
    buckets: dict[object, list[int]] = {}
    for i, g in enumerate(pool.groups):
        if keyname == "kind":
            k: object = _kind(g)
        elif keyname == "sliding_window":
            k = g.sliding_window
        else:
            k = g.group_idx
        buckets.setdefault(k, []).append(i)
    out: list[dict[str, object]] = []
    for k, idx in buckets.items():
        row: dict[str, object] = {keyname: k}
        if keyname == "group_idx":
            g = pool.groups[idx[0]]
            row["kind"] = _kind(g)
            row["sliding_window"] = g.sliding_window
        r = int(rec[idx].sum())
        p = int(pred[idx].sum())
        row["blocks_recomputed_recorded"] = r
        row["blocks_recomputed"] = p
        row["blocks_recomputed_saved"] = r - p
        row["hit_tokens_gained"] = hit_tokens
        if band is not None:
            lo, hi = int(band[0][idx].sum()), int(band[1][idx].sum())
            row["blocks_recomputed_band"] = [min(lo, hi, p), max(lo, hi, p)]
        out.append(row)
    return out


def _run(pool: PoolStream, extra: int, rejoin: bool) -> tuple[np.ndarray, int]:
    rc, hit, _orphans = _simulate(pool, extra, rejoin)
    return rc, hit


def _simulate(pool: PoolStream, extra: int, rejoin: bool) -> tuple[np.ndarray, int, int]:
    a = pool.arrays
    rc, _dup, _saved, _stores, _first, hit, orphans = simulate(
        a["op_kind"],
        a["op_a"],
        a["op_depth"],
        a["op_group"],
        a["op_rec"],
        a["rec_req"],
        a["rec_s0"],
        a["rec_depths"],
        a["req_first_rec"],
        a["req_l0"],
        a["req_cap"],
        a["req_c0"],
        a["cand"],
        a["req_p0"],
        a["pre"],
        a["gkind"],
        a["gsw"],
        pool.n_keys,
        extra,
        rejoin,
    )
    return rc, int(hit), int(orphans)


def predict(
    pool: PoolStream,
    extras: Sequence[Extra],
    *,
    pool_blocks: int | None = None,
    lost: Sequence[LostBatches] = (),
) -> list[dict[str, object]]:
    """Predict one pool at every extra size.

    Args:
        pool: The pool's arrays (:func:`kvtool.report.whatif.extract.extract_pools`).
        extras: The ``--what-if`` values.
        pool_blocks: The pool's ``num_gpu_blocks``, when known.
        lost: The batches the recordings lost (:func:`lost_batches`).

    Returns:
        One JSON-ready entry per extra.

    Raises:
        WhatIfRefused: The stream cannot support a prediction, or a percentage needs
            the unknown pool size.
    """
    why = _refusal(pool)
    if why is not None:
        raise WhatIfRefused(why)
    sizes: list[tuple[Extra, int]] = []
    for e in extras:
        k = e.resolve(pool_blocks)
        if k is None:
            raise WhatIfRefused(
                f"--what-if {e.text}: the pool size of {pool.channel} is unknown; "
                "give --pool-blocks N (vllm:cache_config_info num_gpu_blocks) or K in blocks"
            )
        sizes.append((e, k))
    mamba = bool((pool.arrays["gkind"] == KIND_MAMBA).any())
    # +60 and +10% of 600 are one replay, answered under each name the user gave.
    ks = list(dict.fromkeys(k for _e, k in sizes))
    jobs = [(k, True) for k in ks] + ([(k, False) for k in ks] if mamba else [])
    # The kernel runs without the GIL: the replays of one pool run side by side.
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as ex:
        runs = dict(zip(jobs, ex.map(lambda j: _simulate(pool, *j), jobs), strict=True))
    a = pool.arrays
    recorded, n_orphans = recorded_counts(
        a["op_kind"], a["op_a"], a["op_group"], pool.n_keys, len(a["gkind"])
    )
    orphans = int(n_orphans)
    evictions = int((pool.arrays["op_kind"] == 1).sum())
    conditions = _conditions(pool, lost, evictions, orphans)
    block_size = max([g.block_size for g in pool.groups] + [1])
    out: list[dict[str, object]] = []
    for e, k in sizes:
        pred, hit, _ = runs[(k, True)]
        band = (runs[(k, False)][0], pred) if mamba else None
        tokens = hit * block_size
        entry: dict[str, object] = {
            "channel": pool.channel,
            "rank": pool.rank,
            "pool_blocks": pool_blocks,
            "extra_blocks": k,
            "extra": e.text,
            "totals": _totals(recorded, pred, band, tokens),
            "by_kind": _rows(pool, "kind", recorded, pred, band, tokens),
            "by_window": _rows(pool, "sliding_window", recorded, pred, band, tokens),
            "by_group": _rows(pool, "group_idx", recorded, pred, band, tokens),
            "conditions": conditions,
            "requests": pool.requests,
            "resumed_requests": resumed_requests(pool),
        }
        out.append(entry)
    return out


def _totals(
    rec: np.ndarray, pred: np.ndarray, band: tuple[np.ndarray, np.ndarray] | None, tokens: int
) -> dict[str, object]:
    r, p = int(rec.sum()), int(pred.sum())
    row: dict[str, object] = {
        "blocks_recomputed_recorded": r,
        "blocks_recomputed": p,
        "blocks_recomputed_saved": r - p,
        "hit_tokens_gained": tokens,
    }
    if band is not None:
        lo, hi = int(band[0].sum()), int(band[1].sum())
        row["blocks_recomputed_band"] = [min(lo, hi, p), max(lo, hi, p)]
    return row


def what_if(
    paths: Sequence[str | os.PathLike[str]],
    extras: Sequence[Extra],
    *,
    pool_blocks: int | None = None,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    batch_filter: BatchFilter | None = None,
    lost: Sequence[LostBatches] | None = None,
    feed: PoolFeed | None = None,
) -> WhatIf:
    """Read the recordings and predict every pool at every extra size.

    Args:
        paths: The recordings.
        extras: The ``--what-if`` values.
        pool_blocks: ``--pool-blocks N``: every pool's ``num_gpu_blocks``.
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        batch_filter: ``--channel/--rank/--since/--until``.
        lost: The batches the recordings lost; None: read from their gap ledgers
            (:func:`lost_batches`).
        feed: A feed that already took the input's raw chunks (the report's read,
            :func:`kvtool.report.build_report`'s ``raw_tap``); None: read them here.

    Returns:
        The entries and findings.

    Raises:
        WhatIfRefused: A pool's stream cannot support a prediction.
        RecordingError: A recording cannot be opened.
        MetadataError: The group metadata is invalid.
    """
    if feed is not None:
        ann = input_annotation(paths, groups_file=groups_file, group_flags=group_flags)
        pools = feed.finish(ann)
    else:
        pools = extract_pools(
            paths, groups_file=groups_file, group_flags=group_flags, batch_filter=batch_filter
        )
    if lost is None:
        lost = lost_batches(paths)
    result = WhatIf()
    for pool in pools:
        entries = predict(pool, extras, pool_blocks=pool_blocks, lost=lost)
        result.entries.extend(entries)
        if entries:
            conds = entries[0]["conditions"]
            assert isinstance(conds, list)
            for c in conds:
                if c["condition"] != "same_requests":
                    line = f"what-if {pool.channel}: {c['detail']}"
                    if line not in result.findings:
                        result.findings.append(line)
    return result


__all__ = [
    "COLUMNS",
    "Extra",
    "LostBatches",
    "PoolFeed",
    "WhatIf",
    "WhatIfRefused",
    "heavy_preemption",
    "lost_batches",
    "parse_what_if",
    "predict",
    "what_if",
]
