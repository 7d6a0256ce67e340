"""The chunks of a recording: a chunk opened (bounded, CRC-checked, decompressed) and its messages.

:class:`ChunkReader` is the second layer of :class:`kvtool.recording.reader.RecordingReader`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import zstandard

from kvtool.recording import format as fmt
from kvtool.recording.messages import _NO_CHANNEL, RecordedMessage, RecoveryReport
from kvtool.recording.records import (
    _BATCH,
    _CHUNK,
    _CHUNK_FIXED,
    _MSG,
    _MSG_REC,
    _REC,
    _WRAP_FROM,
    _WRAP_TO,
    OP_CHANNEL,
    OP_MESSAGE,
    OP_SCHEMA,
    RecordParser,
    _Damage,
    _decompress,
    crc32,
)


class ChunkReader(RecordParser):
    """A :class:`~kvtool.recording.records.RecordParser` that also opens chunks.

    A chunk is bounded from its header, CRC-checked once, decompressed, and its messages
    handed out in lists of at most a few hundred.
    """

    def _open_chunk(
        self, pos: int, ln: int, limit: int, *, want: bool
    ) -> tuple[bytes | None, int, bool, int]:
        """Check the chunk at ``pos`` and decompress its records.

        Returns:
            The records (None unless ``want``), the chunk's end, a flag set when the
            record length disagrees with the chunk's inner lengths (one of them is
            damaged), and the chunk's stored records length.
        """
        body_at = pos + _REC.size
        head = self._pread(body_at, _CHUNK.size + 4 + 16 + 8)
        if len(head) < _CHUNK.size + 4:
            raise _Damage(f"chunk at byte {pos} runs past the end of the file")
        _start, _end, usize, crc = _CHUNK.unpack_from(head)
        (clen,) = struct.unpack_from("<I", head, _CHUNK.size)
        if clen > 16 or len(head) < _CHUNK.size + 4 + clen + 8:
            raise _Damage(f"chunk at byte {pos} has a damaged header")
        try:
            compression = head[_CHUNK.size + 4 : _CHUNK.size + 4 + clen].decode("ascii")
        except UnicodeDecodeError:
            raise _Damage(f"chunk at byte {pos} has a damaged header") from None
        (n,) = struct.unpack_from("<Q", head, _CHUNK.size + 4 + clen)
        true_end = body_at + _CHUNK_FIXED + clen + n
        outer_end = body_at + ln
        mismatch = true_end != outer_end
        if mismatch:
            # The record length and the records length disagree: follow whichever one
            # leads to an intact-looking next record.
            outer_n = ln - _CHUNK_FIXED - clen
            if outer_end <= limit and outer_n >= 0 and self._plausible(outer_end):
                n, true_end = outer_n, outer_end
            elif true_end > limit or not self._plausible(true_end):
                raise _Damage(
                    f"chunk at byte {pos} runs past the end of the file"
                    if outer_end > limit and true_end > limit
                    else f"chunk at byte {pos} has a damaged length"
                )
        if true_end > limit or n > fmt.MAX_RECORD_BYTES:
            raise _Damage(f"chunk at byte {pos} runs past the end of the file")
        if compression not in fmt.COMPRESSIONS:
            raise _Damage(
                f"chunk at byte {pos} uses compression {compression!r}, which this kvtool "
                "cannot read",
                true_end,
            )
        # Bound what decompression may produce before producing any of it: a few
        # kilobytes of zstd can claim gigabytes of zeros (issue 8.10).
        if usize > fmt.chunk_size_limit(compression, n):
            raise _Damage(
                f"chunk at byte {pos} states {usize} uncompressed bytes from {n} stored "
                f"(more than {fmt.chunk_size_limit(compression, n)} allowed); skipped as a "
                "decompression bomb",
                true_end,
            )
        if not want:
            return None, true_end, mismatch, n
        data = self._pread(body_at + _CHUNK_FIXED + clen, n)
        if compression == "zstd" and self._zstd is None:
            self._zstd = zstandard.ZstdDecompressor()
        try:
            records = _decompress(compression, data, usize, self._zstd)
        except Exception as err:  # any decompressor failure is damage
            raise _Damage(
                f"chunk at byte {pos} does not decompress ({type(err).__name__}: {err})",
                true_end,
            ) from None
        if len(records) != usize:
            raise _Damage(f"chunk at byte {pos} decompresses to the wrong size", true_end)
        # Checked once, here, before any of the chunk's records is read.
        if crc and crc32(records) != crc:
            raise _Damage(f"chunk at byte {pos} fails its CRC check", true_end)
        return records, true_end, mismatch, n

    def _chunk_messages(
        self,
        records: bytes,
        pos: int,
        end: int,
        stored: int,
        rep: RecoveryReport,
        seen: set[int],
    ) -> Iterator[list[RecordedMessage]]:
        """Yield the messages of one decompressed chunk in lists, one record at a time.

        Nothing is built for the whole chunk: a list holds at most :data:`_BATCH`
        messages, so memory stays at the chunk's bytes plus a part of its messages (a
        list of them never holds more bytes than the chunk). Zero bytes where a record
        should start, a record that runs past the chunk, or more records than the
        chunk's stored size allows (:func:`~kvtool.recording.format.chunk_record_limit`)
        end the chunk as damage after the messages before it were yielded. The messages
        yielded are counted in ``rep`` (count, first and last seq) and their channels
        added to ``seen``.

        A message record that is whole, within the record budget and on a channel
        already defined takes a fast path (one unpack, the channel's seq state held in
        locals); every other record takes the general path, which makes every check in
        its order. Both do the same to a record that the fast path takes.

        Raises:
            _Damage: The chunk's records are damaged from some point on.
        """
        rpos = 0
        total = len(records)
        unpack = _REC.unpack_from
        unpack_msg = _MSG_REC.unpack_from
        head = _MSG_REC.size
        budget = fmt.chunk_record_limit(stored)
        count = 0
        fast_end = total - head
        channels = self.channels
        placeholders = self._placeholders
        seq_state = self._seq_state
        # The channel whose seq unwrap state is held in (high, last) instead of
        # seq_state; -1 for none. Written back before the general path runs.
        cur = -1
        cur_ch = _NO_CHANNEL
        high, last = 0, -1
        n = first = seq = 0
        out: list[RecordedMessage] = []
        put = out.append
        flush_at = _BATCH
        try:
            while rpos < total:
                if rpos <= fast_end and count < budget:
                    op, rln, cid, seq32, log_time, publish_time = unpack_msg(records, rpos)
                    rend = rpos + _REC.size + rln
                    if op == OP_MESSAGE and rln >= _MSG.size and rend <= total:
                        if cid != cur:
                            if cur >= 0:
                                seq_state[cur] = (high, last)
                                cur = -1
                            ch = channels.get(cid)
                            if ch is not None and cid not in placeholders:
                                cur, cur_ch = cid, ch
                                high, last = seq_state.get(cid, (0, -1))
                                seen.add(cid)
                        if cid == cur:
                            count += 1
                            # The unwrap of :meth:`_message`.
                            if last >= _WRAP_FROM and seq32 < _WRAP_TO:
                                high += 1 << 32
                            elif seq32 < last:
                                high = 0
                            last = seq32
                            seq = high + seq32
                            if not n:
                                first = seq
                            n += 1
                            put(
                                RecordedMessage(
                                    cur_ch,
                                    seq,
                                    log_time,
                                    publish_time,
                                    records[rpos + head : rend],
                                    pos,
                                )
                            )
                            rpos = rend
                            if n >= flush_at:
                                flush_at += _BATCH
                                yield out
                                out = []
                                put = out.append
                            continue
                if cur >= 0:
                    seq_state[cur] = (high, last)
                    cur = -1
                if rpos + _REC.size > total:
                    raise struct.error("record header runs past the end of the chunk")
                op, rln = unpack(records, rpos)
                if op == 0:
                    # Opcode 0 is no MCAP record: zero fill or garbage. Walking it nine
                    # bytes at a time is how 2 GiB of zeros cost 80 s (issue 8.10).
                    raise struct.error(f"zero bytes where a record should start (+{rpos})")
                count += 1
                if count > budget:
                    raise struct.error(
                        f"more than {budget} records for its {stored} stored bytes; the "
                        "rest is skipped"
                    )
                start = rpos + _REC.size
                rend = start + rln
                if rend > total:
                    raise struct.error("record runs past the end of the chunk")
                if op == OP_MESSAGE:
                    m = self._message(records, start, rend, pos)
                    if m is not None:
                        seen.add(m.channel.id)
                        seq = m.seq
                        if not n:
                            first = seq
                        n += 1
                        put(m)
                        if n >= flush_at:
                            flush_at += _BATCH
                            yield out
                            out = []
                            put = out.append
                elif op == OP_CHANNEL:
                    self._channel(records[start:rend])
                elif op == OP_SCHEMA:
                    self._schema(records[start:rend])
                rpos = rend
        except (struct.error, UnicodeDecodeError, ValueError) as err:
            # A chunk without a CRC whose records do not parse: what came before is kept.
            if out:
                yield out
            raise _Damage(f"chunk at byte {pos} holds a damaged record ({err})", end) from None
        else:
            if out:
                yield out
        finally:
            if cur >= 0:
                seq_state[cur] = (high, last)
            if n:
                rep.messages += n
                if rep.seq_first is None:
                    rep.seq_first = first
                rep.seq_last = seq
