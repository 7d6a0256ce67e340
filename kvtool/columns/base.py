"""The flat table's schema and the records every step of its making shares.

The columns (:data:`TABLE_SCHEMA`, :data:`EXTRA_SCHEMA`), the codes of ``type_code``,
the channel references and the read's counts (:class:`ReadStats`), and the two forms of
a chunk: read (:class:`RawChunk`) and decoded (:class:`DecodedChunk`). Nothing here
decodes or reads; every other module of :mod:`kvtool.columns` imports from this one.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from kvtool.annotate import Annotation
from kvtool.inputs import MergeFindings
from kvtool.recording import ChannelInfo
from kvtool.text import plural, printable

if TYPE_CHECKING:
    from kvtool.report.source import Finding

Progress = Callable[[int, int], None]
"""A progress hook: ``(bytes done, bytes total)`` of the input files."""

STORED, REMOVED, CLEARED = 0, 1, 2
"""Codes of the ``type_code`` column."""

EVENT_TYPE_NAMES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
EVENT_TYPE = pl.Enum(list(EVENT_TYPE_NAMES))

UNANNOTATED = "unannotated"
"""Kind label of rows no metadata or annotated store gives a kind (not vLLM's ``unknown``)."""
UNATTRIBUTED = "unattributed"
"""Kind label of removes without ``group_idx`` whose hash is not live in exactly one group."""

TABLE_SCHEMA: dict[str, pl.DataType] = {
    "log_time": pl.Int64(),
    "ts": pl.Float64(),
    "seq": pl.Int64(),
    "recording": pl.String(),
    "channel": pl.String(),
    "channel_id": pl.UInt32(),
    "dp_rank": pl.Int64(),
    "type": EVENT_TYPE,
    "group_idx": pl.Int64(),
    "kind": pl.String(),
    "sliding_window": pl.Int64(),
    "hash": pl.Int64(),
    "tokens": pl.Int64(),
    "medium": pl.String(),
    "event_index": pl.Int64(),
    "block_index": pl.Int32(),
    "block_count": pl.Int32(),
    "payload_rank": pl.Int64(),
}
"""The flat table. ``event_index`` numbers events across the whole read (all files);
``block_index``/``block_count`` place the row inside its event; ``channel_id`` numbers
the publisher streams (endpoint, topic, rank) of one read, a stream held by several
files being one channel (``recording`` names the first input that holds it);
``kind``/``sliding_window`` are the wire values until :class:`TableAnnotator` sets them.
``dp_rank`` is the channel's data-parallel rank (its endpoint's: what every command takes;
the payload's only on a channel without one), ``payload_rank`` the rank the payload names
where it differs from that (null elsewhere; issue 24)."""

EXTRA_SCHEMA: dict[str, pl.DataType] = {
    "parent": pl.Int64(),
    "origin": pl.Int8(),
    "block_size": pl.Int64(),
}
"""Columns of the unlabelled table beside :data:`TABLE_SCHEMA` (the report's kernel reads
them, issue 21; a labelled table -- what ``export`` writes -- leaves them out): per row, its
event's ``parent_block_hash`` as a key (null: no parent, or one that is not a hash) and its
``origin`` (vllm-project/vllm#51699) as a code (:data:`ORIGIN_CODES`; 0: none or another
value). ``block_size`` (a store's, when it is an int64; else null) is made only when a
reader names it (not for ``keep=None``)."""

ORIGIN_CODES = {"NEW": 1, "REUSED": 2}
"""``origin`` values and their codes in the ``origin`` column."""

T = TypeVar("T")

_LABELS = ("recording", "channel", "type")

DEFAULT_CHUNK_BYTES = 4 << 20
"""Payload bytes decoded into one table chunk.

A chunk's tables and arrays are about 10x its payload, and a report holds about three
chunks at once (one decoding, one in the state kernel, one in its ``after``): at 16 MiB
that was ~170 MB of a report's peak RSS, at 4 MiB it is ~40 MB, for ~4 % more CPU
(bench/RESULTS.md, "key table split"). The report is the same for any chunking."""


# -- reading recordings --------------------------------------------------------------------


@dataclass
class ChannelRef:
    """One publisher stream (endpoint, topic, rank) of a read, numbered across files.

    Attributes:
        id: The ``channel_id`` of its rows.
        recording: The path of the first input that holds the stream.
        info: The channel as the recording names it.
    """

    id: int
    recording: str
    info: ChannelInfo


MergeKey = tuple[int, str, str, int]
"""THE merge order's key of a message: (receive time, endpoint, topic, seq), as
:mod:`kvtool.inputs` orders messages across recordings."""

NO_KEY: MergeKey = (1 << 63, "", "", 0)
"""After every message's key."""

MAX_PROBLEMS = 20
"""Problem messages a read keeps (the counts cover all of them)."""


@dataclass
class ReadStats:
    """What a read decoded and what it had to skip.

    Attributes:
        recordings: Paths read.
        messages: Messages (batches) read.
        events: Events decoded.
        rows: Table rows built.
        payload_bytes: Payload bytes read.
        bad_batches: Payloads that were not a batch at all (skipped).
        skipped_events: Events skipped by the decoder.
        unknown_tags: Of those, the events of an unknown type, by tag (as sent, at most
            :data:`kvtool.protocol.MAX_UNKNOWN_TAGS` tags by name; issue 21).
        problems: Messages naming skipped batches/events: those about the earliest
            messages (:meth:`note`), the earliest first.
        problem_keys: The key of each problem's message (:data:`MergeKey`).
        damaged: One finding (kind ``damaged``, its ``path`` the recording) per recording
            that was truncated or damaged.
        groups: ``group_idx`` metadata stored in each recording (path → list or None).
        channels: Every channel, by ``channel_id``.
        lost: The findings (kind ``lost``, their ``path`` the recording) of each recording
            whose gap ledger names batches lost while recording or tails never confirmed.
        merge: What the same-batch rule found across inputs (:mod:`kvtool.inputs`).
        unselected: Batches read but left out by a selection (``--since``, ``--rank`` …).
        unordered: A read of some streams only (``streams``) met a batch of the input
            whose (receive time, endpoint, topic, seq) came before the previous one's.
        streams_seen: Every stream such a read met, kept or not.
        first_keys: By ``channel_id``: THE merge order's key (receive time, endpoint,
            topic, seq) of the channel's first message, which numbered it.
        payload_ranks: (``channel_id``, rank) → batches whose payload names that rank
            while their channel has another (issue 24: the channel's is kept).
        origin_rows: Rows whose ``BlockStored`` carries vLLM's proposed ``origin``
            (vllm-project/vllm#51699; counted where the table keeps the column).
    """

    recordings: list[str] = field(default_factory=list)
    messages: int = 0
    events: int = 0
    rows: int = 0
    payload_bytes: int = 0
    bad_batches: int = 0
    skipped_events: int = 0
    problems: list[str] = field(default_factory=list)
    damaged: list[Finding] = field(default_factory=list)
    unknown_tags: dict[str, int] = field(default_factory=dict)
    groups: dict[str, list[dict[str, object]] | None] = field(default_factory=dict)
    channels: dict[int, ChannelRef] = field(default_factory=dict)
    lost: list[Finding] = field(default_factory=list)
    merge: MergeFindings = field(default_factory=MergeFindings)
    unselected: int = 0
    unordered: bool = False
    streams_seen: set[tuple[str, str, int | None]] = field(default_factory=set)
    first_keys: dict[int, MergeKey] = field(default_factory=dict)
    origin_rows: int = 0

    problem_keys: list[MergeKey] = field(default_factory=list)
    payload_ranks: dict[tuple[int, int], int] = field(default_factory=dict)

    def rank_findings(self) -> list[str]:
        """One line per channel whose payloads name another data-parallel rank (issue 24).

        Returns:
            The lines, by ``channel_id``.
        """
        by_channel: dict[int, dict[int, int]] = {}
        for (cid, r), n in sorted(self.payload_ranks.items()):
            by_channel.setdefault(cid, {})[r] = n
        out = []
        for cid, named in by_channel.items():
            ref = self.channels.get(cid)
            name = printable(ref.info.name) if ref is not None else str(cid)
            rank = ref.info.dp_rank if ref is not None else None
            shown = ", ".join(f"{r} in {plural(k, 'batch')}" for r, k in named.items())
            out.append(
                f"channel {name} is data-parallel rank {rank} (its endpoint's), but its "
                f"payloads name data_parallel_rank {shown}: counted under rank {rank}; "
                "the payload's rank is kept in the payload_rank column"
            )
        return out

    def note(self, msg: str, key: MergeKey | None = None) -> None:
        """Keep a problem message: those about the earliest messages, in THE merge order.

        Keyed by the message a problem is about, the kept ones are the same however the
        read was split (chunks, processes, units of work): each part keeps its earliest
        :data:`MAX_PROBLEMS`, and noting them all into one keeps the earliest of all.

        Args:
            msg: The problem.
            key: Its message's key (None: after every message's).
        """
        k = key if key is not None else NO_KEY
        at = bisect.bisect_right(self.problem_keys, k)
        if at >= MAX_PROBLEMS:
            return
        self.problem_keys.insert(at, k)
        self.problems.insert(at, msg)
        if len(self.problems) > MAX_PROBLEMS:
            del self.problems[MAX_PROBLEMS:], self.problem_keys[MAX_PROBLEMS:]


_Codes = tuple[Any, list[str]]
"""Strings as codes (int32, -1: None) into a vocabulary."""
_Ints = tuple[Any, Any]
"""Nullable ints as (int64 values, bool valid)."""


@dataclass
class RawChunk:
    """The payloads of one table chunk, read but not decoded.

    Plain lists of ints and bytes, so it pickles cheaply: :func:`decode_chunk` may run in
    another process (``report --jobs``) or on a Ray worker (``report --ray``).

    Attributes:
        log_time: Receive time (ns) per batch.
        seq: Sequence number per batch.
        channel_id: Table ``channel_id`` per batch.
        dp_rank: The channel's data-parallel rank per batch (the table's ``dp_rank``; the
            batch's own rank only where the channel has none: issue 24).
        data: The payloads, byte for byte.
        where: ``channel_id`` → "path: channel" for problem messages.
        streams: ``channel_id`` → (endpoint, topic), for the problems' keys.
        ranks: Keep only batches of these data-parallel ranks (None: all); a batch's own
            rank is known once decoded, so this selection is made by :func:`decode_chunk`.
        annotation: Annotate the decoded rows with it too (:func:`annotate_table`), where
            they are decoded (a pool worker takes that work off the driver); None: leave
            them unannotated.
        channels: The chunk's channels by ``channel_id`` (needed with ``annotation``).
        keep: Return only these table columns (None: all), those the consumer reads: a
            table shipped from a worker process costs less the fewer columns it has.
    """

    log_time: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    channel_id: list[int] = field(default_factory=list)
    dp_rank: list[int | None] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    where: dict[int, str] = field(default_factory=dict)
    streams: dict[int, tuple[str, str]] = field(default_factory=dict)
    bytes: int = 0
    ranks: frozenset[int | None] | None = None
    annotation: Annotation | None = None
    channels: dict[int, ChannelRef] | None = None
    keep: tuple[str, ...] | None = None


@dataclass
class DecodedChunk:
    """A decoded :class:`RawChunk`: its table (``event_index`` from 0) and what was skipped.

    Attributes:
        table: The rows (as :func:`_build` makes them; not yet labelled).
        events: Events decoded.
        rows: Rows built.
        bad_batches: Payloads that were not a batch.
        skipped_events: Events skipped.
        unknown_tags: Of those, the events of an unknown type, by tag.
        problems: Messages naming what was skipped, in stream order.
        problem_keys: Their messages' keys (:meth:`ReadStats.note`).
        payload_ranks: As :attr:`ReadStats.payload_ranks`, for this chunk.
        unselected: Batches left out by ``ranks``.
        out_of_range: When the chunk came with an annotation, the table is annotated and
            this counts its stores per group index outside a given metadata table (as
            :func:`annotate_table` does); None: not annotated.
    """

    table: pl.DataFrame
    events: int = 0
    rows: int = 0
    bad_batches: int = 0
    skipped_events: int = 0
    problems: list[str] = field(default_factory=list)
    unselected: int = 0
    out_of_range: dict[int, int] | None = None
    problem_keys: list[MergeKey] = field(default_factory=list)
    payload_ranks: dict[tuple[int, int], int] = field(default_factory=dict)
    unknown_tags: dict[str, int] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        # A pool worker pickles its result back to the driver: polars' own pickling
        # (serialize) costs ~10x the Arrow IPC of the same table, and a zstd-compressed
        # IPC is ~2% of its size (the per-event columns repeat on each block's row), so
        # the pipe and the pickles copy ~0.5 MB a chunk instead of ~20 MB.
        state = dict(self.__dict__)
        table = state.pop("table")
        if table.width:
            buf = io.BytesIO()
            table.write_ipc(buf, compression="zstd")
            state["_ipc"] = buf.getvalue()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        ipc = state.pop("_ipc", None)
        state["table"] = pl.read_ipc(ipc) if ipc is not None else pl.DataFrame()
        self.__dict__.update(state)


def _key(streams: dict[int, tuple[str, str]], log_time: int, cid: int, seq: int) -> MergeKey:
    """The key of one of a chunk's messages, by its ``channel_id`` (:attr:`RawChunk.streams`)."""
    endpoint, topic = streams.get(cid, ("", ""))
    return (log_time, endpoint, topic, seq)


DecodeMap = Callable[[Iterator[RawChunk]], Iterator[DecodedChunk]]
