"""The recording's own metadata records as typed structs: context, group metadata, gap ledger.

Each struct is written with ``to_json()`` (the JSON shape on disk, unchanged since format
version 1, so old files read) and read with :func:`parse_record`, which validates a
record completely: a record of the wrong shape is damage the reader counts, never an
exception further on. Ints are bounded where columns and tables use them as signed 64-bit
values (polars ``Int64``), so a stored ``group_idx`` of ``2**63 - 1`` cannot crash a
report.

On disk (values of the ``kvtool.*`` metadata records, each a JSON string):

- ``kvtool.recording``: :class:`RecordingContext`;
- ``kvtool.groups``: :class:`GroupsRecord` (``groups``, ``source``, optional ``channel``);
- ``kvtool.gaps``: ``{"ledger": GapLedger}``, written at close::

    {"channels": [{"channel", "endpoint", "topic", "dp_rank", "batches", "seq_first",
                   "seq_last", "gaps": [{"first", "last", "recovered",
                   "lost_ranges": [[a, b], ...]}],
                   "restarts": [{"log_time", "from_seq", "to_seq"}],
                   ["gaps_omitted", "restarts_omitted", "unconfirmed_from"]}],
     "recovered": n, "lost": n, "lost_ranges": [[a, b], ...], "restarts": n,
     ["lost_ranges_omitted", "unconfirmed"]}

``unconfirmed_from`` / ``unconfirmed`` (issue 23) appear only when a channel's tail was
asked of the replay socket and its answer never ended: whether batches followed is
unknown. Older ledgers have neither and read as before.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from kvtool.poolbounds import MAX_POOL_BLOCKS, MIN_POOL_BLOCKS
from kvtool.recording import format as fmt

Seq = Annotated[int, msgspec.Meta(ge=0)]
"""A sequence number: unsigned 64-bit."""
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
"""A count or a time in ns: fits signed 64-bit columns."""
GroupIndex = Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
"""vLLM numbers its KV cache groups 0..N-1; N is a handful."""
Size = Annotated[int, msgspec.Meta(ge=0, lt=2**40)]
"""A block size or a sliding window, in tokens."""
Name = Annotated[str, msgspec.Meta(max_length=fmt.MAX_STRING_BYTES)]
SeqRange = tuple[Seq, Seq]
_U64_MAX = 2**64 - 1


class GapRecord(msgspec.Struct, kw_only=True):
    """One gap on one channel: seqs ``first..last`` went missing from the live stream.

    Attributes:
        first: First missing seq.
        last: Last missing seq, or None when the gap was still open at close.
        recovered: Batches fetched again through the replay socket.
        lost_ranges: Inclusive ``(a, b)`` seq ranges never recovered.
    """

    first: Seq
    last: Seq | None = None
    recovered: Count = 0
    lost_ranges: list[SeqRange] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        """Check the seqs fit 64 bits and each range is in order.

        Raises:
            ValueError: A seq past 2**64-1 or a range whose end precedes its start.
        """
        _check_ranges([(self.first, self.first if self.last is None else self.last)])
        _check_ranges(self.lost_ranges)


class RestartRecord(msgspec.Struct, kw_only=True):
    """A publisher restart: the seq went back from ``from_seq`` to ``to_seq``.

    Attributes:
        log_time: Receive time (ns) of the first batch after the restart.
        from_seq: Last seq before it.
        to_seq: First seq after it.
    """

    log_time: Count = 0
    from_seq: Seq = 0
    to_seq: Seq = 0


class ChannelLedger(msgspec.Struct, kw_only=True):
    """One channel's part of the gap ledger.

    Attributes:
        channel: MCAP channel topic (``endpoint`` or ``endpoint#topic``).
        endpoint: ZeroMQ endpoint.
        topic: ZeroMQ topic.
        dp_rank: Data-parallel rank, when known.
        batches: Batches written on the channel.
        seq_first: First seq written, or None.
        seq_last: Last seq written, or None.
        gaps: Gaps (capped list; see ``gaps_omitted``).
        restarts: Publisher restarts (capped list; see ``restarts_omitted``).
        gaps_omitted: Gaps left out of ``gaps`` to keep the record small.
        restarts_omitted: Restarts left out of ``restarts``.
        unconfirmed_from: The channel's tail from this seq on was asked for and never
            confirmed (the replay's answer never ended); None when confirmed.
    """

    channel: Name = ""
    endpoint: Name = ""
    topic: Name = ""
    dp_rank: Annotated[int, msgspec.Meta(ge=-(2**31), lt=2**31)] | None = None
    batches: Count = 0
    seq_first: Seq | None = None
    seq_last: Seq | None = None
    gaps: list[GapRecord] = msgspec.field(default_factory=list)
    restarts: list[RestartRecord] = msgspec.field(default_factory=list)
    gaps_omitted: Count = 0
    restarts_omitted: Count = 0
    unconfirmed_from: Seq | None = None

    @property
    def lost_ranges(self) -> list[SeqRange]:
        """Every lost range of this channel's gaps, in ledger order."""
        return [r for g in self.gaps for r in g.lost_ranges]


class GapLedger(msgspec.Struct, kw_only=True):
    """The recorder's gap ledger (``kvtool.gaps`` record): what went missing, and why.

    Attributes:
        channels: Per-channel detail (empty in ledgers that only have totals).
        recovered: Batches fetched again through the replay socket, all channels.
        lost: Batches missing from the recording, all channels (exact).
        lost_ranges: Lost seq ranges, all channels (capped; see ``lost_ranges_omitted``).
        restarts: Publisher restarts, all channels.
        lost_ranges_omitted: Ranges left out of ``lost_ranges``.
        unconfirmed: Channels whose tail is unconfirmed (see
            :attr:`ChannelLedger.unconfirmed_from`).
    """

    channels: list[ChannelLedger] = msgspec.field(default_factory=list)
    recovered: Count = 0
    lost: Count = 0
    lost_ranges: list[SeqRange] = msgspec.field(default_factory=list)
    restarts: Count = 0
    lost_ranges_omitted: Count = 0
    unconfirmed: Count = 0

    def __post_init__(self) -> None:
        """Check the seqs fit 64 bits and each range is in order.

        Raises:
            ValueError: A seq past 2**64-1 or a range whose end precedes its start.
        """
        _check_ranges(self.lost_ranges)

    def lost_by_channel(self) -> dict[str, list[SeqRange]]:
        """Lost ranges per MCAP channel topic; a totals-only ledger's go under ``""``.

        Returns:
            Channel topic → lost ranges.
        """
        if not self.channels:
            return {"": list(self.lost_ranges)}
        out: dict[str, list[SeqRange]] = {}
        for ch in self.channels:
            out.setdefault(ch.channel, []).extend(ch.lost_ranges)
        return out

    def to_json(self) -> dict[str, object]:
        """Return the ledger as stored in the ``kvtool.gaps`` record's ``ledger`` value.

        The ``*_omitted`` keys appear only when something was left out, as always, and
        the ``unconfirmed`` ones only when a tail is unconfirmed.

        Returns:
            A JSON-serialisable dict.
        """
        out = _builtins(self)
        chans = out.get("channels")
        for ch in chans if isinstance(chans, list) else []:
            if isinstance(ch, dict):
                _drop_zero(ch, "gaps_omitted", "restarts_omitted")
                if ch.get("unconfirmed_from", 0) is None:
                    del ch["unconfirmed_from"]
        _drop_zero(out, "lost_ranges_omitted", "unconfirmed")
        return out


class GroupMeta(msgspec.Struct, kw_only=True):
    """One entry of ``get_kv_cache_group_metadata()``.

    Attributes:
        group_idx: The group's index (0..N-1).
        kind: vLLM's spec kind (``full_attention``, ``sliding_window`` …).
        block_size: Tokens per block, when known.
        sliding_window: The window in tokens, for windowed kinds.
    """

    group_idx: GroupIndex
    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    block_size: Size | None = None
    sliding_window: Size | None = None

    def to_json(self) -> dict[str, object]:
        """Return the entry as vLLM and the ``kvtool.groups`` record hold it.

        Returns:
            ``{"group_idx", "kind", "block_size", "sliding_window"}``.
        """
        return _builtins(self)


class GroupsRecord(msgspec.Struct, kw_only=True):
    """A ``kvtool.groups`` record: the group table for all channels or for one.

    Attributes:
        groups: The table, one entry per group, indices unique and 0..N-1.
        source: Where it came from (a file name, ``--group`` flags …).
        channel: The MCAP channel topic it applies to; None for all channels.
    """

    groups: list[GroupMeta]
    source: Name = ""
    channel: Name | None = None

    def __post_init__(self) -> None:
        """Check the indices as vLLM numbers groups: unique, 0..N-1.

        Raises:
            ValueError: Empty, duplicate or missing indices.
        """
        if not self.groups:
            raise ValueError("the list of groups is empty")
        seen = sorted(g.group_idx for g in self.groups)
        if seen != list(range(len(seen))):
            raise ValueError(f"group_idx values {seen[:8]} do not run 0..{len(seen) - 1}")

    def metadata_list(self) -> list[dict[str, object]]:
        """Return the groups as ``get_kv_cache_group_metadata()``'s list, by index.

        Returns:
            One dict per group.
        """
        return [g.to_json() for g in sorted(self.groups, key=lambda g: g.group_idx)]

    def to_json(self) -> dict[str, object]:
        """Return the record's values (``channel`` only when set).

        Returns:
            ``{"groups", "source"[, "channel"]}``.
        """
        out: dict[str, object] = {"groups": [g.to_json() for g in self.groups]}
        out["source"] = self.source
        if self.channel is not None:
            out["channel"] = self.channel
        return out


class RecordingContext(msgspec.Struct, kw_only=True):
    """The ``kvtool.recording`` record: who wrote the recording, when, and how.

    Attributes:
        format_version: The format version (an int, or ``"MAJOR.MINOR"``).
        kvtool_version: The kvtool that wrote it.
        start_time: When writing began (ISO 8601, UTC).
        command_line: The command line that wrote it.
        endpoints: The publisher endpoints recorded.
        replay_endpoints: Their replay endpoints (None where there was none).
        topic: The ZeroMQ topic subscribed to.
        bind: The SUB sockets bound instead of connecting.
        history: Each replay buffer's history was fetched first.
        pool_blocks: The engine's ``num_gpu_blocks`` (``record --pool-blocks``, or a
            groups file that carries it), when given.
    """

    format_version: int | Name | None = None
    kvtool_version: Name | None = None
    start_time: Name | None = None
    command_line: list[Name] | None = None
    endpoints: list[Name] | None = None
    replay_endpoints: list[Name | None] | None = None
    topic: Name | None = None
    bind: bool | None = None
    history: bool | None = None
    pool_blocks: Annotated[int, msgspec.Meta(ge=MIN_POOL_BLOCKS, le=MAX_POOL_BLOCKS)] | None = None

    def to_json(self) -> dict[str, object]:
        """Return the record's values: the fields that are set.

        Returns:
            A JSON-serialisable dict.
        """
        return {k: v for k, v in _builtins(self).items() if v is not None}


_TYPES: dict[str, type[msgspec.Struct]] = {
    fmt.META_RECORDING: RecordingContext,
    fmt.META_GROUPS: GroupsRecord,
    fmt.META_GAPS: GapLedger,
}
TYPED_RECORDS = frozenset(_TYPES)
"""Metadata record names :func:`parse_record` validates."""


def parse_record(name: str, values: dict[str, object]) -> msgspec.Struct | None:
    """Validate one metadata record's decoded values into its struct.

    Args:
        name: The record name (``kvtool.recording``, ``kvtool.groups``, ``kvtool.gaps``).
        values: The record's values, each already JSON-decoded.

    Returns:
        The struct, or None for a name this module does not type.

    Raises:
        ValueError: The record does not have its documented shape (the reader counts it
            as a damaged record and reads on).
    """
    cls = _TYPES.get(name)
    if cls is None:
        return None
    obj: object = values.get("ledger") if cls is GapLedger else values
    try:
        return msgspec.convert(obj, cls)
    except (msgspec.ValidationError, RecursionError) as err:
        raise ValueError(f"{name} record is malformed ({_short(err)})") from None


def parse_ledger(value: object) -> GapLedger | None:
    """Validate a ledger dict (e.g. a ``CaptureResult.ledger``) into a :class:`GapLedger`.

    Args:
        value: The ledger as JSON-like data.

    Returns:
        The ledger, or None when it does not have the ledger's shape.
    """
    try:
        return msgspec.convert(value, GapLedger)
    except (msgspec.ValidationError, RecursionError):
        return None


def _check_ranges(ranges: list[SeqRange]) -> None:
    for a, b in ranges:
        if b < a or b > _U64_MAX:
            raise ValueError(f"seq range [{a}, {b}] is not a range of 64-bit seqs")


def _short(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _builtins(obj: msgspec.Struct) -> dict[str, object]:
    # Through JSON and back: tuples come out as lists, exactly as json.loads gives them.
    out = msgspec.json.decode(msgspec.json.encode(obj))
    assert isinstance(out, dict)
    return out


def _drop_zero(d: dict[str, object], *keys: str) -> None:
    for k in keys:
        if d.get(k) == 0:
            del d[k]


__all__ = [
    "TYPED_RECORDS",
    "ChannelLedger",
    "GapLedger",
    "GapRecord",
    "GroupMeta",
    "GroupsRecord",
    "RecordingContext",
    "RestartRecord",
    "parse_ledger",
    "parse_record",
]
