"""Summarise a recording: channels, batches, events, blocks, gaps, restarts and damage."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec

from kvtool.errors import ProtocolError
from kvtool.protocol import (
    EVENT_TYPES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    count_unknown_tags,
    decode_batch,
    sorted_unknown_tags,
    unknown_tags_text,
)
from kvtool.recording import open_recording
from kvtool.recording.ledger import GroupMeta
from kvtool.recording.unconfirmed import (
    UnconfirmedTail,
    lost_line,
    unconfirmed_lines,
    unconfirmed_tails,
)

if TYPE_CHECKING:
    from kvtool.recording import RecordedMessage


class ChannelSummary(msgspec.Struct, kw_only=True):
    """What one channel of a recording holds.

    Attributes:
        name: MCAP channel topic.
        endpoint: ZeroMQ endpoint.
        topic: ZeroMQ topic.
        dp_rank: Data-parallel rank (from the channel metadata, else from the batches).
        batches: Messages read back on this channel.
        seq_first: First seq in file order, or None when the channel is empty.
        seq_last: Last seq in file order, or None.
        start_time: First receive time (ns), or None.
        end_time: Last receive time (ns), or None.
    """

    name: str
    endpoint: str
    topic: str
    dp_rank: int | None
    batches: int = 0
    seq_first: int | None = None
    seq_last: int | None = None
    start_time: int | None = None
    end_time: int | None = None


class GapSummary(msgspec.Struct, kw_only=True):
    """Missing sequence numbers: fetched again through the replay socket, or lost.

    Attributes:
        recovered: Batches the recorder fetched through the replay socket.
        lost: Batches missing from the recording.
        lost_ranges: Inclusive ``[first, last]`` seq ranges that are missing.
        source: ``ledger`` (the recorder's gap ledger), ``file`` (seq discontinuities
            in the file, when the ledger is missing) or ``ledger+file`` (a damaged file
            whose ledger survived: the ledger's gaps plus what the damage cost).
    """

    recovered: int = 0
    lost: int = 0
    lost_ranges: list[list[int]] = msgspec.field(default_factory=list)
    source: str = "file"


class RecordingInfo(msgspec.Struct, kw_only=True):
    """Everything ``kvtool info`` says about one recording.

    Attributes:
        path: The recording.
        size_bytes: File size.
        batches: Messages (batches) read back.
        events: Event counts by type (every type present, zeros included).
        blocks_stored: Sum of ``len(block_hashes)`` over stores.
        blocks_removed: Sum of ``len(block_hashes)`` over removes.
        tokens_stored: Sum of ``len(token_ids)`` over stores.
        channels: One summary per channel, in channel-id order.
        gaps: Missing seqs.
        restarts: Publisher restarts (seq going backwards).
        duplicates: Messages whose seq repeats the previous one on their channel.
        start_time: First receive time (ns), or None for an empty recording.
        end_time: Last receive time (ns), or None.
        duration_s: ``end_time - start_time`` in seconds (0 when empty).
        groups: The stored KV cache group metadata, by index, or None.
        groups_source: Where the stored group metadata came from, or None.
        undecodable: Payloads that are not KV-event batches (kept in the file, counted).
        skipped_events: Events inside decodable batches that were skipped: undecodable,
            or of an unknown type (decodable, but unknown: ``unknown_events``).
        unknown_events: Of those, the events of an unknown type (``BlockInactive`` …), by
            tag as sent (issue 21), most frequent first.
        truncated: The file ends before its footer (the writer died).
        complete: The file is intact: footer, summary and every chunk.
        recovery: The reader's one-line recovery summary when not complete, else None.
        format_version: The recording's format version, when stored.
        kvtool_version: The kvtool that wrote it, when stored.
        recorded_at: The writer's start time (ISO 8601), when stored.
        command_line: The command that wrote it, when stored.
        unconfirmed: Channels whose tail the replay socket never confirmed, from the
            ledger (issue 23); empty when every tail was confirmed or there is no ledger.
        source_like: ``sglang`` when the stream shows SGLang's signature (no ``group_idx``
            on any event, signed 64-bit hashes, an ``AllBlocksCleared`` alone at seq 0:
            PROTOCOL.md "SGLang 0.5.23"), else None. A hint, never a rule: nothing else
            depends on it.
        pool_blocks: The engine's ``num_gpu_blocks`` stored by ``record --pool-blocks``
            (or a groups file that carries it), else None.
    """

    path: str
    size_bytes: int
    batches: int = 0
    events: dict[str, int] = msgspec.field(default_factory=dict)
    blocks_stored: int = 0
    blocks_removed: int = 0
    tokens_stored: int = 0
    channels: list[ChannelSummary] = msgspec.field(default_factory=list)
    gaps: GapSummary = msgspec.field(default_factory=GapSummary)
    unconfirmed: list[UnconfirmedTail] = msgspec.field(default_factory=list)
    restarts: int = 0
    duplicates: int = 0
    start_time: int | None = None
    end_time: int | None = None
    duration_s: float = 0.0
    groups: list[GroupMeta] | None = None
    groups_source: str | None = None
    undecodable: int = 0
    skipped_events: int = 0
    unknown_events: dict[str, int] = msgspec.field(default_factory=dict)
    truncated: bool = False
    complete: bool = True
    recovery: str | None = None
    format_version: object = None
    kvtool_version: str | None = None
    recorded_at: str | None = None
    command_line: list[str] | None = None
    source_like: str | None = None
    pool_blocks: int | None = None

    def problems(self) -> list[str]:
        """Say what is missing from this recording, one line each; empty when nothing is.

        The same policy as ``kvtool report``: a damaged or truncated file, batches lost
        while recording, and payloads or events that could not be decoded each make the
        command finish with exit status 3. So does a channel tail the replay socket never
        confirmed: batches may have followed it that the recording does not hold.

        Returns:
            Lines that start with the file name.
        """
        out: list[str] = []
        out += unconfirmed_lines(self.path, self.unconfirmed)
        if self.recovery is not None:
            out.append(self.recovery)
        g = self.gaps
        # In a damaged file the recovery line above already says what is missing.
        if g.lost and self.complete:
            out.append(lost_line(self.path, g.lost, g.lost_ranges))
        unknown = sum(self.unknown_events.values())
        bad = self.skipped_events - unknown  # events of an unknown tag decode: not bad
        if self.undecodable or bad:
            out.append(
                f"{self.path}: {self.undecodable} undecodable "
                f"payload{'' if self.undecodable == 1 else 's'} and {bad} "
                f"undecodable event{'' if bad == 1 else 's'} skipped"
            )
        if unknown:
            out.append(
                f"{self.path}: {unknown} event{'' if unknown == 1 else 's'} of unknown type "
                f"skipped ({unknown_tags_text(self.unknown_events)}): decodable, but of a "
                "type this kvtool does not know (a newer vLLM?)"
            )
        return out

    def to_json(self) -> dict[str, object]:
        """Return the ``--format json`` object (the keys issue 2 names, plus extras).

        ``channels`` entries and ``gaps`` hold exactly the keys issue 2 names; the
        extras (``file``, ``size_bytes``, times, ``gaps_source``, ``undecodable``,
        ``complete``, ``recovery`` …) are top-level keys.

        Returns:
            A JSON-serialisable dict.
        """
        return {
            "file": self.path,
            "size_bytes": self.size_bytes,
            "batches": self.batches,
            "events": dict(self.events),
            "blocks_stored": self.blocks_stored,
            "blocks_removed": self.blocks_removed,
            "tokens_stored": self.tokens_stored,
            "channels": [
                {
                    "endpoint": c.endpoint,
                    "topic": c.topic,
                    "dp_rank": c.dp_rank,
                    "batches": c.batches,
                    "seq_first": c.seq_first,
                    "seq_last": c.seq_last,
                }
                for c in self.channels
            ],
            "gaps": {
                "recovered": self.gaps.recovered,
                "lost": self.gaps.lost,
                "lost_ranges": [list(r) for r in self.gaps.lost_ranges],
            },
            "gaps_source": self.gaps.source,
            "unconfirmed": [t.to_json() for t in self.unconfirmed],
            "restarts": self.restarts,
            "duplicates": self.duplicates,
            "duration_s": self.duration_s,
            "start_time_ns": self.start_time,
            "end_time_ns": self.end_time,
            "groups": None if self.groups is None else [g.to_json() for g in self.groups],
            "groups_source": self.groups_source,
            "undecodable": self.undecodable,
            "skipped_events": self.skipped_events,
            "unknown_events": dict(self.unknown_events),
            "truncated": self.truncated,
            "complete": self.complete,
            "recovery": self.recovery,
            "format_version": self.format_version,
            "kvtool_version": self.kvtool_version,
            "recorded_at": self.recorded_at,
            "command_line": self.command_line,
            "source_like": self.source_like,
            "pool_blocks": self.pool_blocks,
        }


class _SeqTrack:
    """Per-channel seq bookkeeping: gaps, restarts and duplicates in file order."""

    __slots__ = ("duplicates", "last", "lost_ranges", "restarts")

    def __init__(self) -> None:
        self.last: int | None = None
        self.lost_ranges: list[list[int]] = []
        self.restarts = 0
        self.duplicates = 0

    def see(self, seq: int) -> None:
        last = self.last
        if last is not None:
            if seq > last + 1:
                self.lost_ranges.append([last + 1, seq - 1])
            elif seq == last:
                self.duplicates += 1
            elif seq < last:
                # A seq going backwards is a publisher restart, not a gap (issue 2).
                self.restarts += 1
        self.last = seq


class _Signature:
    """What tells an SGLang stream from vLLM's, from the wire alone (PROTOCOL.md).

    SGLang 0.5.23 sends no ``group_idx``, signed int64 hashes (about half negative), and
    its cache's constructor publishes an ``AllBlocksCleared`` as seq 0. vLLM since 0.21
    sends ``group_idx``, and since 0.10.2 unsigned hashes.
    """

    __slots__ = ("clear_at_0", "grouped", "negative", "stores")

    def __init__(self) -> None:
        self.grouped = False
        self.negative = False
        self.clear_at_0 = False
        self.stores = 0

    def see(self, seq: int, events: Sequence[object]) -> None:
        if seq == 0 and len(events) == 1 and isinstance(events[0], AllBlocksCleared):
            self.clear_at_0 = True
        for ev in events:
            if isinstance(ev, BlockStored | BlockRemoved):
                if ev.group_idx is not None:
                    self.grouped = True
                if isinstance(ev, BlockStored):
                    self.stores += 1
                if not self.negative:
                    self.negative = any(isinstance(h, int) and h < 0 for h in ev.block_hashes)

    def verdict(self) -> str | None:
        if self.stores and not self.grouped and self.negative and self.clear_at_0:
            return "sglang"
        return None


SGLANG_LIKE = "SGLang-like (signed hashes, no group_idx, a clear at seq 0)"
"""How kvtool names a stream whose wire shows SGLang's signature (:class:`_Signature`)."""
SIGNATURE_BATCHES = 64
"""Batches :func:`sglang_like` reads: the clear is seq 0, and about half of SGLang's
hashes are negative, so the first stores show the signature."""


def sglang_like(messages: Iterable[RecordedMessage], *, batches: int = SIGNATURE_BATCHES) -> bool:
    """Return True when a stream's first batches show SGLang's signature (issue 21).

    The same test as ``info``'s ``source_like`` (:class:`_Signature`), on the first
    ``batches`` batches only: for a caller that already knows no event of the whole
    stream carries ``group_idx`` (a report's findings, ``replay``'s warnings) and wants
    the hint without a second full pass. A hint, never a rule.

    Args:
        messages: The stream's recorded messages, in order.
        batches: Read at most this many.

    Returns:
        Whether those batches look like SGLang's.
    """
    sig = _Signature()
    for n, msg in enumerate(messages):
        if n >= batches:
            break
        try:
            batch = decode_batch(msg.data, seq=msg.seq)
        except (ProtocolError, RecursionError):
            continue
        sig.see(msg.seq, batch.events)
    return sig.verdict() == "sglang"


def recording_sglang_like(paths: Iterable[str | os.PathLike[str]]) -> bool:
    """Return True when every recording's first batches look like SGLang's (:func:`sglang_like`).

    A recording that cannot be opened counts as not SGLang-like (its error is said
    elsewhere).

    Args:
        paths: Recordings.

    Returns:
        True when there is at least one and each looks SGLang-like.
    """
    from kvtool.errors import KvtoolError

    seen = False
    for p in paths:
        try:
            with open_recording(p) as reader:
                if not sglang_like(reader.messages()):
                    return False
        except (KvtoolError, OSError):
            return False
        seen = True
    return seen


def _merge_ranges(ranges: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def summarize(path: str | os.PathLike[str]) -> RecordingInfo:
    """Read a recording once and summarise it, decoding each payload once.

    A damaged or truncated file is summarised from what could be read; check
    ``complete`` / ``truncated`` and ``recovery`` on the result. Undecodable payloads are
    counted, never fatal.

    Args:
        path: The recording.

    Returns:
        The summary.

    Raises:
        RecordingError: The file cannot be opened or is not a kvtool recording.
        UnsupportedVersion: The recording was written by a newer kvtool format.
    """
    with open_recording(path) as reader:
        info = RecordingInfo(path=reader.path, size_bytes=os.path.getsize(reader.path))
        events = dict.fromkeys(EVENT_TYPES, 0)
        chans: dict[int, ChannelSummary] = {}
        tracks: dict[int, _SeqTrack] = {}
        start: int | None = None
        end: int | None = None
        stored = removed = tokens = 0
        by_class: dict[type, int] = {}
        unknown: dict[str, int] = {}
        sig = _Signature()
        for msg in reader.messages():
            ch = msg.channel
            cs = chans.get(ch.id)
            if cs is None:
                cs = chans[ch.id] = ChannelSummary(
                    name=ch.name, endpoint=ch.endpoint, topic=ch.topic, dp_rank=ch.dp_rank
                )
                tracks[ch.id] = _SeqTrack()
            cs.batches += 1
            if cs.seq_first is None:
                cs.seq_first = msg.seq
                cs.start_time = msg.log_time
            cs.seq_last = msg.seq
            cs.end_time = msg.log_time
            tracks[ch.id].see(msg.seq)
            t = msg.log_time
            start = t if start is None or t < start else start
            end = t if end is None or t > end else end
            try:
                batch = decode_batch(msg.data, seq=msg.seq)
            except ProtocolError:
                info.undecodable += 1
                continue
            if cs.dp_rank is None and batch.data_parallel_rank is not None:
                cs.dp_rank = batch.data_parallel_rank
            if batch.skipped:
                info.skipped_events += len(batch.skipped)
                if batch.unknown_tags:
                    count_unknown_tags(unknown, Counter(batch.unknown_tags).items())
            sig.see(msg.seq, batch.events)
            # Hot loop (one pass per event): count by class, map classes to tags at the end.
            for ev in batch.events:
                cls = type(ev)
                by_class[cls] = by_class.get(cls, 0) + 1
                if isinstance(ev, BlockRemoved):
                    removed += len(ev.block_hashes)
                elif isinstance(ev, BlockStored):
                    stored += len(ev.block_hashes)
                    tokens += len(ev.token_ids)
        for cls, n in by_class.items():
            tag = cls.__struct_config__.tag
            events[str(tag)] = events.get(str(tag), 0) + n
        rec = reader.recovery
        info.source_like = sig.verdict()
        info.batches = sum(c.batches for c in chans.values())
        info.events = events
        info.unknown_events = sorted_unknown_tags(unknown)
        info.blocks_stored, info.blocks_removed, info.tokens_stored = stored, removed, tokens
        # Channels that are defined but carried no message are listed too.
        for cid, ch in sorted(reader.channels.items()):
            if cid not in chans:
                chans[cid] = ChannelSummary(
                    name=ch.name, endpoint=ch.endpoint, topic=ch.topic, dp_rank=ch.dp_rank
                )
        info.channels = [chans[cid] for cid in sorted(chans)]
        info.start_time, info.end_time = start, end
        info.duration_s = (end - start) / 1e9 if start is not None and end is not None else 0.0
        info.truncated = rec.truncated
        info.complete = rec.complete
        info.recovery = None if rec.complete else rec.summary()

        # Seq ranges are per channel: never merged across channels.
        file_by_chan = {chans[cid].name: tr.lost_ranges for cid, tr in tracks.items()}
        file_restarts = sum(tr.restarts for tr in tracks.values())
        info.duplicates = sum(tr.duplicates for tr in tracks.values())
        ledger = reader.gap_ledger
        if ledger is None:
            ranges = sorted(r for rs in file_by_chan.values() for r in rs)
            info.gaps = GapSummary(
                recovered=0, lost=sum(b - a + 1 for a, b in ranges), lost_ranges=ranges
            )
            info.restarts = file_restarts
        else:
            if rec.complete:
                info.gaps = GapSummary(
                    recovered=ledger.recovered,
                    lost=ledger.lost,
                    lost_ranges=sorted([a, b] for a, b in ledger.lost_ranges),
                    source="ledger",
                )
            else:
                # A damaged file whose ledger survived: the ledger's losses plus what the
                # damage cost, merged channel by channel.
                by_chan = {
                    name: [[a, b] for a, b in rs] for name, rs in ledger.lost_by_channel().items()
                }
                for name, rs in file_by_chan.items():
                    by_chan[name] = by_chan.get(name, []) + rs
                ranges = sorted(r for rs in by_chan.values() for r in _merge_ranges(rs))
                info.gaps = GapSummary(
                    recovered=ledger.recovered,
                    lost=sum(b - a + 1 for a, b in ranges),
                    lost_ranges=ranges,
                    source="ledger+file",
                )
            info.restarts = ledger.restarts
        info.unconfirmed = unconfirmed_tails(ledger)
        # The channel's rank as the channels table gives it (metadata, else the batches).
        ranks = {c.name: c.dp_rank for c in info.channels}
        for tail in info.unconfirmed:
            if tail.dp_rank is None:
                tail.dp_rank = ranks.get(tail.channel)

        for grec in reader.group_records:
            if grec.channel is None:
                info.groups = sorted(grec.groups, key=lambda g: g.group_idx)
                info.groups_source = grec.source
                break
        ctx = reader.recording_context
        if ctx is not None:
            info.format_version = ctx.format_version
            info.kvtool_version = ctx.kvtool_version
            info.recorded_at = ctx.start_time
            info.command_line = ctx.command_line
            info.pool_blocks = ctx.pool_blocks
        return info
