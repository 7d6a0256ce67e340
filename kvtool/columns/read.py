"""Recordings to table chunks: reading (:func:`iter_raw_chunks`), then decoding, in order.

Reading gives undecoded, picklable :class:`~kvtool.columns.base.RawChunk` s; decoding
(:func:`~kvtool.columns.decode.decode_chunk`) is a separate step, so it can run in
threads or on a Ray cluster (``report --jobs/--ray``) and come back in stream order
(:func:`iter_tables`). :func:`prefetch` reads the next chunk in a thread while the
current one is processed; memory holds about a chunk's payload and its table.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool import protocol
from kvtool.annotate import Annotation
from kvtool.columns.annotation import TableAnnotator, annotate_table, make_annotator
from kvtool.columns.base import (
    DEFAULT_CHUNK_BYTES,
    TABLE_SCHEMA,
    ChannelRef,
    DecodedChunk,
    DecodeMap,
    MergeKey,
    Progress,
    RawChunk,
    ReadStats,
    T,
)
from kvtool.columns.build import _finish
from kvtool.columns.decode import decode_chunk
from kvtool.inputs import MergeFindings, merge_messages
from kvtool.recording import ChannelInfo, RecordedMessage, open_recording

if TYPE_CHECKING:
    from kvtool.replay import BatchFilter


def _merged_messages(
    readers: list[Iterator[RecordedMessage]], findings: MergeFindings | None = None
) -> Iterator[tuple[int, RecordedMessage]]:
    """THE merge order (:func:`kvtool.inputs.merge_messages`): each batch once."""
    return merge_messages(readers, findings=findings)


def iter_raw_chunks(
    paths: Sequence[str | os.PathLike[str]],
    *,
    stats: ReadStats | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    streams: frozenset[tuple[str, str, int | None]] | None = None,
) -> Iterator[RawChunk]:
    """Read recordings into chunks of undecoded payloads, in stream order.

    Each recording is read chunk by chunk; several recordings are merged in THE merge
    order of :mod:`kvtool.inputs` (receive time, then channel, then seq), a batch found
    in several inputs counted once (``stats.merge`` says so). Channels are numbered per
    publisher stream (endpoint, topic, rank) in order of first appearance. After the last
    chunk, ``stats`` holds each recording's damage and lost batches.

    Args:
        paths: Recordings.
        stats: Receives recordings, channels, messages, payload bytes and damage.
        chunk_bytes: Payload bytes per chunk.
        select: Keep only these batches (``--channel``, ``--rank``, ``--since``,
            ``--until``, ``--seq``; :class:`kvtool.replay.BatchFilter`, the selection
            ``replay`` makes): times are receive times, relative ones counted from the
            first message of the (merged) input, as ``replay`` counts them.
        progress: Called with (bytes done, bytes total) of the input files as they are read.
        streams: Read only these publisher streams (endpoint, topic, rank): one unit of
            a report split by stream (:mod:`kvtool.report.partial`). The others are not
            counted at all; ``stats.unordered`` tells whether the whole input was in THE
            merge order's key order.

    Yields:
        Chunks of about ``chunk_bytes`` of payload.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    st = stats if stats is not None else ReadStats()
    opened = []
    n = size = 0  # messages and payload bytes read but not yet counted in ``st``
    try:
        for path in paths:
            reader = open_recording(path)
            opened.append(reader)
        for reader in opened:
            st.recordings.append(reader.path)
            st.groups[reader.path] = reader.groups
        batches: Iterator[tuple[int, list[RecordedMessage]]]
        if len(opened) == 1:
            # One input is its own merge order (merge_messages pairs its messages with
            # 0): read it a list at a time, each list from one chunk.
            batches = ((0, b) for b in opened[0].message_batches())
        else:
            merged = _merged_messages([r.messages() for r in opened], st.merge)
            batches = ((i, [m]) for i, m in merged)
        # One channel_id per publisher stream (endpoint, topic, rank), whichever inputs
        # hold it: a stream split over several files (a file and its slice, consecutive
        # recordings) continues as one stream, as the merge's same-batch rule assumes.
        chan_ids: dict[tuple[str, str, int | None], int] = {}
        where: dict[int, str] = {}
        stream_of: dict[int, tuple[str, str]] = {}
        ranks = select.ranks if select is not None else None
        raw = RawChunk(ranks=ranks)
        keep = _selector(select, st) if select is not None else None
        sizes = [reader_size(r) for r in opened]
        total = sum(sizes)
        at = [0] * len(opened)
        done = 0
        # Work per list of messages, not per message: the columns are extended in C, a
        # list on one channel (the usual case) takes its channel_id and rank at once, and
        # the counts go to ``st`` with each chunk. A list's messages share one offset.
        get_channel, get_data = attrgetter("channel"), attrgetter("data")
        get_time, get_seq = attrgetter("log_time"), attrgetter("seq")
        last_ch: ChannelInfo | None = None
        cid = 0
        rank: int | None = None

        def number(ch: ChannelInfo, i: int, m: RecordedMessage) -> int:
            """The channel_id of a channel's stream, numbered when first met (at ``m``)."""
            key = (ch.endpoint, ch.topic, ch.dp_rank)
            got = chan_ids.get(key)
            if got is None:
                got = chan_ids[key] = len(chan_ids)
                st.channels[got] = ChannelRef(got, opened[i].path, ch)
                st.first_keys[got] = (m.log_time, ch.endpoint, ch.topic, m.seq)
                where[got] = f"{ch.path}: {ch.name}"
                stream_of[got] = (ch.endpoint, ch.topic)
            return got

        last_order: MergeKey | None = None
        for i, batch in batches:
            if progress is not None and batch[0].offset > at[i]:
                off = batch[0].offset
                done += min(off, sizes[i]) - at[i]
                at[i] = min(off, sizes[i])
                progress(done, total)
            if keep is None and streams is None:
                datas = list(map(get_data, batch))
                fill = sum(map(len, datas))
                if size + fill < chunk_bytes:
                    # The whole list goes into this chunk: nothing is yielded before its
                    # last message, so its channels may be numbered first.
                    k = len(batch)
                    chans = list(map(get_channel, batch))
                    if chans.count(last_ch) == k:
                        cids, rks = [cid] * k, [rank] * k
                    else:
                        cids, rks = [], []
                        for ch, m in zip(chans, batch, strict=True):
                            if ch is not last_ch:
                                last_ch, cid, rank = ch, number(ch, i, m), ch.dp_rank
                            cids.append(cid)
                            rks.append(rank)
                    raw.log_time.extend(map(get_time, batch))
                    raw.seq.extend(map(get_seq, batch))
                    raw.channel_id.extend(cids)
                    raw.dp_rank.extend(rks)
                    raw.data.extend(datas)
                    n += k
                    size += fill
                    continue
            # Message by message, as one loop over the merged messages would: a
            # selection counts what it leaves out as it goes, and a chunk that fills
            # inside this list ends exactly after the message that reaches chunk_bytes.
            for m in batch:
                ch = m.channel
                if streams is not None:
                    # One unit of a report split by stream: check THE merge order's key
                    # over every message, keep this unit's streams.
                    key = (ch.endpoint, ch.topic, ch.dp_rank)
                    order = (m.log_time, key[0], key[1], m.seq)
                    if last_order is not None and order < last_order:
                        st.unordered = True
                    last_order = order
                    st.streams_seen.add(key)
                    if key not in streams:
                        continue
                if keep is not None and not keep(m):
                    continue
                if ch is not last_ch:
                    last_ch, cid, rank = ch, number(ch, i, m), ch.dp_rank
                data = m.data
                raw.log_time.append(m.log_time)
                raw.seq.append(m.seq)
                raw.channel_id.append(cid)
                raw.dp_rank.append(rank)
                raw.data.append(data)
                n += 1
                size += len(data)
                if size >= chunk_bytes:
                    raw.bytes = size
                    st.messages += n
                    st.payload_bytes += size
                    n = size = 0
                    raw.where = dict(where)
                    raw.streams = dict(stream_of)
                    yield raw
                    raw = RawChunk(ranks=ranks)
        raw.bytes = size
        st.messages += n
        st.payload_bytes += size
        n = size = 0
        if raw.data:
            raw.where = dict(where)
            raw.streams = dict(stream_of)
            yield raw
        if progress is not None:
            progress(total, total)
        # Typed, each naming its recording (issue 19): no reader recovers it from the text.
        from kvtool.recording.unconfirmed import ledger_lines
        from kvtool.report.source import Finding

        for reader in opened:
            rec = reader.recovery
            path = str(reader.path)
            if rec.damaged:
                st.damaged.append(Finding("damaged", rec.summary(), path))
            # Lost batches, then a tail the replay socket never confirmed (issue 23): the
            # library's one wording (kvtool.recording.unconfirmed).
            lines = ledger_lines(path, reader.gap_ledger, orphans=True)
            st.lost += [Finding("lost", line, path) for line in lines]
    finally:
        st.messages += n
        st.payload_bytes += size
        for reader in opened:
            reader.close()


def reader_size(reader: Any) -> int:
    """The size in bytes of an opened recording's file (0 when unknown)."""
    try:
        return os.path.getsize(reader.path)
    except OSError:
        return 0


def _selector(select: BatchFilter, st: ReadStats) -> Callable[[RecordedMessage], bool]:
    """Return a test of each message against ``select`` (all but ``ranks``), counting misses.

    Receive-time bounds relative to the start count from the first message read.
    """
    bounds: list[int | None] = []
    channel_ok: dict[tuple[str, int], bool] = {}

    def keep(m: RecordedMessage) -> bool:
        if not bounds:
            bounds.append(select.since.resolve(m.log_time) if select.since is not None else None)
            bounds.append(select.until.resolve(m.log_time) if select.until is not None else None)
        since, until = bounds
        first, last = select.seq_first, select.seq_last
        ok = not (
            (since is not None and m.log_time < since)
            or (until is not None and m.log_time > until)
            or (first is not None and m.seq < first)
            or (last is not None and m.seq > last)
        )
        if ok and select.channels is not None:
            ch = m.channel
            key = (ch.path, ch.id)
            got = channel_ok.get(key)
            if got is None:
                got = channel_ok[key] = select.channel_match(ch.name, ch.endpoint)
            ok = got
        if not ok:
            st.unselected += 1
        return ok

    return keep


def add_decoded(d: DecodedChunk, stats: ReadStats) -> pl.DataFrame:
    """Count a decoded chunk into ``stats`` and number its events after the earlier ones.

    Args:
        d: The chunk, decoded in stream order after every chunk already added.
        stats: The read's stats.

    Returns:
        Its table with stream-wide ``event_index``.
    """
    first_event = stats.events
    stats.events += d.events
    stats.rows += d.rows
    stats.bad_batches += d.bad_batches
    stats.skipped_events += d.skipped_events
    protocol.count_unknown_tags(stats.unknown_tags, d.unknown_tags.items())
    # Batches dropped by --rank were counted as read by iter_raw_chunks.
    stats.messages -= d.unselected
    stats.unselected += d.unselected
    for text, key in zip(d.problems, d.problem_keys, strict=True):
        stats.note(text, key)
    for k, n in d.payload_ranks.items():
        stats.payload_ranks[k] = stats.payload_ranks.get(k, 0) + n
    if "origin" in d.table.columns:
        stats.origin_rows += int((d.table["origin"].fill_null(0) > 0).sum())  # 0: none
    if first_event and d.table.height and "event_index" in d.table.columns:
        return d.table.with_columns(pl.col("event_index") + first_event)
    return d.table


def iter_tables(
    paths: Sequence[str | os.PathLike[str]],
    *,
    stats: ReadStats | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    labels: bool = True,
    decode_map: DecodeMap | None = None,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    streams: frozenset[tuple[str, str, int | None]] | None = None,
    annotation: Annotation | None = None,
    out_of_range: dict[int, int] | None = None,
    keep: tuple[str, ...] | None = None,
) -> Iterator[pl.DataFrame]:
    """Read recordings into flat table chunks (wire kinds; see :class:`TableAnnotator`).

    Reading (:func:`iter_raw_chunks`) and decoding (:func:`decode_chunk`) are separate
    steps so that decoding, the costly one, can run in other processes; the chunks come
    back in stream order, so the result does not depend on where they were decoded. A
    payload that is not a batch is skipped and counted in ``stats`` (with its seq), as
    is every undecodable event.

    Args:
        paths: Recordings.
        stats: Receives counts, channels, problems and damage; pass one to read them.
        chunk_bytes: Payload bytes per chunk (memory is bounded by about a chunk's table).
        labels: Add the ``recording``, ``channel`` and ``type`` string columns (the
            report works on ``channel_id`` and ``type_code`` and skips them).
        decode_map: Decodes the raw chunks in order (default: in this process).
        select: Keep only these batches (see :func:`iter_raw_chunks`).
        progress: Called with (bytes done, bytes total) of the input files.
        streams: Read only these publisher streams (see :func:`iter_raw_chunks`).
        annotation: Annotate the chunks with it (:func:`annotate_table`) where they are
            decoded, e.g. in ``decode_map``'s worker processes; None: not annotated.
        out_of_range: With ``annotation``: receives the stores per group index outside
            a given metadata table, as :func:`annotate_table` counts them.
        keep: The columns the caller reads; the decoder may return only these
            (:attr:`RawChunk.keep`), wherever it runs.

    Yields:
        Table chunks with the columns of :data:`TABLE_SCHEMA` (plus ``type_code``; with
        ``keep``, perhaps only those), in stream order; row order inside a chunk is
        stream order.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    st = stats if stats is not None else ReadStats()
    raws = iter_raw_chunks(
        paths,
        stats=st,
        chunk_bytes=chunk_bytes,
        select=select,
        progress=progress,
        streams=streams,
    )
    if annotation is not None:
        raws = _with_annotation(raws, annotation, st)
    if keep is not None:
        raws = _keeping(raws, keep)
    decoded = map(decode_chunk, raws) if decode_map is None else decode_map(raws)
    for d in decoded:
        if annotation is not None:
            if d.out_of_range is None:  # a decoder that does not annotate
                d.out_of_range = {}
                if d.table.height:
                    d.table = annotate_table(d.table, annotation, st.channels, d.out_of_range)
            if out_of_range is not None:
                for g, n in d.out_of_range.items():
                    out_of_range[g] = out_of_range.get(g, 0) + n
        table = add_decoded(d, st)
        if table.height:
            yield _finish(table, st, labels)


def _with_annotation(
    raws: Iterator[RawChunk], annotation: Annotation, stats: ReadStats
) -> Iterator[RawChunk]:
    """Give each raw chunk the annotation and its channels, to be annotated when decoded."""
    for raw in raws:
        raw.annotation = annotation
        raw.channels = {cid: stats.channels[cid] for cid in set(raw.channel_id)}
        yield raw


def _keeping(raws: Iterator[RawChunk], keep: tuple[str, ...]) -> Iterator[RawChunk]:
    for raw in raws:
        raw.keep = keep
        yield raw


_DONE = object()


def prefetch(items: Iterator[T], depth: int = 1) -> Generator[T]:
    """Run an iterator in a background thread, ``depth`` items ahead of its consumer.

    Decoding is Python (it holds the GIL) while the report's per-chunk work is mostly
    polars (which releases it), so reading the next chunk overlaps processing this one.
    Exceptions of the producer are raised in the consumer; closing the returned
    generator stops the producer.

    Args:
        items: The iterator (e.g. :func:`iter_tables`).
        depth: How many items may wait (each is a table chunk in memory).

    Yields:
        The items, in order.
    """
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
        except BaseException as err:  # handed to the consumer
            q.put(_Raised(err))
            return
        finally:
            close = getattr(items, "close", None)
            if stop.is_set() and close is not None:
                close()
        q.put(_DONE)

    worker = threading.Thread(target=run, name="kvtool-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                break
            if isinstance(item, _Raised):
                raise item.err
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while worker.is_alive():
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.1)
        worker.join()


@dataclass
class _Raised:
    err: BaseException


def read_table(
    paths: Sequence[str | os.PathLike[str]], *, stats: ReadStats | None = None
) -> pl.DataFrame:
    """Read recordings into one flat table (wire kinds, not annotated); for tests and small files.

    Args:
        paths: Recordings.
        stats: Receives counts and problems.

    Returns:
        The whole table.
    """
    chunks = list(iter_tables(paths, stats=stats))
    if not chunks:
        return empty_table()
    return pl.concat(chunks)


def empty_table() -> pl.DataFrame:
    """Return a table with no rows and the columns of :data:`TABLE_SCHEMA` (+ ``type_code``).

    Returns:
        The empty frame.
    """
    return pl.DataFrame(schema={**TABLE_SCHEMA, "type_code": pl.UInt8()})


def iter_annotated(
    paths: Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    stats: ReadStats | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    annotator: TableAnnotator | None = None,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
) -> Iterator[pl.DataFrame]:
    """Read and annotate: :func:`iter_tables` followed by a :class:`TableAnnotator`.

    Args:
        paths: Recordings.
        groups_file: ``--groups FILE``.
        group_flags: ``--group`` flags.
        stats: Receives counts and problems.
        chunk_bytes: Payload bytes per chunk.
        annotator: Use this annotator (default: :func:`make_annotator` of ``paths``).
        select: Keep only these batches (see :func:`iter_raw_chunks`).
        progress: Called with (bytes done, bytes total) of the input files.

    Yields:
        Annotated chunks.

    Raises:
        MetadataError: Invalid metadata.
        RecordingError: A recording cannot be opened.
    """
    st = stats if stats is not None else ReadStats()
    ann = annotator
    if ann is None:
        ann = make_annotator(paths, groups_file=groups_file, group_flags=group_flags)
    for df in iter_tables(
        paths, stats=st, chunk_bytes=chunk_bytes, select=select, progress=progress
    ):
        yield ann(df, st)
