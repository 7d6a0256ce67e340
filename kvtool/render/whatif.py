"""Render what-if predictions: one line per extra size and kind (fits 80 columns)."""

from __future__ import annotations

from collections.abc import Sequence

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


__all__ = ["condition_lines", "what_if_lines"]
