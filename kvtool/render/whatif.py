"""Render what-if predictions: one line per extra size and kind (fits 80 columns)."""

from __future__ import annotations

from collections.abc import Sequence

from kvtool.report.registry import usable_blocks
from kvtool.text import printable


def _pct(before: int, after: int) -> str:
    if before == 0:
        return "±0 %" if after == 0 else "new"
    p = round((after - before) / before * 100)
    sign = "\u2212" if p < 0 else "+" if p > 0 else "±"  # the minus sign of the issue
    return f"{sign}{abs(p)} %"


def _pool_title(entry: dict[str, object]) -> str:
    rank = entry.get("rank")
    pool = entry.get("pool_blocks")
    size = f"{pool:,} blocks" if isinstance(pool, int) else "size unknown"
    r = f", rank {rank}" if rank is not None else ""
    return f"what if the pool were larger — {printable(str(entry['channel']))}{r} ({size})"


def what_if_lines(entries: Sequence[dict[str, object]]) -> list[str]:
    """Return the table lines: a title per pool, then one line per extra size and kind.

    Example line: ``+60 blocks  full_attention  recomputed 3,714 → ~3,290 (-11 %)``
    (with a minus sign).

    Args:
        entries: The ``what_if`` entries of :func:`kvtool.report.whatif.what_if`.

    Returns:
        Lines without newlines, each at most 80 columns for the usual kinds.
    """
    out: list[str] = []
    last_pool: tuple[object, object] | None = None
    width = max((len(f"+{e['extra_blocks']:,}") for e in entries), default=2)
    kinds = [
        str(r["kind"])
        for e in entries
        for r in e["by_kind"]  # type: ignore[attr-defined]
    ]
    kw = max((len(k) for k in kinds), default=4)
    for e in entries:
        pool = (e["channel"], e["rank"])
        if pool != last_pool:
            if out:
                out.append("")
            out.append(_pool_title(e))
            last_pool = pool
        k = f"+{e['extra_blocks']:,}".rjust(width)
        rows = e["by_kind"]
        assert isinstance(rows, list)
        for row in rows:
            before = int(row["blocks_recomputed_recorded"])
            after = int(row["blocks_recomputed"])
            line = (
                f"{k} blocks  {printable(str(row['kind'])).ljust(kw)}  "
                f"recomputed {before:,} → ~{after:,} ({_pct(before, after)})"
            )
            band = row.get("blocks_recomputed_band")
            if isinstance(band, list) and band[0] != band[1]:
                line += f" band {band[0]:,}-{band[1]:,}"
            out.append(line)
        totals = e["totals"]
        assert isinstance(totals, dict)
        out.append(
            f"{' ' * width}         prefix hits +{int(totals['hit_tokens_gained']):,} tokens"
        )
    return out


def condition_lines(entries: Sequence[dict[str, object]]) -> list[str]:
    """Return one ``condition:`` line per distinct condition of the entries.

    Args:
        entries: The ``what_if`` entries.

    Returns:
        Lines such as ``condition: mamba: …``.
    """
    out: list[str] = []
    for e in entries:
        conds = e.get("conditions")
        if not isinstance(conds, list):
            continue
        for c in conds:
            line = f"condition: {c['condition']}: {printable(str(c['detail']))}"
            if line not in out:
                out.append(line)
    return out


def pool_occupancy(totals: dict[str, object], pool_blocks: int) -> dict[str, object]:
    """Live and peak blocks as a share of one engine's pool (``--pool-blocks``).

    vLLM's block 0 is the null block: ``pool_blocks - 1`` blocks hold cached entries.

    Args:
        totals: The report's totals row.
        pool_blocks: The engine's ``num_gpu_blocks``.

    Returns:
        The JSON ``pool`` object: ``pool_blocks``, ``usable_blocks``, ``live_blocks_end``,
        ``live_share``, ``peak_live_blocks``, ``peak_share`` (shares of the usable blocks).
    """
    usable = usable_blocks(pool_blocks)
    live = totals.get("live_blocks_end")
    peak = totals.get("peak_live_blocks")
    out: dict[str, object] = {"pool_blocks": pool_blocks, "usable_blocks": usable}
    for name, v in (("live", live), ("peak", peak)):
        key = "live_blocks_end" if name == "live" else "peak_live_blocks"
        out[key] = v if isinstance(v, int) else None
        out[f"{name}_share"] = round(v / usable, 4) if isinstance(v, int) else None
    return out


def several_pools(source: str, pools: int, *, given: bool) -> str:
    """Say that live and peak shares need one pool, and the input has several.

    ``--pool-blocks N`` is one engine's ``num_gpu_blocks`` (one pool per engine, i.e. per
    channel and data-parallel rank). Given on the command line for an input of several
    pools, it is refused (the caller exits 2): a share of which pool is not knowable from
    the totals. Taken from metadata, it is a note.

    Args:
        source: Where the pool size came from (:class:`kvtool.poolsize.PoolSize`).
        pools: The input's channels.
        given: Whether ``--pool-blocks`` was given on the command line.

    Returns:
        One line, without the ``kvtool:`` prefix.
    """
    if given:
        return (
            f"{source}: one engine's pool, but the input has {pools:,} channels (one pool "
            "each): pick one with --channel (and --rank), or give K in blocks to --what-if "
            "without --pool-blocks"
        )
    return (
        f"pool size ({source}): live and peak shares need one pool (one channel); "
        "the input has several"
    )


def pool_line(pool: dict[str, object]) -> str:
    """One line: ``pool 600 blocks (599 usable): live at end 593 (99 %), peak 593 (99 %)``.

    Args:
        pool: :func:`pool_occupancy`'s object.

    Returns:
        The line.
    """
    parts = []
    for label, key, share in (
        ("live at end", "live_blocks_end", "live_share"),
        ("peak", "peak_live_blocks", "peak_share"),
    ):
        v, sh = pool.get(key), pool.get(share)
        if isinstance(v, int) and isinstance(sh, float):
            parts.append(f"{label} {v:,} ({round(sh * 100)} %)")
    return f"pool {pool['pool_blocks']:,} blocks ({pool['usable_blocks']:,} usable): " + ", ".join(
        parts
    )


__all__ = ["condition_lines", "pool_line", "pool_occupancy", "several_pools", "what_if_lines"]
