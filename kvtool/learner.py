"""THE learner: (channel, rank, group_idx) -> (kind, window) from annotated stores.

Used when no metadata covers a stream; :class:`GroupLearner` is a function of the whole
input (learners of parts merge exactly), and stores of one key that disagree are a
:class:`Conflict`, resolved the same way by every command.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvtool.groups import GroupInfo, GroupTable, KindWindow, LearnKey, _is_i64, _is_int
from kvtool.text import plural

StreamKey = tuple[str, int | None]
"""(channel name, data-parallel rank) — two engines may serve different models."""


@dataclass(frozen=True)
class KindChange:
    """A group whose annotated stores disagree (kept for ``--check`` wording).

    Attributes:
        channel: Channel name.
        dp_rank: Data-parallel rank.
        group_idx: The group.
        seq: Seq of the first store that said ``after``.
        before: (kind, window) every command uses (see :class:`GroupLearner`).
        after: Another (kind, window) stores of the group said.
    """

    channel: str
    dp_rank: int | None
    group_idx: int
    seq: int | None
    before: KindWindow
    after: KindWindow


@dataclass(frozen=True)
class Conflict:
    """Stores of one (channel, rank, group) that say more than one (kind, window).

    Attributes:
        key: (channel, rank, group_idx).
        chosen: The (kind, window) every command uses for the key.
        said: Every (kind, window) said, with its store count and first seq, most said first.
    """

    key: LearnKey
    chosen: KindWindow
    said: tuple[tuple[KindWindow, int, int | None], ...]

    def describe(self) -> str:
        """Return one line: the group, where, what each value was said by, what is used.

        Returns:
            E.g. ``group 1: conflicting annotations on tcp://h:5557 rank 0: …``.
        """
        return f"group {self.key[2]}: {self.detail()}"

    def detail(self) -> str:
        """Return :meth:`describe` without the leading ``group N:``.

        Returns:
            The text.
        """
        ch, rank, _g = self.key
        parts = ", ".join(
            f"{_kw(*kw)} by {plural(n, 'store')}" + (f" from seq {s}" if s is not None else "")
            for kw, n, s in self.said
        )
        return (
            f"conflicting annotations on {ch} rank {rank}: {parts}; every command uses "
            f"{_kw(*self.chosen)} (the value most stores say; on a tie, the first in merge "
            "order)"
        )


@dataclass
class _Said:
    count: int
    first: tuple[object, ...]
    first_seq: int | None


@dataclass
class GroupLearner:
    """THE learner: (channel, rank, group_idx) → (kind, window) from annotated stores.

    It is a function of the whole input, not of reading order: it counts every
    (kind, window) that stores of a key say, with the merge position of the first store
    that said it, and :meth:`resolved` picks per key the value the most stores say, on a
    tie the one said first in merge order (see :mod:`kvtool.inputs`). Learners of parts
    of the input (files, chunks) combine exactly with :meth:`merge`, so the answer is the
    same whether the input is learned in one pass or in parallel pieces. A key with more
    than one value is a :class:`Conflict`.

    Attributes:
        said: key → (kind, window) → count and first position.
        block_sizes: key → the block size the first annotated store gave.
    """

    said: dict[LearnKey, dict[KindWindow, _Said]] = field(default_factory=dict)
    block_sizes: dict[LearnKey, int] = field(default_factory=dict)
    _n: int = 0

    def observe_store(
        self,
        channel: str,
        dp_rank: int | None,
        group_idx: int,
        kind: str,
        window: int | None,
        *,
        seq: int | None = None,
        position: tuple[object, ...] | None = None,
        count: int = 1,
    ) -> None:
        """Count ``count`` annotated stores of one key saying (kind, window).

        Args:
            channel: Channel name.
            dp_rank: Data-parallel rank.
            group_idx: The group.
            kind: What the stores say.
            window: Their window.
            seq: The batch seq, for messages.
            position: Merge position of the (first) store (comparable across every
                observation of this learner and those merged into it); default: the
                order of observation.
            count: How many stores.
        """
        if position is None:
            position = (self._n,)
        self._n += 1
        key = (channel, dp_rank, group_idx)
        vals = self.said.get(key)
        if vals is None:
            vals = self.said[key] = {}
        kw = (kind, window)
        got = vals.get(kw)
        if got is None:
            vals[kw] = _Said(count, position, seq)
        else:
            got.count += count
            if position < got.first:
                got.first, got.first_seq = position, seq

    def observe(
        self,
        channel: str,
        dp_rank: int | None,
        events: Iterable[object],
        seq: int | None = None,
        *,
        position: tuple[object, ...] | None = None,
    ) -> None:
        """Learn from one batch's events (decoded structs or lean projections).

        Args:
            channel: The channel name.
            dp_rank: The data-parallel rank.
            events: Events with ``group_idx``/``kv_cache_spec_kind``/
                ``kv_cache_spec_sliding_window`` attributes (non-stores have no kind).
            seq: The batch seq, for messages.
            position: The batch's merge position (default: order of observation).
        """
        said: Counter[tuple[object, object, object]] = Counter(
            (
                getattr(ev, "group_idx", None),
                kind,
                getattr(ev, "kv_cache_spec_sliding_window", None),
            )
            for ev in events
            if (kind := getattr(ev, "kv_cache_spec_kind", None)) is not None
        )
        for (idx, kind, window), n in said.items():
            # Values outside int64 are nothing vLLM sends; the table reads them as null.
            if not isinstance(kind, str) or not isinstance(idx, int) or not _is_i64(idx):
                continue
            if not isinstance(window, int) or not _is_i64(window):
                window = None
            self.observe_store(
                channel, dp_rank, idx, kind, window, seq=seq, position=position, count=n
            )
        if any((channel, dp_rank, idx) not in self.block_sizes for idx, _k, _w in said):
            for ev in events:
                idx = getattr(ev, "group_idx", None)
                size = getattr(ev, "block_size", None)
                key = (channel, dp_rank, idx)
                if (
                    isinstance(idx, int)
                    and isinstance(size, int)
                    and _is_int(size)
                    and key not in self.block_sizes
                    and getattr(ev, "kv_cache_spec_kind", None) is not None
                ):
                    self.block_sizes[key] = size  # type: ignore[index]

    def merge(self, other: GroupLearner) -> None:
        """Add what another learner (of another part of the input) saw.

        Args:
            other: The learner to fold in; positions must be comparable with this one's.
        """
        for key, vals in other.said.items():
            for (k, w), s in vals.items():
                self.observe_store(
                    key[0],
                    key[1],
                    key[2],
                    k,
                    w,
                    seq=s.first_seq,
                    position=s.first,
                    count=s.count,
                )
        for key, size in other.block_sizes.items():
            self.block_sizes.setdefault(key, size)

    @staticmethod
    def _ranked(vals: dict[KindWindow, _Said]) -> list[tuple[KindWindow, _Said]]:
        return sorted(vals.items(), key=lambda kv: (-kv[1].count, kv[1].first, str(kv[0])))

    def resolved(self) -> dict[LearnKey, KindWindow]:
        """Return the one (kind, window) per key (most said; tie: first in merge order).

        Returns:
            key → (kind, window).
        """
        return {key: self._ranked(vals)[0][0] for key, vals in self.said.items()}

    def conflicts(self) -> list[Conflict]:
        """Return every key whose stores said more than one (kind, window).

        Returns:
            The conflicts, ordered by key.
        """
        out = []
        for key in sorted(self.said, key=str):
            vals = self.said[key]
            if len(vals) < 2:
                continue
            ranked = self._ranked(vals)
            out.append(
                Conflict(key, ranked[0][0], tuple((kw, s.count, s.first_seq) for kw, s in ranked))
            )
        return out

    @property
    def learned(self) -> dict[StreamKey, dict[int, GroupInfo]]:
        """(channel, rank) → group_idx → resolved :class:`GroupInfo`."""
        out: dict[StreamKey, dict[int, GroupInfo]] = {}
        for (ch, rank, g), (k, w) in self.resolved().items():
            out.setdefault((ch, rank), {})[g] = GroupInfo(
                g, k, self.block_sizes.get((ch, rank, g)), w
            )
        return out

    @property
    def changes(self) -> list[KindChange]:
        """One :class:`KindChange` per value a conflicting key said besides the chosen one."""
        out = []
        for c in self.conflicts():
            for kw, _n, seq in c.said[1:]:
                out.append(KindChange(c.key[0], c.key[1], c.key[2], seq, c.chosen, kw))
        return out

    def table(self, channel: str, dp_rank: int | None) -> GroupTable:
        """Return what was learned for one (channel, rank) as a table.

        Args:
            channel: The channel name.
            dp_rank: The data-parallel rank.

        Returns:
            The table (possibly empty), source ``learned from annotated stores``.
        """
        groups = dict(self.learned.get((channel, dp_rank), {}))
        return GroupTable(groups, f"learned from annotated stores ({channel}, rank {dp_rank})")

    def describe(self) -> str:
        """Return one line summarising what was learned.

        Returns:
            E.g. ``2 streams, 6 groups``.
        """
        streams = {(ch, r) for ch, r, _ in self.said}
        return f"{plural(len(streams), 'stream')}, {plural(len(self.said), 'group')}"


LEARNED_SOURCE = "learned from annotated stores per (channel, rank, group)"


def _kw(kind: str | None, window: int | None) -> str:
    if kind is None:
        return "no kind"
    return f"{kind}" + (f" (window {window})" if window is not None else " (no window)")
