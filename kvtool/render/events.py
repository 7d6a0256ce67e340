"""Render replayed events as JSON lines (the machine format) or pretty lines (rich)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TextIO

import msgspec
from rich.cells import cell_len
from rich.text import Text

from kvtool.annotate import kind_label
from kvtool.protocol import BlockRemoved, BlockStored, Event, event_to_builtins, event_type
from kvtool.text import printable

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.replay import ReplayBatch

_JSON = msgspec.json.Encoder()

HashFormat = Literal["str", "hex", "int"]
"""How a block hash is shown: ``str`` (decimal string, the JSON-safe default), ``hex`` (16
lower-case hex digits of its 64-bit key) or ``int`` (a JSON number as sent; jq and
JavaScript round integers above 2**53). ``str`` and ``int`` show a bytes hash as all its
bytes in lower-case hex; ``hex`` shows every hash as its 64-bit key, a bytes hash's being
its last 8 bytes (vLLM's conversion, the report table's ``hash``): exactly ``export``'s
``hash_hex``, so the two join (issue 24)."""

HASH_FORMATS: tuple[HashFormat, ...] = ("str", "hex", "int")

_MASK64 = (1 << 64) - 1


def format_hash(h: object, hash_format: HashFormat = "str") -> object:
    """Return one block hash as JSONL and the pretty view show it.

    Args:
        h: The hash as decoded: an int (unsigned 64-bit from vLLM, signed from old vLLM
            or SGLang) or bytes.
        hash_format: See :data:`HashFormat`.

    Returns:
        A str, or the int itself for ``int``.
    """
    if isinstance(h, bytes):
        if hash_format == "hex":
            return f"{int.from_bytes(h[-8:], 'big'):016x}"
        return h.hex()
    if isinstance(h, int) and not isinstance(h, bool):
        if hash_format == "str":
            return str(h)
        if hash_format == "hex":
            return f"{h & _MASK64:016x}"
        return h
    return h


def _hashes(hashes: Sequence[object], hash_format: HashFormat) -> list[object]:
    if hash_format == "int":
        return [h.hex() if isinstance(h, bytes) else h for h in hashes]
    return [format_hash(h, hash_format) for h in hashes]


def event_record(
    *,
    seq: int,
    ts: float | None,
    log_time: int,
    channel: str,
    dp_rank: int | None,
    event: Event,
    hash_format: HashFormat = "str",
) -> dict[str, object]:
    """Return the JSON object of one event: context keys, then ``type`` and every field.

    Args:
        seq: The batch's seq.
        ts: The batch's ``ts`` (publisher clock, float seconds).
        log_time: Receive time, ns since the epoch.
        channel: The channel name.
        dp_rank: The batch's data-parallel rank (null when unknown).
        event: The event.
        hash_format: How int hashes are written (:data:`HashFormat`).

    Returns:
        ``{"seq", "ts", "log_time", "channel", "dp_rank", "type", field: value, …}``;
        ``block_hashes`` and ``parent_block_hash`` as :func:`format_hash` shows them, other
        bytes as lower-case hex strings.
    """
    rec: dict[str, object] = {
        "seq": seq,
        "ts": ts,
        "log_time": log_time,
        "channel": channel,
        "dp_rank": dp_rank,
    }
    if _has_bytes(event):
        rec.update(event_to_builtins(event))
    else:
        # Fast path (C): the struct's fields as they are; JSON encodes them directly.
        rec["type"] = type(event).__struct_config__.tag
        rec.update(_asdict(event))
    if isinstance(event, BlockStored | BlockRemoved):
        rec["block_hashes"] = _hashes(event.block_hashes, hash_format)
        if isinstance(event, BlockStored) and event.parent_block_hash is not None:
            rec["parent_block_hash"] = format_hash(event.parent_block_hash, hash_format)
    return rec


_asdict = msgspec.structs.asdict


_PLAIN = frozenset({int, str, float, bool, type(None)})


def _deep_bytes(obj: object) -> bool:
    if isinstance(obj, bytes):
        return True
    if isinstance(obj, list | tuple):
        types = set(map(type, obj))
        if types <= _PLAIN:
            return False
        return bytes in types or any(_deep_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return any(_deep_bytes(k) or _deep_bytes(v) for k, v in obj.items())
    return False


def _has_bytes(event: Event) -> bool:
    """True when a field holds bytes (which JSON must show as hex, not base64)."""
    if isinstance(event, BlockStored | BlockRemoved):
        if bytes in set(map(type, event.block_hashes)):
            return True
        if isinstance(event, BlockStored):
            if isinstance(event.parent_block_hash, bytes):
                return True
            if event.extra_keys is not None and _deep_bytes(event.extra_keys):
                return True
            if isinstance(event.lora_name, dict) and _deep_bytes(event.lora_name):
                return True
            if event.lookahead_token_ids is not None and _deep_bytes(event.lookahead_token_ids):
                return True
            if event.cache_salt is not None and _deep_bytes(event.cache_salt):
                return True
    return False


def batch_records(item: ReplayBatch, hash_format: HashFormat = "str") -> list[dict[str, object]]:
    """Return the JSON objects of a replayed batch's selected events.

    Args:
        item: The replayed batch.
        hash_format: How int hashes are written.

    Returns:
        One dict per selected event.
    """
    msg = item.message
    ts = item.batch.ts if item.batch is not None else None
    return [
        event_record(
            seq=msg.seq,
            ts=ts,
            log_time=msg.log_time,
            channel=msg.channel.name,
            dp_rank=item.dp_rank,
            event=ev,
            hash_format=hash_format,
        )
        for ev in item.events
    ]


class JsonlWriter:
    """Writes one JSON object per event, one per line.

    Args:
        stream: The text stream (stdout).
        hash_format: How int hashes are written (default: decimal strings, exact in jq).
    """

    def __init__(self, stream: TextIO, *, hash_format: HashFormat = "str") -> None:
        self.stream = stream
        self.hash_format: HashFormat = hash_format
        self.lines = 0

    def write(self, item: ReplayBatch) -> None:
        """Write a replayed batch's selected events.

        Args:
            item: The replayed batch.
        """
        if not item.events:
            return
        recs = batch_records(item, self.hash_format)
        self.stream.write(_JSON.encode_lines(recs).decode())
        self.lines += len(recs)


class _Widths:
    """Column widths that only grow, so successive lines stay aligned.

    Attributes:
        w: Width per column name.
        tokens: Show the token count (dropped, for good, once a line would not fit).
    """

    def __init__(self, **minimum: int) -> None:
        self.w = dict(minimum)
        self.tokens = True

    def pad(self, name: str, text: str, *, right: bool = False) -> str:
        # Terminal cells, not characters: a wide character (CJK) takes two.
        n = cell_len(text)
        w = self.w[name] = max(self.w.get(name, 0), n)
        fill = " " * (w - n)
        return fill + text if right else text + fill


_MIN_HASH = 6
"""Fewest hash digits a narrow line shows (then ``…``): enough to find it in JSONL."""


def event_line(
    item: ReplayBatch,
    event: Event,
    *,
    multi_channel: bool = False,
    start_ns: int | None = None,
    hash_format: HashFormat = "str",
    widths: _Widths | None = None,
    width: int | None = None,
) -> Text:
    """Return one human-readable line for an event, every string from the file printable.

    Args:
        item: The batch it belongs to.
        event: The event.
        multi_channel: Show the channel name (when several are replayed).
        start_ns: Receive time of the replay's first message (the time column counts from
            it, as ``--since`` does); None: from this batch.
        hash_format: How the first block hash is shown (as in JSONL).
        widths: Column widths shared by the lines of one replay.
        width: Fit the line in this many columns if it can: the token count goes first
            (for the rest of the replay, so the columns stay aligned), then the first hash
            is shortened to a prefix, then left out. None: no limit.

    Returns:
        A line like ``0.063s  seq 12  r0  BlockStored  g1  sliding_window  w64  3 blocks
        48 tokens  hash 7164749364908172018``.
    """
    wd = widths if widths is not None else _Widths()
    msg = item.message
    t = (msg.log_time - (start_ns if start_ns is not None else msg.log_time)) / 1e9
    parts: list[tuple[str, str] | str] = [
        (wd.pad("time", f"{t:.3f}s", right=True), "dim"),
        "  ",
        ("seq ", "dim"),
        wd.pad("seq", str(msg.seq)),
    ]
    if multi_channel:
        parts += ["  ", (wd.pad("channel", printable(msg.channel.name)), "dim")]
    rank = "-" if item.dp_rank is None else str(item.dp_rank)
    parts += ["  ", (wd.pad("rank", f"r{rank}"), "dim"), "  "]
    tag = printable(event_type(event))
    if not isinstance(event, BlockStored | BlockRemoved):
        parts.append((tag, "magenta"))  # the last column: never padded
        return Text.assemble(*parts)
    grp = wd.pad("group", f"g{event.group_idx}" if event.group_idx is not None else "g-")
    hashes = event.block_hashes
    n = len(hashes)
    blocks = f"{wd.pad('blocks', str(n), right=True)} {'block' if n == 1 else 'blocks'}"
    # "1 block" is a column shorter than "2 blocks": what follows starts one further on.
    after = " " if n == 1 else ""
    tokens = ""
    if isinstance(event, BlockStored):
        kind = event.kv_cache_spec_kind
        win = event.kv_cache_spec_sliding_window
        kind_t = (
            (printable(kind_label(kind)), "cyan") if kind is not None else ("unannotated", "yellow")
        )
        win_s = f" w{win}" if win is not None else ""
        kw = wd.pad("kind", kind_t[0] + win_s)
        parts += [(wd.pad("type", tag), "green"), "  ", grp, "  "]
        parts += [(kind_t[0], kind_t[1]), kw[len(kind_t[0]) :], "  ", blocks]
        tokens = f"{after}  {wd.pad('tokens', str(len(event.token_ids)), right=True)} tokens"
    else:
        parts += [(wd.pad("type", tag), "red"), "  ", grp, "  ", blocks]
    line = Text.assemble(*parts)
    shown = str(format_hash(hashes[0], hash_format)) if hashes else ""
    # a 32-byte hash is 64 hex digits: its prefix is enough to find it in JSONL
    if len(shown) > 20:
        shown = shown[:16] + "…"
    if width is not None and tokens and line.cell_len + len(tokens) + 7 + len(shown) > width:
        wd.tokens = False
    if tokens and wd.tokens:
        line.append(tokens)
        after = ""
    if shown:
        label = f"{after}  hash "
        room = None if width is None else width - line.cell_len - len(label)
        if room is not None and room < len(shown):
            shown = shown[: room - 1] + "…" if room - 1 >= _MIN_HASH else ""
        if shown:
            line.append(label + shown)
    return line


class PrettyWriter:
    """Writes one coloured line per event to a rich console, columns aligned.

    Args:
        console: The stdout console.
        multi_channel: Show channel names.
        start_ns: Receive time of the replay's first message (time column origin).
        hash_format: How the first hash of each event is shown.
    """

    def __init__(
        self,
        console: Console,
        *,
        multi_channel: bool = False,
        start_ns: int | None = None,
        hash_format: HashFormat = "str",
    ) -> None:
        self.console = console
        self.multi_channel = multi_channel
        self.start_ns = start_ns
        self.hash_format: HashFormat = hash_format
        self.widths = _Widths(time=8, seq=5, rank=2, type=12, group=3, kind=18, blocks=2, tokens=3)
        self.lines = 0

    def write(self, item: ReplayBatch) -> None:
        """Write a replayed batch's selected events.

        Args:
            item: The replayed batch.
        """
        if self.start_ns is None:
            self.start_ns = item.message.log_time
        if item.error is not None:
            self.console.print(
                Text(f"seq {item.message.seq}: {printable(item.error)}", style="red"),
                highlight=False,
            )
            return
        for ev in item.events:
            self.console.print(
                event_line(
                    item,
                    ev,
                    multi_channel=self.multi_channel,
                    start_ns=self.start_ns,
                    hash_format=self.hash_format,
                    widths=self.widths,
                    width=self.console.width,
                ),
                highlight=False,
            )
            self.lines += 1


__all__ = [
    "HASH_FORMATS",
    "HashFormat",
    "JsonlWriter",
    "PrettyWriter",
    "batch_records",
    "event_line",
    "event_record",
    "format_hash",
]
