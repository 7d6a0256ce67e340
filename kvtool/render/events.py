"""Render replayed events as JSON lines (the machine format) or pretty lines (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

import msgspec
from rich.markup import escape

from kvtool.protocol import BlockRemoved, BlockStored, Event, event_to_builtins, event_type

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.replay import ReplayBatch

_JSON = msgspec.json.Encoder()


def event_record(
    *,
    seq: int,
    ts: float | None,
    log_time: int,
    channel: str,
    dp_rank: int | None,
    event: Event,
) -> dict[str, object]:
    """Return the JSON object of one event: context keys, then ``type`` and every field.

    Args:
        seq: The batch's seq.
        ts: The batch's ``ts`` (publisher clock, float seconds).
        log_time: Receive time, ns since the epoch.
        channel: The channel name.
        dp_rank: The batch's data-parallel rank.
        event: The event.

    Returns:
        ``{"seq", "ts", "log_time", "channel", "dp_rank", "type", field: value, …}``;
        int hashes stay ints, bytes hashes become lower-case hex strings.
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
    return False


def batch_records(item: ReplayBatch) -> list[dict[str, object]]:
    """Return the JSON objects of a replayed batch's selected events.

    Args:
        item: The replayed batch.

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
        )
        for ev in item.events
    ]


class JsonlWriter:
    """Writes one JSON object per event, one per line.

    Args:
        stream: The text stream (stdout).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lines = 0

    def write(self, item: ReplayBatch) -> None:
        """Write a replayed batch's selected events.

        Args:
            item: The replayed batch.
        """
        if not item.events:
            return
        recs = batch_records(item)
        self.stream.write(_JSON.encode_lines(recs).decode())
        self.lines += len(recs)


def _short_hash(h: object) -> str:
    if isinstance(h, bytes):
        return h.hex()[:12]
    if isinstance(h, int):
        return f"{h & 0xFFFFFFFFFFFFFFFF:016x}"[:12]
    return str(h)


def event_line(item: ReplayBatch, event: Event, *, multi_channel: bool = False) -> str:
    """Return one human-readable (rich markup) line for an event.

    Args:
        item: The batch it belongs to.
        event: The event.
        multi_channel: Show the channel name (when several are replayed).

    Returns:
        A line like ``seq 12  r0  BlockStored  g1 sliding_window w64  3 blocks 48 tokens``.
    """
    msg = item.message
    head = f"[dim]seq[/dim] {msg.seq:<6}"
    if multi_channel:
        head += f" [dim]{escape(msg.channel.name)}[/dim]"
    if item.dp_rank is not None:
        head += f" [dim]r{item.dp_rank}[/dim]"
    tag = event_type(event)
    if isinstance(event, BlockStored):
        kind = event.kv_cache_spec_kind
        kind_s = f"[cyan]{escape(kind)}[/cyan]" if kind else "[yellow]unannotated[/yellow]"
        win = event.kv_cache_spec_sliding_window
        win_s = f" w{win}" if win is not None else ""
        grp = f"g{event.group_idx}" if event.group_idx is not None else "g-"
        hashes = event.block_hashes
        first = f" {_short_hash(hashes[0])}…" if hashes else ""
        return (
            f"{head} [green]{tag:<16}[/green] {grp:<4} {kind_s}{win_s}  "
            f"{len(hashes)} blocks {len(event.token_ids)} tokens{first}"
        )
    if isinstance(event, BlockRemoved):
        grp = f"g{event.group_idx}" if event.group_idx is not None else "g-"
        hashes = event.block_hashes
        first = f" {_short_hash(hashes[0])}…" if hashes else ""
        return f"{head} [red]{tag:<16}[/red] {grp:<4} {len(hashes)} blocks{first}"
    return f"{head} [magenta]{tag}[/magenta]"


class PrettyWriter:
    """Writes one coloured line per event to a rich console.

    Args:
        console: The stdout console.
        multi_channel: Show channel names.
    """

    def __init__(self, console: Console, *, multi_channel: bool = False) -> None:
        self.console = console
        self.multi_channel = multi_channel
        self.lines = 0

    def write(self, item: ReplayBatch) -> None:
        """Write a replayed batch's selected events.

        Args:
            item: The replayed batch.
        """
        if item.error is not None:
            self.console.print(
                f"[red]seq {item.message.seq}: {escape(item.error)}[/red]", highlight=False
            )
            return
        for ev in item.events:
            self.console.print(
                event_line(item, ev, multi_channel=self.multi_channel), highlight=False
            )
            self.lines += 1


__all__ = ["JsonlWriter", "PrettyWriter", "batch_records", "event_line", "event_record"]
