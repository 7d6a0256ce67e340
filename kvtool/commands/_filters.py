"""Checks of ``replay``'s filter values, and the line that says when they selected nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtool.annotate import kind_label
from kvtool.errors import UsageError
from kvtool.text import printable

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from kvtool.commands import Env
    from kvtool.replay import Replay, TimeBound

SPECIAL_KINDS = ("unannotated", "unattributed")
"""Kind names kvtool adds: stores without a kind, removes no store explains."""


def first_log_time(rp: Replay) -> int | None:
    """Return the receive time of the replay's first message (what ``--since 0`` means).

    Args:
        rp: An opened replay, not yet iterated.

    Returns:
        ns since the epoch, or None for recordings without messages.
    """
    it = rp.messages()
    try:
        first = next(it, None)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return first.log_time if first is not None else None


def check_kinds(kinds: Iterable[str], rp: Replay) -> None:
    """Refuse a ``--kind`` that no vLLM version names and no group metadata at hand names.

    Args:
        kinds: The ``--kind`` values.
        rp: The opened replay (its recordings' and flags' group metadata count as known).

    Raises:
        UsageError: A misspelt kind, with the closest known names.
    """
    from kvtool.annotate import KINDS, unknown_kind

    known = set(KINDS) | set(SPECIAL_KINDS)
    tables = [t for t in getattr(rp, "tables", {}).values() if t is not None]
    if rp.given is not None:
        tables.append(rp.given)
    for table in tables:
        known.update(kind_label(str(g.kind)) for g in getattr(table, "groups", {}).values())
    for r in rp.readers:
        for g in r.groups or []:
            kind = g.get("kind") if isinstance(g, dict) else None
            if isinstance(kind, str):
                known.add(kind_label(kind))
    for k in kinds:
        if k in known:
            continue
        raise UsageError(
            unknown_kind(
                f"--kind {printable(k)!r}",
                k,
                known,
                extra=f"; kvtool's: {', '.join(SPECIAL_KINDS)}",
            )
        )


def check_time_order(
    since: TimeBound | None,
    until: TimeBound | None,
    start_ns: int | None,
    texts: tuple[str | None, str | None],
) -> None:
    """Refuse ``--since`` later than ``--until`` (an empty window, never what was meant).

    Args:
        since: The ``--since`` bound.
        until: The ``--until`` bound.
        start_ns: The first message's receive time (relative bounds count from it).
        texts: The two values as typed, for the message.

    Raises:
        UsageError: The window is empty.
    """
    if since is None or until is None:
        return
    base = start_ns if start_ns is not None else 0
    if since.absolute_ns is not None and until.absolute_ns is None and start_ns is None:
        return
    if until.absolute_ns is not None and since.absolute_ns is None and start_ns is None:
        return
    if since.resolve(base) > until.resolve(base):
        raise UsageError(
            f"--since {printable(texts[0])} is after --until {printable(texts[1])}: "
            "the window is empty"
        )


def say_if_empty(rp: Replay, env: Env, given: Sequence[tuple[str, str]]) -> None:
    """When valid filters selected nothing, say so on stderr with what the input holds.

    E.g. ``0 of 1,925 events matched --seq 70:80; seqs in the input: 0-63``. A second,
    cheap pass over the input finds the seq range, the time span and the kinds.

    Args:
        rp: The replay, after iterating it.
        env: Where to write.
        given: The filters as typed: (option, value) pairs.
    """
    if not given or rp.stats.batches > 0 or rp.stats.messages == 0:
        return
    from kvtool.errors import ProtocolError
    from kvtool.protocol import BlockStored, decode_batch

    opts = {o for o, _ in given}
    lo = hi = None
    first = last = None
    n_events = 0
    kinds: set[str] = set()
    ranks: set[str] = set()
    channels: set[str] = set()
    for m in rp.messages():
        channels.add(m.channel.name)
        lo = m.seq if lo is None else min(lo, m.seq)
        hi = m.seq if hi is None else max(hi, m.seq)
        first = m.log_time if first is None else min(first, m.log_time)
        last = m.log_time if last is None else max(last, m.log_time)
        try:
            batch = decode_batch(m.data, seq=m.seq)
        except ProtocolError:
            continue
        rank = m.channel.dp_rank if m.channel.dp_rank is not None else batch.data_parallel_rank
        ranks.add("none" if rank is None else str(rank))
        n_events += len(batch.events)
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                kinds.add(kind_label(ev.kv_cache_spec_kind))
    what = f"0 of {n_events:,} events ({rp.stats.messages:,} batches)"
    flags = " ".join(f"{o} {v}" for o, v in given)
    facts = []
    if "--seq" in opts and lo is not None:
        facts.append(f"seqs in the input: {lo}-{hi}")
    if opts & {"--since", "--until"} and first is not None and last is not None:
        facts.append(f"the input spans 0-{(last - first) / 1e9:.3f} s (receive time)")
    if "--kind" in opts:
        facts.append("kinds of stores in the input: " + (", ".join(sorted(kinds)) or "none"))
    if "--rank" in opts:
        facts.append("ranks in the input: " + (", ".join(sorted(ranks)) or "none"))
    if "--channel" in opts:
        facts.append("channels in the input: " + ", ".join(sorted(channels)))
    line = f"kvtool: {what} matched {flags}" + (f"; {'; '.join(facts)}" if facts else "")
    env.err.print(printable(line), markup=False, highlight=False)


__all__ = ["SPECIAL_KINDS", "check_kinds", "check_time_order", "first_log_time", "say_if_empty"]
