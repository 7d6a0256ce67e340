"""The model behind ``kvtool top``: report snapshots in, rates, peaks and sparklines out.

``top`` computes nothing of its own about blocks. Every interval it takes a snapshot of the
report engine's tables (the same live-block state ``kvtool report`` uses, fed with the events
seen so far) and turns two successive snapshots into per-second rates. So live blocks, peaks,
recomputed and orphan counts shown for a stream are, at the same seq, exactly what ``kvtool
report`` prints for the same events.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console, RenderableType

    from kvtool.recording import ChannelInfo, RecordedMessage
    from kvtool.recording.ledger import GapLedger
    from kvtool.recording.reader import RecoveryReport
    from kvtool.report import ReportBuilder

# The views a key switches between, and the row key columns of each.
VIEWS = {
    "kind": ("kind",),
    "window": ("sliding_window",),
    "group": ("group_idx", "kind", "sliding_window"),
    "rank": ("dp_rank", "kind"),
}
VIEW_KEYS = {"k": "kind", "w": "window", "g": "group", "r": "rank"}
HISTORY_S = 60.0
SPARK = "▁▂▃▄▅▆▇█"

# -- the inbox: bounded, consumed in bounded chunks (issue 23) ----------------------------
INBOX_MAX = 1_024
INBOX_BYTES = 16 * 1024 * 1024
"""Batches (and payload bytes) waiting for the view. When full, the recorder thread waits
for room (it is busy, as when writing; its gap recovery covers what ZeroMQ drops meanwhile,
and a ``--record`` file loses nothing): the view drops refreshes, never batches."""
LIVE_RCVHWM = 1_000
"""SUB receive high-water mark of ``top``'s and ``serve``'s recorder (``record``: 5,000)."""
CHUNK_MAX = 256
CHUNK_BYTES = 4 * 1024 * 1024
"""Batches (and bytes) decoded in one go: a burst is fed in pieces, never whole."""
FEED_BUDGET_S = 0.25
"""A refresh feeds chunks for at most this long before the screen is drawn (health current)."""
DRAIN_AT = 256
"""Between refreshes, a backlog of this many batches is fed (in chunks) instead of waiting."""
KEEP_MIN = 1_024
KEEP_BYTES = 16 * 1024 * 1024
"""A live stream's messages are kept (to be fed again once a pending row's group is
learned) until no row is pending and this many batches were seen, or past these bytes."""
MAX_SPEED = 1e6
"""A ``--speed`` beyond this plays everything at once (as 0)."""
MAX_PLAYBACK_GAP_NS = 10_000_000_000
"""A recording's receive times jumping further ahead than this are played as this (a batch
30 years ahead no longer stalls the playback)."""

Row = Mapping[str, object]


@dataclass(frozen=True)
class Health:
    """The stream's health, as the source (recorder or recording) sees it.

    Attributes:
        source: What is watched (endpoints or a file), printable.
        publishers: Publishers (channels) known.
        connected: Publishers connected now (a recording: channels seen).
        batches: Batches received so far.
        gaps_recovered: Missing seqs recovered over replay.
        lost: Seqs lost for good.
        restarts: Publisher restarts seen.
        last_batch_age_s: Seconds since the last batch, or None before the first.
        done: The source has ended (end of recording, or the recorder stopped).
    """

    source: str = ""
    publishers: int = 0
    connected: int = 0
    batches: int = 0
    gaps_recovered: int = 0
    lost: int = 0
    restarts: int = 0
    last_batch_age_s: float | None = None
    done: bool = False


@dataclass(frozen=True)
class TopRow:
    """One line of the view.

    Attributes:
        label: The row's key, printable (``sliding_window``, ``window 64``, ``rank 1 mamba``).
        live: Live blocks now.
        peak: Peak live blocks so far.
        stores_per_s: Blocks stored per second over the last interval.
        evictions_per_s: Blocks removed per second over the last interval.
        recomputed_per_s: Blocks stored again after they were evicted or cleared
            (``blocks_recomputed``), per second over the last interval.
        orphans: Orphan removes so far.
        lifetime_p50_s: Median block lifetime (store -> remove) so far, or None.
        spark: Live blocks over the last minute, oldest first.
    """

    label: str
    live: int
    peak: int
    stores_per_s: float
    evictions_per_s: float
    recomputed_per_s: float
    orphans: int
    lifetime_p50_s: float | None
    spark: tuple[int, ...]


def row_label(view: str, row: Row) -> str:
    """Return the label of a report row in a view.

    Args:
        view: One of :data:`VIEWS`.
        row: A report row (``by_kind``, ``by_window``, ``by_group`` or per-rank row).

    Returns:
        A short label.
    """
    if view == "kind":
        return str(row.get("kind"))
    if view == "window":
        w = row.get("sliding_window")
        return "no window" if w is None else f"window {w}"
    if view == "group":
        # The group's whole key: one group seen with two windows is two rows (issue 24).
        g = row.get("group_idx")
        w = row.get("sliding_window")
        return f"{'-' if g is None else g} {row.get('kind')}" + ("" if w is None else f":{w}")
    r = row.get("dp_rank")
    return f"rank {'-' if r is None else r} {row.get('kind')}"


def row_key(view: str, row: Row) -> tuple[object, ...]:
    """Return the key of a report row in a view: every key column of :data:`VIEWS`.

    Rows are told apart by this key, never by their label, so two rows whose labels print
    alike (a kind spelled with an invisible character) stay two rows.

    Args:
        view: One of :data:`VIEWS`.
        row: A report row.

    Returns:
        The values of the view's key columns.
    """
    return tuple(row.get(c) for c in VIEWS[view])


_ESCAPE_FINAL = range(0x40, 0x7F)


def split_keys(data: str) -> list[str]:
    """Split what the terminal sent into key presses, dropping escape sequences.

    Function and arrow keys arrive as escape sequences (F1 is ``ESC O P``, F5 ``ESC [ 1 5 ~``):
    their letters are not key presses (issue 24: F1/F2 acted as ``p``/``q``).

    Args:
        data: The characters read.

    Returns:
        The plain keys, in order.
    """
    keys: list[str] = []
    i, n = 0, len(data)
    while i < n:
        ch = data[i]
        if ch != "\x1b":
            keys.append(ch)
            i += 1
            continue
        i += 1  # ESC
        if i < n and data[i] in "[O":
            intro = data[i]
            i += 1
            if intro == "O":
                i += 1  # SS3: one final character
                continue
            while i < n and ord(data[i]) not in _ESCAPE_FINAL:
                i += 1  # CSI parameters
            while i < n and not ("@" <= data[i] <= "~"):
                i += 1
            i += 1  # the final byte
        elif i < n:
            i += 1  # ESC + one character (Alt-key)
    return keys


def _int(row: Row | None, col: str) -> int:
    v = None if row is None else row.get(col)
    return int(v) if isinstance(v, int | float) else 0


def sparkline(values: Sequence[int], width: int = 12) -> str:
    """Draw ``values`` (the last ``width`` of them) as block characters scaled to their max.

    Args:
        values: Samples, oldest first.
        width: Characters at most.

    Returns:
        The sparkline; spaces pad it on the left to ``width``.
    """
    tail = list(values)[-width:]
    top = max(tail, default=0)
    if top <= 0:
        chars = [SPARK[0]] * len(tail)
    else:
        chars = [SPARK[min(len(SPARK) - 1, v * (len(SPARK) - 1) // top)] for v in tail]
    return "".join(chars).rjust(width)


@dataclass
class TopModel:
    """Successive report snapshots turned into what ``top`` shows.

    Args:
        history_s: How much live-block history the sparklines keep.
    """

    history_s: float = HISTORY_S
    t: float | None = None
    health: Health = field(default_factory=Health)
    _tables: dict[str, dict[tuple[object, ...], Row]] = field(default_factory=dict)
    _rates: dict[str, dict[tuple[object, ...], tuple[float, float, float]]] = field(
        default_factory=dict
    )
    _history: dict[str, dict[tuple[object, ...], deque[tuple[float, int]]]] = field(
        default_factory=dict
    )
    batches_per_s: float = 0.0

    def update(self, t: float, tables: Mapping[str, Sequence[Row]], health: Health) -> None:
        """Take one snapshot.

        Args:
            t: Seconds on the stream's clock (monotonic within one run).
            tables: Report rows per view name of :data:`VIEWS` (views left out keep nothing).
            health: The source's health now.
        """
        dt = None if self.t is None else t - self.t
        if dt is not None and dt > 0:
            self.batches_per_s = max(0, health.batches - self.health.batches) / dt
        for view, rows in tables.items():
            new = {row_key(view, r): r for r in rows}
            old = self._tables.get(view, {})
            rates: dict[tuple[object, ...], tuple[float, float, float]] = {}
            hist = self._history.setdefault(view, {})
            for label, r in new.items():
                if dt is not None and dt > 0:
                    prev = old.get(label)
                    rates[label] = tuple(  # type: ignore[assignment]
                        max(0, _int(r, c) - _int(prev, c)) / dt
                        for c in ("blocks_stored", "blocks_removed", "blocks_recomputed")
                    )
                h = hist.setdefault(label, deque())
                h.append((t, _int(r, "live_blocks_end")))
                while h and h[0][0] < t - self.history_s:
                    h.popleft()
            self._tables[view] = new
            self._rates[view] = rates
        self.t = t
        self.health = health

    def rows(self, view: str) -> list[TopRow]:
        """Return the view's rows, most live blocks first.

        Args:
            view: One of :data:`VIEWS`.

        Returns:
            The rows.
        """
        out = []
        rates = self._rates.get(view, {})
        hist = self._history.get(view, {})
        for key, r in self._tables.get(view, {}).items():
            s, e, rs = rates.get(key, (0.0, 0.0, 0.0))
            p50 = r.get("lifetime_p50_s")
            out.append(
                TopRow(
                    label=row_label(view, r),
                    live=_int(r, "live_blocks_end"),
                    peak=_int(r, "peak_live_blocks"),
                    stores_per_s=s,
                    evictions_per_s=e,
                    recomputed_per_s=rs,
                    orphans=_int(r, "orphan_removes"),
                    lifetime_p50_s=float(p50) if isinstance(p50, int | float) else None,
                    spark=tuple(v for _, v in hist.get(key, ())),
                )
            )
        out.sort(key=lambda x: (-x.live, -x.peak, x.label))
        return out


# -- the one adapter onto the report engine's internals ----------------------------------------


class ReportFeed:
    """Recorded messages in, report-table snapshots out: ``top``'s only use of the report engine.

    Every report internal ``top`` relies on (decoding batches into a table chunk, annotating
    it, feeding :class:`kvtool.report.ReportBuilder`, reading its tables) is in this class,
    so that it can be re-pointed when the engine moves. It does what
    :func:`kvtool.report.build_report` does, one list of messages at a time; calling
    :meth:`snapshot` between two :meth:`add` calls changes nothing (``tables()`` only merges
    pending distinct-hash parts and reads), so a snapshot after the last message equals the
    report of the same messages.

    The report has no per-rank table: a second builder per ``dp_rank`` is fed the rows of
    that rank (each rank is its own channel, so its state is the same as in the main one).

    Args:
        recording_groups: Group metadata per recording path (a recording's own, as
            ``report`` uses it); None for a live stream (learned from annotated stores).
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        whole_stream: Also keep the whole stream's builder (the kind, window and group
            views of :meth:`snapshot`); ``serve`` reads the per-rank builders only.
        max_keys: Bound the per-rank builders' memory (``serve --remember-keys``):
            :class:`kvtool.report.ReportBuilder` ``max_keys``; None: exact.
    """

    def __init__(
        self,
        recording_groups: dict[str, list[dict[str, object]] | None] | None = None,
        *,
        groups_file: str | None = None,
        group_flags: Sequence[str] | None = None,
        whole_stream: bool = True,
        max_keys: int | None = None,
    ) -> None:
        from kvtool.annotate import GroupLearner
        from kvtool.columns import ReadStats, TableAnnotator, make_annotator
        from kvtool.inputs import resolve_annotation
        from kvtool.report import ReportBuilder

        self.stats = ReadStats()
        # A recording: THE annotation of the whole input, as report resolves it. A live
        # stream has no whole input: the same learner learns from each chunk before the
        # chunk is annotated, so a group's kind is known from its first annotated store on.
        self._live: GroupLearner | None = None
        if recording_groups is None:
            self._annotator = TableAnnotator(
                resolve_annotation(
                    [], groups_file=groups_file, group_flags=group_flags, learn_from_input=False
                )
            )
            if self._annotator.annotation.given is None:
                self._live = GroupLearner()
        else:
            self._annotator = make_annotator(
                recording_groups, groups_file=groups_file, group_flags=group_flags
            )
        self._builder = ReportBuilder(None, self._annotator.group_kind)
        self._whole = whole_stream
        self._max_keys = max_keys
        self._ranks: dict[int | None, ReportBuilder] = {}
        # While every row has one rank, the whole stream's builder is that rank's too (no
        # second copy of the state: issue 23's memory); a second rank clones it first.
        self._solo: list[int | None] = []
        self._chan_ids: dict[tuple[str, int], int] = {}
        # A live stream's messages, kept while a row may still change its kind (issue 24):
        # see _keep_while_pending.
        self._kept: list[RecordedMessage] | None = [] if self._live is not None else None
        self._kept_bytes = 0
        self._pending: set[tuple[str, int | None, int]] = set()
        self.generation = 0
        """How many times the builders were fed again from the start (:meth:`_refeed`)."""

    def pending_groups(self) -> frozenset[int]:
        """Return the groups whose rows without a kind may still be given one (issue 24).

        While messages are kept (a live stream, no metadata), a row of such a group is
        re-attributed to the group's kind once it is learned, and its ``unannotated`` row
        shrinks or goes. ``serve`` holds those rows back (a Prometheus counter never goes
        down) until this set no longer names them.

        Returns:
            Group indexes (of any channel and rank); empty once the messages are let go.
        """
        if self._kept is None:
            return frozenset()
        return frozenset(g for _c, _r, g in self._pending)

    def finish(self) -> None:
        """Say the stream has ended: every row is final (the kept messages are let go).

        ``report`` of the recorded stream gives a group never learned no kind either, so
        the rows :meth:`pending_groups` held back are then the report's.
        """
        self._kept = None
        self._kept_bytes = 0

    def add(self, messages: Sequence[RecordedMessage]) -> None:
        """Feed messages, in stream order.

        On a live stream (group kinds learned from annotated stores) a remove that comes
        before its group's first annotated store has no kind yet. ``report`` on the
        recorded file learns from the whole file first and gives it its group's kind; so
        that ``top`` shows the same numbers, the messages are kept while such rows are
        pending, and when their group is learned the engine is fed them again from the
        start, learned from all of them first (:meth:`_refeed`: report's order of work).

        Args:
            messages: Recorded (or just received) messages.
        """
        if not messages:
            return
        if self._kept is not None:
            self._kept.extend(messages)
            self._kept_bytes += sum(len(m.data) for m in messages)
        raw = self._decode(messages)
        if raw is None:
            return
        if self._live is not None:
            from kvtool.columns import learn_table

            self._live.merge(learn_table(raw, self.stats.channels))
            self._set_learned()
            if self._kept is not None and self._pending & self._live.resolved().keys():
                self._refeed()
                return
        self._feed(raw)

    def _decode(self, messages: Sequence[RecordedMessage]) -> pl.DataFrame | None:
        """Decode messages into one unannotated table chunk (report's one decode path)."""
        from kvtool.columns import ChannelRef, RawChunk, _finish, add_decoded, decode_chunk

        st = self.stats
        chunk = RawChunk()
        for m in messages:
            key = (m.channel.path, m.channel.id)
            cid = self._chan_ids.get(key)
            if cid is None:
                cid = self._chan_ids[key] = len(self._chan_ids)
                st.channels[cid] = ChannelRef(cid, m.channel.path, m.channel)
            chunk.where.setdefault(cid, m.channel.name)
            st.messages += 1
            chunk.log_time.append(m.log_time)
            chunk.seq.append(m.seq)
            chunk.channel_id.append(cid)
            chunk.dp_rank.append(m.channel.dp_rank)
            chunk.data.append(m.data)
            chunk.bytes += len(m.data)
            st.payload_bytes += len(m.data)
        table = add_decoded(decode_chunk(chunk), st)
        if not table.height:
            return None
        return _finish(table, st, False)

    def _set_learned(self) -> None:
        from kvtool.annotate import Annotation

        assert self._live is not None
        self._annotator.annotation = Annotation(
            None, {}, self._live.resolved(), tuple(self._live.conflicts())
        )

    def _feed(self, raw: pl.DataFrame, *, refeeding: bool = False) -> None:
        """Annotate a decoded chunk and feed it to the builders."""
        from kvtool.report import ReportBuilder

        df = self._annotator(raw, self.stats)
        solo = self._whole and self._solo_rank(df)
        if self._whole:
            self._builder.add(df)
        if not solo:
            for (rank,), part in df.partition_by("dp_rank", as_dict=True).items():
                rb = self._ranks.get(rank)
                if rb is None:
                    # Rows per medium too: serve's ``medium`` label (by_kind is unchanged).
                    rb = self._ranks[rank] = ReportBuilder(
                        None, self._annotator.group_kind, by_medium=True, max_keys=self._max_keys
                    )
                rb.add(part)
        if self._kept is not None:
            self._keep_while_pending(df, release=not refeeding)

    def _solo_rank(self, df: pl.DataFrame) -> bool:
        """Whether the stream so far, this chunk included, has one rank (see ``_solo``).

        At the first chunk with a second rank, the whole stream's builder (every row so
        far was of the one rank) is cloned as that rank's builder, before the chunk.
        """
        import copy

        if self._ranks:
            return False
        ranks = df["dp_rank"].unique().to_list()
        if len(ranks) == 1 and (not self._solo or self._solo[0] == ranks[0]):
            self._solo[:] = ranks
            return True
        if self._solo:
            # The group lookup is the feed's annotator, shared, never copied.
            memo = {id(self._annotator): self._annotator}
            self._ranks[self._solo[0]] = copy.deepcopy(self._builder, memo)
            self._solo.clear()
        return False

    def _keep_while_pending(self, df: pl.DataFrame, *, release: bool = True) -> None:
        """Note the (channel, rank, group) keys of rows without a kind; stop keeping when done.

        The messages are let go once no such row is pending and at least
        :data:`KEEP_MIN` batches were seen (a group first seen later, in a remove, is then
        shown as ``unannotated`` until the end; ``report`` of the file still attributes
        it), or once they pass :data:`KEEP_BYTES` (bounded memory before exactness).
        """
        import polars as pl

        from kvtool.columns import CLEARED, _rank_expr

        st = self.stats
        rows = (
            df.filter(
                pl.col("kind").is_null()
                & pl.col("group_idx").is_not_null()
                & (pl.col("type_code") != CLEARED)
            )
            .select("channel_id", "group_idx", rank=_rank_expr(st.channels))
            .unique()
        )
        for cid, g, rank in rows.iter_rows():
            self._pending.add((st.channels[cid].info.name, None if rank < 0 else rank, g))
        if release:
            self._release_when_done()

    def _release_when_done(self) -> None:
        kept = self._kept
        if kept is None:
            return
        if (not self._pending and len(kept) >= KEEP_MIN) or self._kept_bytes > KEEP_BYTES:
            self._kept = None
            self._kept_bytes = 0

    def _refeed(self) -> None:
        """Feed every kept message again from the start: learn from all, then annotate all."""
        from kvtool.annotate import GroupLearner
        from kvtool.columns import ReadStats, learn_table
        from kvtool.report import ReportBuilder

        kept = self._kept
        assert kept is not None
        self._pending = set()
        self.generation += 1

        def restart() -> None:
            self.stats = ReadStats()
            self._chan_ids = {}

        restart()
        learner = GroupLearner()
        for i in range(0, len(kept), CHUNK_MAX):
            raw = self._decode(kept[i : i + CHUNK_MAX])
            if raw is not None:
                learner.merge(learn_table(raw, self.stats.channels))
        self._live = learner
        self._set_learned()
        restart()
        self._builder = ReportBuilder(None, self._annotator.group_kind)
        self._ranks = {}
        self._solo = []
        for i in range(0, len(kept), CHUNK_MAX):
            raw = self._decode(kept[i : i + CHUNK_MAX])
            if raw is not None:
                self._feed(raw, refeeding=True)
        self._release_when_done()

    def builders(self) -> dict[int | None, ReportBuilder]:
        """Return the report builder of each ``dp_rank`` (``serve`` reads its rows from them).

        Returns:
            dp_rank -> its builder, fed the rows of that rank only.
        """
        if self._solo:
            return {self._solo[0]: self._builder}
        return dict(self._ranks)

    def snapshot(self) -> dict[str, list[dict[str, object]]]:
        """Return the report rows so far per view of :data:`VIEWS`.

        Returns:
            ``kind``, ``window``, ``group`` (the report's by_kind, by_window, by_group rows)
            and ``rank`` (by_kind rows per dp_rank, with a ``dp_rank`` column).
        """
        tabs = self._builder.tables()
        rank_rows: list[dict[str, object]] = []
        ranks = self.builders()
        for rank in sorted(ranks, key=lambda r: (r is None, r or 0)):
            rows = tabs["by_kind"] if self._solo else ranks[rank].tables()["by_kind"]
            for row in rows.to_dicts():
                rank_rows.append({"dp_rank": rank, **row})
        return {
            "kind": tabs["by_kind"].to_dicts(),
            "window": tabs["by_window"].to_dicts(),
            "group": tabs["by_group"].to_dicts(),
            "rank": rank_rows,
        }


# -- sources: a recording played back, or a live stream ------------------------------------


class RecordingSource:
    """Plays a recording by receive time (``log_time``), ``speed`` times faster.

    Args:
        path: The recording.
        speed: Time-lapse factor; 0 plays everything at once.

    Raises:
        RecordingError: The recording cannot be opened.
    """

    def __init__(self, path: str, *, speed: float = 1.0) -> None:
        from kvtool.recording import open_recording

        self._reader = open_recording(path)
        self.path = self._reader.path
        # Past MAX_SPEED (inf, 1e308) everything is due at once: as speed 0 (issue 23:
        # the pacing arithmetic raised OverflowError).
        self.speed = 0.0 if not speed <= MAX_SPEED else speed
        self.groups = {self._reader.path: self._reader.groups}
        self._it = self._reader.messages()
        self._next: RecordedMessage | None = next(self._it, None)
        self._t0 = self._next.log_time if self._next is not None else 0
        self._last = self._t0
        self._channels: set[tuple[str, int]] = set()
        self._batches = 0
        self._start: float | None = None
        self._paused_at: float | None = None
        self._stream_t = 0.0
        self._behind = False
        self.done = self._next is None
        self.error: BaseException | None = None

    def start(self, now: float) -> None:
        """Start the clock.

        Args:
            now: Monotonic seconds.
        """
        self._start = now

    def take(self, now: float) -> list[RecordedMessage]:
        """Return the next chunk of the messages due by ``now`` (any at speed 0).

        At most :data:`CHUNK_MAX` messages or :data:`CHUNK_BYTES` (see :attr:`backlog`).

        Args:
            now: Monotonic seconds.

        Returns:
            The messages, in file order.
        """
        if self._paused_at is not None:
            now = self._paused_at  # paused: the recording's clock stands still
        start = self._start if self._start is not None else now
        limit = None if self.speed <= 0 else self._t0 + int((now - start) * self.speed * 1e9)
        out: list[RecordedMessage] = []
        nbytes = 0
        self._behind = False
        while self._next is not None:
            if limit is not None and self._next.log_time > limit:
                if self._next.log_time - max(self._last, limit) <= MAX_PLAYBACK_GAP_NS:
                    break
                # Far ahead of the stream (a clock jump, a bogus time): played as a gap
                # of MAX_PLAYBACK_GAP_NS, so the playback never stalls on it.
                shift = self._next.log_time - max(self._last, limit) - MAX_PLAYBACK_GAP_NS
                self._t0 += shift
                self._last += shift
                break
            if len(out) >= CHUNK_MAX or nbytes >= CHUNK_BYTES:
                self._behind = True
                break
            m = self._next
            nbytes += len(m.data)
            out.append(m)
            self._channels.add((m.channel.path, m.channel.id))
            self._last = max(self._last, m.log_time)
            self._next = next(self._it, None)
        self._batches += len(out)
        if self._next is None:
            self.done = True
            self._stream_t = (self._last - self._t0) / 1e9
            self._reader.close()
        elif limit is not None:
            self._stream_t = (limit - self._t0) / 1e9
        return out

    def pause(self, now: float, paused: bool) -> None:
        """Hold or resume playback: time spent paused does not advance the recording.

        Args:
            now: Monotonic seconds.
            paused: True to hold, False to resume.
        """
        if paused and self._paused_at is None:
            self._paused_at = now
        elif not paused and self._paused_at is not None:
            if self._start is not None:
                self._start += now - self._paused_at
            self._paused_at = None

    @property
    def backlog(self) -> int:
        """:data:`CHUNK_MAX` while messages already due are left for the next call, else 0."""
        return CHUNK_MAX if self._behind else 0

    def clock(self) -> float:
        """Return seconds on the recording's receive clock since its first batch."""
        return self._stream_t

    def wake(self, now: float) -> float | None:
        """Return the monotonic time the last message is due (None: never, or done)."""
        if self.done or self._start is None:
            return None
        if self.speed <= 0 or self._behind:
            return now
        return None

    @property
    def recovery(self) -> RecoveryReport:
        """What reading the recording recovered and what it could not (so far)."""
        return self._reader.recovery

    @property
    def gap_ledger(self) -> GapLedger | None:
        """The recording's gap ledger (None: it has none)."""
        return self._reader.gap_ledger

    def health(self) -> Health:
        """Return the recording's health: channels seen, batches played, its gap ledger."""
        ledger = self._reader.gap_ledger
        return Health(
            source=self.path,
            publishers=len(self._reader.channels) or len(self._channels),
            connected=len(self._channels),
            batches=self._batches,
            gaps_recovered=ledger.recovered if ledger else 0,
            lost=ledger.lost if ledger else 0,
            restarts=ledger.restarts if ledger else 0,
            last_batch_age_s=None
            if not self._batches
            else max(0.0, self._stream_t - (self._last - self._t0) / 1e9),
            done=self.done,
        )

    def stop(self) -> None:
        """Close the recording."""
        self._reader.close()


class LiveSource:
    """A :class:`kvtool.capture.Recorder` in a background thread, its batches handed over.

    Gap recovery, restarts and the optional ``--record`` file are the recorder's, exactly
    as ``kvtool record`` does them.

    Args:
        sources: What to subscribe to (:func:`kvtool.endpoints.expand_endpoints`).
        record: Also write the stream to this recording (None: no file).
        recorder_options: More :class:`~kvtool.capture.Recorder` keyword arguments.
    """

    def __init__(
        self,
        sources: Sequence[object],
        *,
        record: str | None = None,
        **recorder_options: object,
    ) -> None:
        from kvtool.capture import Recorder

        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._inbox: deque[RecordedMessage] = deque()
        self._inbox_bytes = 0
        self._closing = False
        self._channels: dict[tuple[str, str], ChannelInfo] = {}
        self._last_mono: float | None = None
        self.error: BaseException | None = None
        self.result: object = None
        self.path = " ".join(getattr(s, "endpoint", str(s)) for s in sources)
        self._n_sources = len(sources)
        # The inbox is the queue: a deep SUB queue behind it would only hold more bytes
        # here (the publisher's SNDHWM holds the rest; what it drops is a gap, recovered).
        recorder_options.setdefault("rcvhwm", LIVE_RCVHWM)
        # The view decodes every batch itself: no status decode (and its queue) here.
        recorder_options.setdefault("status_decode", False)
        self.recorder = Recorder(
            record,
            sources,  # type: ignore[arg-type]
            sink=self._sink,
            **recorder_options,  # type: ignore[arg-type]
        )
        self._thread = threading.Thread(target=self._run, name="kvtool-top-recorder", daemon=True)
        self._start: float | None = None
        self._now = 0.0

    def _sink(self, channel: tuple[str, str, int | None], seq: int, payload: bytes, t: int) -> None:
        from kvtool.recording import ChannelInfo as _CI
        from kvtool.recording import RecordedMessage as _RM

        endpoint, topic, rank = channel
        info = self._channels.get((endpoint, topic))
        if info is None:
            name = endpoint if not topic else f"{endpoint}#{topic}"
            info = self._channels[(endpoint, topic)] = _CI(
                id=len(self._channels), name=name, endpoint=endpoint, topic=topic, dp_rank=rank
            )
        msg = _RM(channel=info, seq=seq, log_time=t, publish_time=t, data=payload, offset=0)
        with self._room:
            self._last_mono = time.monotonic()  # the health line: received, if not yet shown
            # Full: wait for the view to take some (bounded memory; nothing dropped).
            while (
                (len(self._inbox) >= INBOX_MAX or self._inbox_bytes + len(payload) > INBOX_BYTES)
                and self._inbox
                and not self._closing
            ):
                self._room.wait(0.1)
            self._inbox.append(msg)
            self._inbox_bytes += len(payload)

    def _run(self) -> None:
        try:
            self.result = self.recorder.run(handle_signals=False)
        except BaseException as err:  # handed to the main thread by :meth:`stop`
            self.error = err

    @property
    def done(self) -> bool:
        """The recorder has ended (an error, or stopped)."""
        return self._start is not None and not self._thread.is_alive()

    def start(self, now: float) -> None:
        """Start the recorder thread.

        Args:
            now: Monotonic seconds.
        """
        self._start = now
        self._thread.start()

    def take(self, now: float) -> list[RecordedMessage]:
        """Return the next chunk of the batches written, in the order written.

        At most :data:`CHUNK_MAX` batches or :data:`CHUNK_BYTES`; the rest stays for the
        next call (see :attr:`backlog`).

        Args:
            now: Monotonic seconds.

        Returns:
            The messages.
        """
        self._now = now
        out: list[RecordedMessage] = []
        nbytes = 0
        with self._room:
            inbox = self._inbox
            while inbox and len(out) < CHUNK_MAX and nbytes < CHUNK_BYTES:
                m = inbox.popleft()
                nbytes += len(m.data)
                out.append(m)
            self._inbox_bytes -= nbytes
            self._room.notify_all()
        return out

    def pause(self, now: float, paused: bool) -> None:
        """A live stream cannot be held: batches keep being received (and recorded).

        Args:
            now: Monotonic seconds.
            paused: Whether the view is paused (only the view freezes).
        """

    @property
    def backlog(self) -> int:
        """Batches received and not taken yet."""
        return len(self._inbox)

    def clock(self) -> float:
        """Return seconds since the start."""
        return 0.0 if self._start is None else self._now - self._start

    def wake(self, now: float) -> float | None:
        """A live stream has no end of its own."""
        return None

    def health(self) -> Health:
        """Return the recorder's counters as a :class:`Health`."""
        st = self.recorder.stats
        last = self._last_mono
        return Health(
            source=self.path,
            publishers=self._n_sources,
            connected=len(st.connected),
            batches=st.batches,
            gaps_recovered=st.recovered,
            lost=st.lost,
            restarts=st.restarts,
            last_batch_age_s=None if last is None else max(0.0, time.monotonic() - last),
            done=self.done,
        )

    def stop(self) -> None:
        """Stop the recorder (closing a ``--record`` file) and wait for its thread.

        Raises:
            BaseException: What the recorder raised (e.g. an endpoint error).
        """
        with self._room:
            self._closing = True  # a recorder waiting for room goes on
            self._room.notify_all()
        if self._thread.is_alive():
            self.recorder.stop("stopped")
            self._thread.join(60)
            if self._thread.is_alive():  # a second stop gives up waiting on replays
                self.recorder.stop("stopped")
                self._thread.join()
        if self.error is not None:
            err, self.error = self.error, None
            raise err


class Source(Protocol):
    """What :func:`run_top` reads: :class:`RecordingSource` or :class:`LiveSource`."""

    path: str
    error: BaseException | None

    @property
    def done(self) -> bool: ...  # noqa: D102

    def start(self, now: float) -> None: ...  # noqa: D102

    def take(self, now: float) -> list[RecordedMessage]: ...  # noqa: D102

    def pause(self, now: float, paused: bool) -> None: ...  # noqa: D102

    @property
    def backlog(self) -> int: ...  # noqa: D102

    def clock(self) -> float: ...  # noqa: D102

    def wake(self, now: float) -> float | None: ...  # noqa: D102

    def health(self) -> Health: ...  # noqa: D102

    def stop(self) -> None: ...  # noqa: D102


# -- the loops -----------------------------------------------------------------------------


@dataclass
class TopView:
    """The state of the screen: the model, the view shown, paused or not.

    Args:
        source: Where batches come from.
        feed: The report adapter.
    """

    source: Source
    feed: ReportFeed
    model: TopModel = field(default_factory=TopModel)
    view: str = "kind"
    paused: bool = False

    def tick(self, now: float) -> None:
        """Feed what arrived and, unless paused, take a snapshot into the model.

        Args:
            now: Monotonic seconds.
        """
        # Chunks until nothing is waiting or the budget is spent: under a flood the screen
        # is drawn less often (health current), never with batches left out.
        until = time.monotonic() + FEED_BUDGET_S
        while True:
            self.feed.add(self.source.take(now))
            if not self.source.backlog or time.monotonic() >= until:
                break
        if not self.paused or self.source.done:
            self.model.update(self.source.clock(), self.feed.snapshot(), self.source.health())

    def drain(self, seconds: float) -> None:
        """Between refreshes: feed a backlog of at least :data:`DRAIN_AT` batches, in chunks.

        Args:
            seconds: At most this long.
        """
        until = time.monotonic() + seconds
        while self.source.backlog >= DRAIN_AT and time.monotonic() < until:
            self.feed.add(self.source.take(time.monotonic()))

    def key(self, ch: str, now: float | None = None) -> bool:
        """Apply a key; return False for quit.

        ``p`` pauses the view and, on a recording, its playback too (issue 24).

        Args:
            ch: One character.
            now: Monotonic seconds (default: now).

        Returns:
            False when the key quits.
        """
        if ch in ("q", "Q"):
            return False
        if ch in VIEW_KEYS:
            self.view = VIEW_KEYS[ch]
        elif ch in ("p", "P"):
            self.paused = not self.paused
            self.source.pause(time.monotonic() if now is None else now, self.paused)
        return True


def run_plain(
    top: TopView,
    out: TextIO,
    *,
    interval_s: float = 1.0,
    duration_s: float | None = None,
    render: Callable[[TopModel, str], str],
) -> None:
    """Print one plain block every ``interval_s`` until the end of input or ``duration_s``.

    Args:
        top: The view (its source not started).
        out: Where blocks go.
        interval_s: Seconds between blocks.
        duration_s: Stop after this long (None: at the end of input only).
        render: Turns the model into a block (:func:`kvtool.render.top.plain_block`).
    """
    start = time.monotonic()
    top.model.update(0.0, top.feed.snapshot(), top.source.health())
    top.source.start(start)
    end = None if duration_s is None else start + duration_s
    next_tick = start + interval_s
    first = True
    try:
        while True:
            now = time.monotonic()
            wake = top.source.wake(now)
            due = min(x for x in (next_tick, end, wake) if x is not None)
            if due > now:
                if top.source.backlog >= DRAIN_AT:
                    top.drain(min(due - now, 0.2))
                else:
                    time.sleep(min(due - now, 0.2))
                if not top.source.done:
                    continue
            now = time.monotonic()
            top.tick(now)
            final = top.source.done or (end is not None and now >= end)
            if now >= next_tick or final:
                if not first:
                    out.write("\n")
                out.write(render(top.model, top.view))
                out.flush()
                first = False
                next_tick += interval_s * max(1, int((now - next_tick) // interval_s) + 1)
            if final:
                return
    finally:
        top.source.stop()


@contextlib.contextmanager
def cbreak(fd: int | None) -> Iterator[bool]:
    """Put a terminal in cbreak mode (keys one by one, Ctrl-C still interrupts); restore it.

    Args:
        fd: The terminal's file descriptor (None, or not a terminal: nothing to do).

    Yields:
        True when keys can be read.
    """
    if fd is None or not os.isatty(fd):
        yield False
        return
    import termios
    import tty

    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def run_screen(
    top: TopView,
    console: Console,
    *,
    key_fd: int | None,
    interval_s: float = 1.0,
    duration_s: float | None = None,
    render: Callable[[TopModel, str, bool, int, int], RenderableType],
) -> None:
    """Run the full-screen view until ``q``, ``duration_s`` or Ctrl-C (KeyboardInterrupt).

    At the end of a recording the final screen stays until ``q``; a resize redraws it.

    Args:
        top: The view (its source not started).
        console: The terminal.
        key_fd: The terminal to read keys from (None: no keys).
        interval_s: Seconds between refreshes.
        duration_s: Stop after this long.
        render: Turns the model, view, paused flag, width and height into the screen
            (:func:`kvtool.render.top.screen`).
    """
    import select

    from rich.live import Live

    def terminal_size() -> tuple[int, int]:
        # The terminal's real size: COLUMNS/LINES left exported by a shell or a parent
        # process must not pin a full screen (rich reads them first), and a resize must show.
        try:
            size = os.get_terminal_size(console.file.fileno())
        except (AttributeError, ValueError, OSError):
            return console.size.width, console.size.height
        return size.columns, size.lines

    def draw() -> RenderableType:
        width, height = shown
        return render(top.model, top.view, top.paused, width, height)

    start = time.monotonic()
    top.model.update(0.0, top.feed.snapshot(), top.source.health())
    top.source.start(start)
    end = None if duration_s is None else start + duration_s
    next_tick = start
    ended = False
    shown = console.size = terminal_size()
    try:
        with (
            cbreak(key_fd) as keys,
            Live(
                draw(),
                console=console,
                screen=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live,
        ):
            while True:
                now = time.monotonic()
                if end is not None and now >= end:
                    return
                if not ended and now >= next_tick:
                    top.tick(now)
                    ended = top.source.done
                    if ended and top.source.error is not None:
                        return  # the recorder failed: stop() raises its error

                    live.update(draw(), refresh=True)
                    next_tick += interval_s * max(1, int((now - next_tick) // interval_s) + 1)
                elif terminal_size() != shown:  # resized: redraw now, the final screen too
                    shown = console.size = terminal_size()
                    live.update(draw(), refresh=True)
                wait = max(0.0, min(x for x in (next_tick, end) if x is not None) - now)
                if ended:
                    wait = 0.5 if end is None else min(0.5, wait)
                elif top.source.backlog >= DRAIN_AT:
                    top.drain(min(wait, 0.2))  # a burst: feed it now, keys meanwhile
                    wait = 0.0
                if keys and key_fd is not None:
                    ready, _, _ = select.select([key_fd], [], [], min(wait, 0.5))
                    if ready:
                        try:
                            data = os.read(key_fd, 64).decode("utf-8", "replace")
                        except OSError:  # EIO: the terminal went away (a closed SSH session)
                            return
                        if not data:  # the terminal went away
                            return
                        for ch in split_keys(data):
                            if not top.key(ch, time.monotonic()):
                                return
                        live.update(draw(), refresh=True)
                else:
                    time.sleep(min(wait, 0.5))
    finally:
        top.source.stop()


__all__ = [
    "HISTORY_S",
    "VIEWS",
    "VIEW_KEYS",
    "Health",
    "LiveSource",
    "RecordingSource",
    "ReportFeed",
    "Source",
    "TopModel",
    "TopRow",
    "TopView",
    "cbreak",
    "row_key",
    "row_label",
    "run_plain",
    "run_screen",
    "sparkline",
    "split_keys",
]
