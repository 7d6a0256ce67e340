"""What a recording reader hands out: channels, recorded messages, the recovery report."""

from __future__ import annotations

import msgspec

from kvtool.text import plural


class ChannelInfo(msgspec.Struct, frozen=True):
    """One channel of a recording: one (endpoint, topic) of one publisher.

    Attributes:
        id: MCAP channel id (unique within one file).
        name: MCAP channel topic (``endpoint`` or ``endpoint#topic``).
        endpoint: ZeroMQ endpoint the messages came from.
        topic: ZeroMQ topic.
        dp_rank: Data-parallel rank, when known.
        path: The recording the channel belongs to.
    """

    id: int
    name: str
    endpoint: str
    topic: str
    dp_rank: int | None
    path: str = ""


# Stands for "no channel yet" in the fast path of the chunk reader; never yielded.
_NO_CHANNEL = ChannelInfo(id=-1, name="", endpoint="", topic="", dp_rank=None)


class RecordedMessage(msgspec.Struct, frozen=True):
    """One recorded ZeroMQ message.

    Attributes:
        channel: Where it came from.
        seq: The publisher's sequence number (unwrapped past 32 bits).
        log_time: Receive time, ns since the epoch.
        publish_time: The batch's ``ts`` in ns, or the receive time.
        data: The msgpack payload, byte for byte as received.
        offset: File offset of the chunk (or record) that holds it.
    """

    channel: ChannelInfo
    seq: int
    log_time: int
    publish_time: int
    data: bytes
    offset: int


NOT_READ_YET = "its messages have not been read yet"
"""A reader's :attr:`recovery` before its messages are read: not known to be complete."""


class RecoveryReport(msgspec.Struct):
    """What a read of a recording got back, and what it could not.

    Attributes:
        path: The recording.
        complete: True when the file is intact: data section, summary, footer and
            trailing magic, and no chunk or record was damaged.
        truncated: True when the file ends before its footer (the writer died).
        messages: Messages read back.
        last_good_offset: End of the last record read intact.
        file_size: Size of the file.
        damaged_chunks: Chunks skipped because they failed to decompress or check.
        reason: What went wrong first (truncation or damage), or None.
        skipped_channels: Channels that are not KV-event channels (other encoding or
            schema) and were skipped.
        damaged_records: Other records (or stretches of bytes) skipped as damaged.
        skipped_bytes: Bytes skipped while searching for the next intact record.
        first_damage_offset: File offset of the first damage, or None.
        data_complete: The data section was read to its end with nothing skipped, so
            every message in the file was read (only the index or footer is damaged).
        expected_messages: The message count the file's summary states, when readable.
        skipped_messages: Messages on skipped (foreign) channels.
        unknown_channel_messages: Messages whose channel record was lost; they are
            returned on a placeholder channel.
        seq_first: Seq of the first message read, when all messages are on one channel.
        seq_last: Seq of the last message read, when all are on one channel.
        stop_reason: Why the scan stopped before the data section's end, or None.
    """

    path: str
    complete: bool = True
    truncated: bool = False
    messages: int = 0
    last_good_offset: int = 0
    file_size: int = 0
    damaged_chunks: int = 0
    reason: str | None = None
    skipped_channels: int = 0
    damaged_records: int = 0
    skipped_bytes: int = 0
    first_damage_offset: int | None = None
    data_complete: bool = False
    expected_messages: int | None = None
    skipped_messages: int = 0
    unknown_channel_messages: int = 0
    seq_first: int | None = None
    seq_last: int | None = None
    stop_reason: str | None = None

    @property
    def read(self) -> bool:
        """True once the messages were read to the end (before that nothing is known)."""
        return self.reason != NOT_READ_YET

    @property
    def damaged(self) -> bool:
        """True when anything in the file could not be read (False until it was read)."""
        return self.read and not self.complete

    @property
    def lost_messages(self) -> int | None:
        """Messages the summary counts but the scan did not return, when known."""
        if self.expected_messages is None:
            return None
        return max(0, self.expected_messages - self.messages - self.skipped_messages)

    def summary(self) -> str:
        """One line a person can act on: the file, where it broke, what was recovered.

        Returns:
            ``path: complete, N messages`` or ``path: …; recovered N messages …``.
        """
        if self.complete:
            return f"{self.path}: complete, {plural(self.messages, 'message')}"
        seqs = ""
        # A seq range reads as "everything in between": only when nothing is missing
        # inside it (a clean prefix, or the whole data section).
        if self.seq_first is not None and self.messages and self.damaged_chunks == 0:
            seqs = f" (seq {self.seq_first}-{self.seq_last})"
        if self.data_complete:
            return (
                f"{self.path}: {self.reason or 'index damaged'}; the data section is intact "
                f"and {'the' if self.messages == 1 else 'all'} "
                f"{plural(self.messages, 'message')} {'was' if self.messages == 1 else 'were'} "
                f"read{seqs}"
            )
        parts = [f"{self.path}:"]
        if self.truncated:
            parts.append(
                f"recording is truncated at byte {self.last_good_offset} of {self.file_size}"
                f" ({self.stop_reason or self.reason or 'no footer'});"
            )
            if self.damaged_chunks or self.damaged_records:
                parts.append(f"{self._damage_text()} before that;")
        else:
            parts.append(f"{self._damage_text()} (first: {self.reason});")
        lost = self.lost_messages
        if lost is not None:
            parts.append(
                f"recovered {self.messages:,} of {plural(self.expected_messages or 0, 'message')}"
                f"{seqs};"
            )
            parts.append(f"{lost:,} lost" if lost else "none lost")
        elif self.truncated:
            parts.append(f"recovered {plural(self.messages, 'message')}{seqs}; the rest is lost")
        else:
            parts.append(
                f"recovered {plural(self.messages, 'message')}{seqs}; the messages in the "
                "damaged part are lost"
            )
        return " ".join(parts)

    def _damage_text(self) -> str:
        bits = []
        if self.damaged_chunks:
            bits.append(plural(self.damaged_chunks, "damaged chunk"))
        if self.damaged_records:
            bits.append(plural(self.damaged_records, "damaged record"))
        text = " and ".join(bits) or "damaged data"
        if self.skipped_bytes:
            text += f" ({self.skipped_bytes:,} bytes) skipped"
        else:
            text += " skipped"
        return text
