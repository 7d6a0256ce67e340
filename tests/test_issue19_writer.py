"""Issue 19.4: the recording writer owns its MCAP records and leaves the mcap package alone.

kvtool's McapWriter (kvtool/recording/mcap_writer.py) writes, for the same calls, the bytes
mcap's own ``Writer`` writes with its defaults; a recording is read back by the official mcap
reader; importing and using kvtool's writer changes nothing in the ``mcap`` package.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from mcap.reader import make_reader
from mcap.writer import CompressionType, Writer

from kvtool.recording import format as fmt
from kvtool.recording.mcap_writer import McapWriter
from kvtool.recording.reader import open_recording
from kvtool.recording.writer import RecordingWriter
from tests.conftest import capture_messages

MCAP_COMPRESSION = {
    "zstd": CompressionType.ZSTD,
    "lz4": CompressionType.LZ4,
    "": CompressionType.NONE,
}


def _calls(w: Writer | McapWriter, payloads: list[bytes]) -> None:
    """The same calls, in the order a recorder makes them, on either writer."""
    w.start(profile=fmt.PROFILE, library="kvtool test")
    sid = w.register_schema(fmt.SCHEMA_NAME, fmt.SCHEMA_ENCODING, fmt.SCHEMA_DATA)
    w.add_metadata(fmt.META_RECORDING, {"format_version": "1"})
    a = w.register_channel("tcp://127.0.0.1:5557", fmt.MESSAGE_ENCODING, sid, {"endpoint": "a"})
    w.add_metadata(fmt.META_CHANNEL, {"id": str(a)})
    for i, data in enumerate(payloads):
        if i == len(payloads) // 3:
            b = w.register_channel("tcp://127.0.0.1:5558", fmt.MESSAGE_ENCODING, sid, {})
        if i == len(payloads) // 2:
            w.flush()
            w.add_metadata(fmt.META_SEQ, {"seq": str(i)})
        # Log times not in order, on two channels: the indexes and statistics see both.
        ch = b if i >= len(payloads) // 3 and i % 2 else a
        w.add_message(ch, 1_000_000 + (i * 7919) % 5000, data, 2_000 + i, i & 0xFFFFFFFF)
    w.add_metadata(fmt.META_GAPS, {"ledger": "{}"})
    w.finish()


@pytest.mark.parametrize("compression", ["zstd", "lz4", ""])
@pytest.mark.parametrize("chunk_size", [1, 4096, 1024 * 1024])
def test_same_bytes_as_mcaps_writer(compression: str, chunk_size: int) -> None:
    payloads = [p for _t, _s, p in capture_messages("gemma3")] * 3
    ours, theirs = io.BytesIO(), io.BytesIO()
    _calls(McapWriter(ours, chunk_size=chunk_size, compression=compression), payloads)
    _calls(
        Writer(theirs, chunk_size=chunk_size, compression=MCAP_COMPRESSION[compression]), payloads
    )
    assert ours.getvalue() == theirs.getvalue()


def test_no_message_file_same_bytes_as_mcaps_writer() -> None:
    # Schema and channel wait in the open chunk; with no message they appear only in the summary.
    ours, theirs = io.BytesIO(), io.BytesIO()
    _calls(McapWriter(ours, chunk_size=1024, compression="zstd"), [])
    _calls(Writer(theirs, chunk_size=1024), [])
    assert ours.getvalue() == theirs.getvalue()


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_official_reader_reads_a_recording(tmp_path: Path, compression: str) -> None:
    msgs = capture_messages("gemma3")
    # Zeros past the reader's ratio bound: that chunk is stored in raw blocks.
    bomb = b"\x00" * (4 * 1024 * 1024)
    path = tmp_path / "r.mcap"
    with RecordingWriter(path, compression=compression, chunk_size=64 * 1024) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for i, (_t, seq, payload) in enumerate(msgs):
            w.write(ch, seq, payload, 1_000 + i)
        w.write(ch, 10**6, bomb, 10**6)
    want = [p for _t, _s, p in msgs] + [bomb]
    with path.open("rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None and summary.statistics is not None
        assert summary.statistics.message_count == len(want)
        got = [m.data for _s, _c, m in reader.iter_messages(log_time_order=False)]
    assert got == want
    with open_recording(path) as r:
        assert [m.data for m in r.messages()] == want
        assert r.recovery.complete, r.recovery.summary()
    if compression == "zstd":
        # The bomb's chunk is a standard zstd frame that zstandard reads back.
        assert (
            zstandard.ZstdDecompressor()
            .decompress(_raw_frame_of(path, bomb), max_output_size=len(bomb) + 1024)
            .endswith(bomb)
        )


def _raw_frame_of(path: Path, marker: bytes) -> bytes:
    """The compressed data of the largest chunk of ``path`` (the one holding ``marker``)."""
    with path.open("rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None
        idx = max(summary.chunk_indexes, key=lambda c: c.uncompressed_size)
        assert idx.uncompressed_size > len(marker)
    data = path.read_bytes()
    # Chunk record body: 3x u64, u32 crc, string compression, u64 length, data.
    body = idx.chunk_start_offset + 9 + 8 * 3 + 4
    (clen,) = memoryview(data)[body : body + 4].cast("I")
    start = body + 4 + clen + 8
    return data[start : start + idx.compressed_size]


CHECK_MCAP_UNTOUCHED = r"""
import json, sys
import mcap, mcap.writer, mcap.records, mcap.data_stream
mods = {m.__name__: m for m in (mcap, mcap.writer, mcap.records, mcap.data_stream)}
before = {n: dict(vars(m)) for n, m in mods.items()}
zstd, lz4 = mcap.writer.zstandard, mcap.writer.lz4
import kvtool.recording.writer
from kvtool.recording.writer import RecordingWriter
for comp in ("zstd", "lz4", "none"):
    with RecordingWriter(sys.argv[1] + comp, compression=comp) as w:
        w.write(w.add_channel("tcp://127.0.0.1:1"), 0, b"\x00" * 2_000_000, 1)
missing = object()
changed = sorted(
    f"{n}.{k}" for n, m in mods.items() for k in set(before[n]) | set(vars(m))
    if before[n].get(k, missing) is not vars(m).get(k, missing)
)
print(json.dumps({
    "same_zstandard": mcap.writer.zstandard is zstd,
    "same_lz4": mcap.writer.lz4 is lz4,
    "changed": changed,
}))
"""


def test_importing_the_writer_leaves_mcap_untouched(tmp_path: Path) -> None:
    # A fresh interpreter: mcap imported first, then kvtool's writer imported and used.
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_MCAP_UNTOUCHED, str(tmp_path / "r")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == {"same_zstandard": True, "same_lz4": True, "changed": []}


def test_the_writer_reads_no_private_mcap_names() -> None:
    # No ``_Writer__`` name mangling, no library internals (``_buffer``, ``_chunk_builder``).
    src = (Path(__file__).parent.parent / "kvtool" / "recording").glob("*.py")
    text = "\n".join(p.read_text() for p in src)
    private_names = ("_Writer__", "._buffer", "_chunk_builder")
    for private in (*private_names, "import mcap.writer", "from mcap.writer"):
        assert private not in text, private
