"""The read path of a report (issue 10): the fast paths read exactly what the general ones do."""

from __future__ import annotations

import os
import random
import struct
import zlib
from pathlib import Path

import msgspec
import pytest
import zstandard

from kvtool.columns import ReadStats, iter_raw_chunks
from kvtool.inputs import MergeFindings, _merge_heap, merge_messages
from kvtool.recording import RecordedMessage, open_recording

# The chunk path: its message struct, CRC and decompression (read there, patched there).
from kvtool.recording import chunks as reader_mod
from tests import mcapbytes as mb

RECORDINGS = Path(__file__).parent.parent / "recordings"


def _tricky() -> bytes:
    """Two channels interleaved in chunks, a wrap, a restart, a seq note, a channel record
    inside a chunk, a message on a channel never defined, and a damaged tail."""
    head = (
        mb.kvtool_context(),
        mb.schema(),
        mb.channel(1),
        mb.channel(2, dp_rank="1", endpoint="tcp://127.0.0.1:5558"),
    )
    inter = b"".join(mb.message(i, b"x" * (i % 7), cid=1 + i % 2) for i in range(40))
    wrap = b"".join(
        mb.message(s, b"w", cid=1) for s in [2**32 - 3, 2**32 - 2, 2**32 - 1, 0, 1, 2, 0, 5]
    )
    late = (
        mb.message(1, b"a", cid=3)
        + mb.channel(3, endpoint="tcp://127.0.0.1:5559")
        + mb.message(2, b"b", cid=3)
        + mb.message(9, b"u", cid=7)
        + mb.message(3, b"c", cid=1)
    )
    return mb.recording(
        *head,
        mb.chunk(inter),
        mb.chunk(wrap),
        mb.metadata("kvtool.seq", {"channel": 1, "seq": 2**33 + 5}),
        mb.chunk(wrap, crc=False),
        mb.chunk(late),
        mb.chunk(inter, compression=""),
        mb.chunk(mb.message(1) + mb.message(2)[:20], crc=False),
        mb.chunk(mb.message(3) * 2000),
        mb.chunk(mb.message(4)),
    )


def _read_all(path: Path) -> tuple[list[tuple[object, ...]], dict[str, object]]:
    with open_recording(path) as r:
        got = [
            (
                msgspec.structs.astuple(m.channel),
                m.seq,
                m.log_time,
                m.publish_time,
                m.data,
                m.offset,
            )
            for m in r.messages()
        ]
        return got, msgspec.structs.asdict(r.recovery)


def test_issue10_read_fast_path_reads_what_the_general_path_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tricky.mcap"
    path.write_bytes(_tricky())
    fast, fast_rep = _read_all(path)
    # A message header longer than any chunk sends every record down the general path.
    monkeypatch.setattr(reader_mod, "_MSG_REC", struct.Struct("<BQHIQQ" + "x" * 100_000))
    slow, slow_rep = _read_all(path)
    assert fast == slow and fast_rep == slow_rep
    seqs = [s for _c, s, *_ in fast]
    assert 2**32 + 2 in seqs and 2**33 + 2**32 - 3 in seqs  # a wrap and the note applied
    assert fast_rep["unknown_channel_messages"] == 3  # channel 3 was defined too late
    assert fast_rep["damaged_chunks"] == 2


@pytest.mark.parametrize("seed", range(40))
def test_issue10_read_fast_path_on_damaged_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rnd = random.Random(seed)
    data = bytearray(_tricky())
    for _ in range(rnd.randint(1, 4)):
        data[rnd.randrange(len(data))] = rnd.randrange(256)
    path = tmp_path / "hurt.mcap"
    path.write_bytes(bytes(data))
    try:
        fast = _read_all(path)
    except Exception as err:
        fast = (type(err), str(err))  # type: ignore[assignment]
    monkeypatch.setattr(reader_mod, "_MSG_REC", struct.Struct("<BQHIQQ" + "x" * 100_000))
    try:
        slow = _read_all(path)
    except Exception as err:
        slow = (type(err), str(err))  # type: ignore[assignment]
    assert fast == slow


def test_issue10_read_crc_is_zlibs_crc32() -> None:
    rnd = random.Random(5)
    for n in (0, 1, 7, 64, 4095, 65_537, 1 << 20):
        buf = rnd.randbytes(n)
        assert reader_mod.crc32(buf) == zlib.crc32(buf)


def test_issue10_read_one_decompressor_per_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = []
    real = zstandard.ZstdDecompressor

    def counting() -> zstandard.ZstdDecompressor:
        made.append(1)
        return real()

    monkeypatch.setattr(zstandard, "ZstdDecompressor", counting)
    data = mb.recording(
        mb.kvtool_context(),
        mb.schema(),
        mb.channel(),
        *(mb.chunk(mb.message(i)) for i in range(20)),
    )
    path = tmp_path / "many.mcap"
    path.write_bytes(data)
    with open_recording(path) as r:
        assert [m.seq for m in r.messages()] == list(range(20))
    assert len(made) == 1


def test_issue10_read_single_input_merge_is_the_heap_merge(tmp_path: Path) -> None:
    path = tmp_path / "tricky.mcap"
    path.write_bytes(_tricky())
    with open_recording(path) as a, open_recording(path) as b:
        fast = list(merge_messages([a.messages()]))
        heap = list(_merge_heap([b.messages()], MergeFindings()))
    assert [i for i, _ in fast] == [0] * len(fast)
    assert fast == heap
    assert len({m.channel.id for _, m in fast}) > 1


def test_issue10_read_raw_chunks_count_as_they_go(tmp_path: Path) -> None:
    # ``stats`` holds the messages and bytes of every chunk yielded so far.
    path = RECORDINGS / "gemma3.mcap"
    st = ReadStats()
    seen = msgs = 0
    for raw in iter_raw_chunks([path], stats=st, chunk_bytes=3000):
        msgs += len(raw.data)
        seen += raw.bytes
        assert raw.bytes == sum(len(d) for d in raw.data)
        assert (st.messages, st.payload_bytes) == (msgs, seen)
    with open_recording(path) as r:
        every: list[RecordedMessage] = list(r.messages())
    assert st.messages == len(every) and st.payload_bytes == sum(len(m.data) for m in every)
    assert os.path.getsize(path) > 0


def _by_message(path: Path, chunk_bytes: int) -> list[tuple[list[object], ...]]:
    """The raw chunks as a message-by-message fill makes them (the reference)."""
    out: list[tuple[list[object], ...]] = []
    ids: dict[tuple[str, str, int | None], int] = {}
    cols: tuple[list[object], ...] = ([], [], [], [], [])
    size = 0
    with open_recording(path) as r:
        for m in r.messages():
            ch = m.channel
            cid = ids.setdefault((ch.endpoint, ch.topic, ch.dp_rank), len(ids))
            for col, v in zip(cols, (m.log_time, m.seq, cid, ch.dp_rank, m.data), strict=True):
                col.append(v)
            size += len(m.data)
            if size >= chunk_bytes:
                out.append(cols)
                cols, size = ([], [], [], [], []), 0
    if cols[0]:
        out.append(cols)
    return out


@pytest.mark.parametrize("chunk_bytes", [1, 7, 100, 3000, 1 << 30])
def test_issue10_read_raw_chunks_end_where_a_message_by_message_fill_ends(
    tmp_path: Path, chunk_bytes: int
) -> None:
    path = tmp_path / "tricky.mcap"
    path.write_bytes(_tricky())
    for p in (path, RECORDINGS / "gemma3.mcap"):
        got = [
            (raw.log_time, raw.seq, raw.channel_id, raw.dp_rank, raw.data)
            for raw in iter_raw_chunks([p], chunk_bytes=chunk_bytes)
        ]
        assert got == _by_message(p, chunk_bytes)


def _streamed(data: bytes, size: int) -> bytes | str:
    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as r:
            return bytes(r.read(size + 1))
    except zstandard.ZstdError as err:
        return f"ZstdError: {err}"


def _one_shot_or_streamed(data: bytes, size: int) -> bytes | str:
    try:
        return reader_mod._decompress("zstd", data, size, zstandard.ZstdDecompressor())
    except zstandard.ZstdError as err:
        return f"ZstdError: {err}"


def test_issue10_read_zstd_one_shot_only_when_the_frame_states_the_chunk_size() -> None:
    recs = b"".join(mb.message(i, bytes(range(256)) * 3) for i in range(30))
    z = zstandard.ZstdCompressor(write_content_size=True).compress(recs)
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(recs)
    flipped = bytearray(z)
    flipped[len(z) // 2] ^= 0xFF
    cases = [
        (z, len(recs)),
        (z, len(recs) - 10),  # the frame states more than the chunk: streamed, bounded
        (z, len(recs) + 10),
        (z[: len(z) // 2], len(recs)),  # cut: the streaming read says what it got
        (bytes(flipped), len(recs)),
        (z + z, len(recs)),
        (z + b"junk", len(recs)),
        (no_size, len(recs)),
        (mb.zstd_zeros(1 << 24), 1000),  # a bomb stating nothing reads 1001 bytes
    ]
    for data, size in cases:
        assert _one_shot_or_streamed(data, size) == _streamed(data, size)


def test_issue10_read_selection_counts_what_it_leaves_out_as_it_goes(tmp_path: Path) -> None:
    from kvtool.replay import BatchFilter

    path = tmp_path / "tricky.mcap"
    path.write_bytes(_tricky())
    first, last, chunk_bytes = 5, 30, 4
    expected: list[tuple[list[int], int]] = []
    seqs: list[int] = []
    left_out = size = 0
    with open_recording(path) as r:
        for m in r.messages():
            if not first <= m.seq <= last:
                left_out += 1
                continue
            seqs.append(m.seq)
            size += len(m.data)
            if size >= chunk_bytes:
                expected.append((seqs, left_out))
                seqs, size = [], 0
    st = ReadStats()
    got = [
        (raw.seq, st.unselected)
        for raw in iter_raw_chunks(
            [path],
            stats=st,
            chunk_bytes=chunk_bytes,
            select=BatchFilter(seq_first=first, seq_last=last),
        )
    ]
    assert got[: len(expected)] == expected and len(got) >= len(expected)
