"""The report engine fed incrementally: recorded messages in, report-table snapshots out.

:class:`ReportFeed` is report/'s incremental API. It does what
:func:`kvtool.report.build_report` does, one list of messages at a time, through the same
decoder, annotator and :class:`~kvtool.report.builder.ReportBuilder`; ``top`` and ``serve``
read the engine only through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from kvtool.recording import RecordedMessage
    from kvtool.report.builder import ReportBuilder

CHUNK_MAX = 256
CHUNK_BYTES = 4 * 1024 * 1024
"""Batches (and bytes) decoded in one go: a burst is fed in pieces, never whole."""
KEEP_MIN = 1_024
KEEP_BYTES = 16 * 1024 * 1024
"""A live stream's messages are kept (to be fed again once a pending row's group is
learned) until no row is pending and this many batches were seen, or past these bytes."""


class ReportFeed:
    """Recorded messages in, report-table snapshots out: the report engine, incrementally.

    Every report internal an incremental consumer (``top``, ``serve``) relies on (decoding
    batches into a table chunk, annotating it, feeding :class:`kvtool.report.ReportBuilder`,
    reading its tables) is in this class. It does what
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
        report_mode: ``--report-mode`` (``auto``, ``full``, ``incremental``), as report's.
    """

    def __init__(
        self,
        recording_groups: dict[str, list[dict[str, object]] | None] | None = None,
        *,
        groups_file: str | None = None,
        group_flags: Sequence[str] | None = None,
        whole_stream: bool = True,
        max_keys: int | None = None,
        report_mode: str = "auto",
    ) -> None:
        from kvtool.annotate import GroupLearner
        from kvtool.columns import ReadStats, TableAnnotator, make_annotator
        from kvtool.inputs import resolve_annotation
        from kvtool.report.builder import ReportBuilder

        self.stats = ReadStats()
        # A recording: THE annotation of the whole input, as report resolves it. A live
        # stream has no whole input: the same learner learns from each chunk before the
        # chunk is annotated, so a group's kind is known from its first annotated store on.
        self._live: GroupLearner | None = None
        if recording_groups is None:
            self._annotator = TableAnnotator(
                resolve_annotation(
                    [], groups_file=groups_file, group_flags=group_flags, learn_from_input=False
                ),
                report_mode=report_mode,
            )
            given = self._annotator.annotation.given
            # Flags naming only none=KIND (issue 21) leave the groups to be learned too.
            if given is None or (given.partial and not given.groups):
                self._live = GroupLearner()
        else:
            self._annotator = make_annotator(
                recording_groups,
                groups_file=groups_file,
                group_flags=group_flags,
                report_mode=report_mode,
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
        given = self._annotator.annotation.given  # None, or only none=KIND flags
        self._annotator.annotation = Annotation(
            given, {}, self._live.resolved(), tuple(self._live.conflicts())
        )

    def _feed(self, raw: pl.DataFrame, *, refeeding: bool = False) -> None:
        """Annotate a decoded chunk and feed it to the builders."""
        from kvtool.report.builder import ReportBuilder

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
        from kvtool.report.builder import ReportBuilder

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
        """Return the report rows so far per view of :data:`kvtool.top.VIEWS`.

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
