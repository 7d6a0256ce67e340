"""The damaged-file ladder (STYLE rule 9c, issue 5 "Damaged recordings").

Every intact message is read back, damage is counted and named (file, byte offset,
what was recovered), and nothing but a ``KvtoolError`` ever comes out.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest
import zstandard

from kvtool.errors import KvtoolError, TruncatedRecording
from kvtool.recording import RecordedMessage, RecordingWriter, RecoveryReport, open_recording
from tests import mcapbytes as mb
from tests.conftest import capture_messages
from tests.recutil import chunk_bodies, write_capture

FOOTER_AT = 8 + 29  # footer record + trailing magic


def _read(path: Path) -> tuple[list[RecordedMessage], RecoveryReport]:
    with open_recording(path) as r:
        msgs = list(r.messages())
        return msgs, r.recovery


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, bytes]]]:
    """A small recording (many chunks) and what was written into it."""
    path = tmp_path_factory.mktemp("damaged") / "small.mcap"
    ledger: dict[str, object] = {"recovered": 0, "lost": 0, "lost_ranges": [], "restarts": 0}
    written = write_capture(path, "full_only", limit=24, chunk_size=1024, ledger=ledger)
    return path, written


def _chunk_seqs(path: Path) -> dict[int, list[int]]:
    """Chunk start offset → seqs of the messages it holds."""
    out: dict[int, list[int]] = {}
    for m in _read(path)[0]:
        out.setdefault(m.offset, []).append(m.seq)
    return out


def _expected_after_cut(path: Path, cut: int) -> list[int]:
    per_chunk = _chunk_seqs(path)
    seqs: list[int] = []
    for start, length in chunk_bodies(path):
        if start + length <= cut:
            seqs += per_chunk[start]
    return seqs


def _write(tmp_path: Path, data: bytes, name: str = "cut.mcap") -> Path:
    out = tmp_path / name
    out.write_bytes(data)
    return out


def test_small_recording_has_many_chunks(small: tuple[Path, list[tuple[int, bytes]]]) -> None:
    path, written = small
    assert len(chunk_bodies(path)) >= 8
    msgs, rep = _read(path)
    assert rep.complete and [(m.seq, m.data) for m in msgs] == written


def test_truncation_at_every_chunk_boundary(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, written = small
    data = path.read_bytes()
    payload = dict(written)
    for start, length in chunk_bodies(path):
        for cut in (start, start + length, start + length - 1, start + 1):
            msgs, rep = _read(_write(tmp_path, data[:cut]))
            expected = _expected_after_cut(path, cut)
            assert [m.seq for m in msgs] == expected, cut
            assert all(m.data == payload[m.seq] for m in msgs)
            assert rep.truncated and not rep.complete
            assert rep.last_good_offset <= cut
            text = rep.summary()
            assert text.startswith(f"{tmp_path / 'cut.mcap'}: recording is truncated at byte ")
            assert f"recovered {len(expected)} messages" in text
            assert text.endswith("the rest is lost")


def test_truncation_at_every_byte(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, _written = small
    data = path.read_bytes()
    bodies = chunk_bodies(path)
    per_chunk = _chunk_seqs(path)
    tail = len(data) - FOOTER_AT - 64
    # Every byte of the start (magic, header, metadata, first chunks) and of the end
    # (data end, summary, footer), every 7th in between; from the end down, truncating
    # one copy in place.
    cuts = {*range(1200), *range(1200, tail, 7), *range(tail, len(data) + 1)}
    q = _write(tmp_path, data)
    for cut in sorted(cuts, reverse=True):
        os.truncate(q, cut)
        try:
            msgs, rep = _read(q)
        except TruncatedRecording as err:
            assert cut <= 60, cut  # only inside the magic or the header
            assert f"{q}: recording is truncated at byte {cut}" in str(err)
            continue
        expected = [s for start, ln in bodies if start + ln <= cut for s in per_chunk[start]]
        assert [m.seq for m in msgs] == expected, cut
        assert rep.complete is (cut == len(data))
        if cut < len(data):
            assert rep.summary().startswith(f"{q}: ")


def test_cut_after_data_section_reads_everything(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, written = small
    data = path.read_bytes()
    (summary_start,) = struct.unpack_from("<Q", data, len(data) - FOOTER_AT + 9)
    msgs, rep = _read(_write(tmp_path, data[: summary_start + 10]))
    assert [m.seq for m in msgs] == [s for s, _ in written]
    assert rep.data_complete and not rep.complete and rep.truncated
    assert rep.summary() == (
        f"{tmp_path / 'cut.mcap'}: file ends after its data section; its summary and footer "
        f"are missing; the data section is intact and all {len(written)} messages were read "
        f"(seq 0-{len(written) - 1})"
    )


def test_byte_flip_inside_each_chunk_loses_only_that_chunk(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, written = small
    data = path.read_bytes()
    per_chunk = _chunk_seqs(path)
    all_seqs = [s for s, _ in written]
    for start, length in chunk_bodies(path):
        damaged = bytearray(data)
        damaged[start + length - 20] ^= 0x5A  # inside the compressed records
        msgs, rep = _read(_write(tmp_path, bytes(damaged)))
        lost = per_chunk[start]
        assert [m.seq for m in msgs] == [s for s in all_seqs if s not in lost]
        assert rep.damaged_chunks == 1 and not rep.complete and not rep.truncated
        assert rep.first_damage_offset == start
        assert rep.lost_messages == len(lost)
        assert rep.summary() == (
            f"{tmp_path / 'cut.mcap'}: 1 damaged chunk skipped (first: {rep.reason}); "
            f"recovered {len(all_seqs) - len(lost)} of {len(all_seqs)} messages; "
            f"{len(lost)} lost"
        )
        assert rep.reason is not None and f"chunk at byte {start}" in rep.reason


@pytest.mark.parametrize(
    ("field", "offset"),
    [
        ("record length", 1),
        ("record length high byte", 8),
        ("uncompressed size", 9 + 16),
        ("crc", 9 + 24),
        ("compression length", 9 + 28),
        ("records length", 9 + 36),
        ("opcode", 0),
    ],
)
def test_damaged_chunk_header_fields(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path, field: str, offset: int
) -> None:
    path, written = small
    data = path.read_bytes()
    bodies = chunk_bodies(path)
    start, _length = bodies[3]
    per_chunk = _chunk_seqs(path)
    damaged = bytearray(data)
    damaged[start + offset] ^= 0x40
    msgs, rep = _read(_write(tmp_path, bytes(damaged)))
    got = [m.seq for m in msgs]
    lost = set(per_chunk[start])
    # Everything outside the damaged chunk comes back, in order, unchanged.
    assert [s for s in (s for s, _ in written) if s not in lost] == [
        s for s in got if s not in lost
    ]
    assert all(m.data == dict(written)[m.seq] for m in msgs)
    assert not rep.complete and not rep.truncated, field
    assert rep.first_damage_offset is not None and rep.first_damage_offset <= start
    assert str(tmp_path / "cut.mcap") in rep.summary()


def test_random_byte_flips_never_crash_or_corrupt(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, written = small
    data = path.read_bytes()
    payload = dict(written)
    rng = random.Random(20261129)
    for _ in range(300):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 8))):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        q = _write(tmp_path, bytes(damaged))
        try:
            msgs, rep = _read(q)
        except KvtoolError as err:
            assert str(err).startswith(f"{q}: ")
            continue
        # CRCs guard the payloads: whatever is returned is byte-identical.
        assert all(m.data == payload.get(m.seq) for m in msgs)
        if rep.complete:
            assert len(msgs) == len(written)
        else:
            assert rep.summary().startswith(f"{q}: ")


def test_zeroed_summary(small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path) -> None:
    path, written = small
    data = bytearray(path.read_bytes())
    footer = len(data) - FOOTER_AT
    (summary_start,) = struct.unpack_from("<Q", data, footer + 9)
    data[summary_start:footer] = bytes(footer - summary_start)
    q = _write(tmp_path, bytes(data))
    msgs, rep = _read(q)
    assert [(m.seq, m.data) for m in msgs] == written
    assert rep.data_complete and not rep.complete and not rep.truncated
    assert rep.summary() == (
        f"{q}: summary section at byte {summary_start} is damaged (CRC mismatch); the data "
        f"section is intact and all {len(written)} messages were read (seq 0-{len(written) - 1})"
    )
    with open_recording(q) as r:
        assert r.ledger is not None  # metadata lives in the data section


def test_zeroed_footer_and_tail(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, written = small
    data = bytearray(path.read_bytes())
    footer = len(data) - FOOTER_AT
    data[footer:] = bytes(len(data) - footer)
    msgs, rep = _read(_write(tmp_path, bytes(data)))
    assert [m.seq for m in msgs] == [s for s, _ in written]
    assert rep.data_complete and not rep.complete
    assert "summary and footer are missing" in rep.summary()


def test_damaged_first_chunk_keeps_channel_of_later_messages(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    # The MCAP Channel record lives in the first chunk; the kvtool.channel note outside
    # the chunks keeps later messages attributed to their endpoint.
    path, _written = small
    data = bytearray(path.read_bytes())
    start, length = chunk_bodies(path)[0]
    data[start + length - 30 : start + length - 10] = bytes(20)
    msgs, rep = _read(_write(tmp_path, bytes(data)))
    assert rep.damaged_chunks == 1 and msgs
    assert {(m.channel.endpoint, m.channel.dp_rank) for m in msgs} == {("tcp://127.0.0.1:5557", 0)}
    assert rep.unknown_channel_messages == 0


def test_garbage_between_chunks_is_skipped(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, written = small
    data = path.read_bytes()
    start, _length = chunk_bodies(path)[4]
    junk = bytes(range(256)) * 3
    damaged = data[:start] + junk + data[start:]
    msgs, rep = _read(_write(tmp_path, damaged))
    assert [m.seq for m in msgs] == [s for s, _ in written]
    assert rep.damaged_records >= 1 and rep.skipped_bytes == len(junk)
    assert rep.first_damage_offset == start
    assert f"at byte {start}" in rep.summary()


def test_truncated_and_damaged(small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path) -> None:
    path, _written = small
    data = bytearray(path.read_bytes())
    bodies = chunk_bodies(path)
    s1, l1 = bodies[1]
    data[s1 + l1 - 20] ^= 0xFF
    cut = bodies[5][0] + 5
    msgs, rep = _read(_write(tmp_path, bytes(data[:cut])))
    per_chunk = _chunk_seqs(path)
    expected = [s for st, _ in bodies[:5] if st != s1 for s in per_chunk[st]]
    assert [m.seq for m in msgs] == expected
    assert rep.truncated and rep.damaged_chunks == 1
    assert "1 damaged chunk skipped before that" in rep.summary()


def test_resync_across_a_long_damaged_chunk(tmp_path: Path) -> None:
    # A damaged length on a chunk of more than the 1 MiB search window: the scan
    # searches past the window edge and finds the next chunk.
    path = tmp_path / "big.mcap"
    payloads = [p for _t, _s, p in capture_messages("gemma3")] * 10
    written = list(enumerate(payloads))
    with RecordingWriter(path, chunk_size=1_500_000, compression="none") as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for seq, payload in written:
            w.write(ch, seq, payload, seq)
    bodies = chunk_bodies(path)
    assert len(bodies) >= 2 and bodies[1][0] - bodies[0][0] > (1 << 20) + 64
    data = bytearray(path.read_bytes())
    start = bodies[0][0]
    data[start + 1 : start + 9] = b"\xff" * 8  # record length: impossible
    data[start + 9 + 36] ^= 0x01  # records length: disagrees
    msgs, rep = _read(_write(tmp_path, bytes(data)))
    per_chunk = _chunk_seqs(path)
    assert [m.seq for m in msgs] == [s for s, _ in written if s not in per_chunk[start]]
    assert rep.skipped_bytes == bodies[0][1]  # up to its message index, which checks out
    assert not rep.truncated and not rep.complete


# -- issue 8.10: amplification (hostile bytes) ------------------------------------------

_READ_IN_SUBPROCESS = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
from kvtool.errors import KvtoolError
from kvtool.recording import open_recording
try:
    with open_recording(sys.argv[1]) as r:
        seqs = [m.seq for m in r.messages()]
        rep = r.recovery
    print(json.dumps({"seqs": seqs, "damaged_chunks": rep.damaged_chunks,
                      "damaged_records": rep.damaged_records, "reason": rep.reason}))
except KvtoolError as err:
    print(json.dumps({"error": str(err)}))
"""


def _read_capped(path: Path, limit: int = 1 << 30) -> dict[str, object]:
    """Read ``path`` in a child whose address space is capped at ``limit`` bytes."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _READ_IN_SUBPROCESS, str(path), str(limit)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def test_issue8_10_zstd_bomb_is_refused_before_decompressing(tmp_path: Path) -> None:
    # 64 KiB of zstd RLE blocks that inflate to 2 GiB of zeros, stated honestly...
    bomb = mb.zstd_zeros(1 << 31)
    honest = mb.chunk(b"", usize=1 << 31, compressed=bomb, crc=False)
    # ...and stated as 1000 bytes (the decompressor must stop at what the chunk states).
    liar = mb.chunk(b"", usize=1000, compressed=bomb, crc=False)
    data = mb.recording(
        mb.kvtool_context(), mb.schema(), mb.channel(), honest, liar, mb.chunk(mb.message(7))
    )
    path = _write(tmp_path, data)
    assert len(data) < 140_000
    got = _read_capped(path)
    assert got["seqs"] == [7]
    assert got["damaged_chunks"] == 2
    assert "decompression bomb" in str(got["reason"])
    msgs, rep = _read(path)
    assert [m.seq for m in msgs] == [7] and rep.damaged_chunks == 2


def test_issue8_10_zero_records_inside_a_chunk_are_damage(tmp_path: Path) -> None:
    # One message, then zeros: opcode 0 is no record; the chunk ends there as damage
    # instead of being walked nine bytes at a time.
    body = mb.message(1) + bytes(60_000)
    data = mb.recording(
        mb.kvtool_context(), mb.schema(), mb.channel(), mb.chunk(body), mb.chunk(mb.message(2))
    )
    msgs, rep = _read(_write(tmp_path, data))
    assert [m.seq for m in msgs] == [1, 2]
    assert rep.damaged_chunks == 1
    assert rep.reason is not None and "zero bytes where a record should start" in rep.reason


def test_zero_run_between_records_is_skipped(tmp_path: Path) -> None:
    data = mb.recording(
        mb.kvtool_context(),
        mb.schema(),
        mb.channel(),
        mb.chunk(mb.message(1)),
        bytes(3 << 20),
        mb.chunk(mb.message(2)),
    )
    msgs, rep = _read(_write(tmp_path, data))
    assert [m.seq for m in msgs] == [1, 2]
    assert rep.damaged_records == 1 and rep.skipped_bytes == 3 << 20


def test_issue8_10_message_flood_is_capped_per_chunk(tmp_path: Path) -> None:
    from kvtool.recording import format as fmt

    # 2000 identical message records compress to almost nothing: far more records than
    # the chunk's stored bytes allow. The first ones are read, the rest is damage.
    records = mb.message(3) * 2000
    z = zstandard.ZstdCompressor(level=19).compress(records)
    assert len(records) <= fmt.chunk_size_limit("zstd", len(z))  # not caught as a bomb
    data = mb.recording(
        mb.kvtool_context(),
        mb.schema(),
        mb.channel(),
        mb.chunk(records, compressed=z),
        mb.chunk(mb.message(4)),
    )
    msgs, rep = _read(_write(tmp_path, data))
    budget = fmt.chunk_record_limit(len(z))
    assert len(msgs) == budget + 1 < 1000
    assert msgs[-1].seq == 4
    assert rep.damaged_chunks == 1
    assert rep.reason is not None and f"more than {budget} records" in rep.reason


def test_issue8_10_many_tiny_chunks_of_zeros(tmp_path: Path) -> None:
    # Each tiny chunk claims 8 MiB of zeros from a few hundred stored bytes: refused
    # from its header, never inflated, and the scan goes on to the next.
    z = mb.zstd_zeros(8 << 20)
    tiny = mb.chunk(b"", usize=8 << 20, compressed=z, crc=False)
    n = 20
    data = mb.recording(
        mb.kvtool_context(), mb.schema(), mb.channel(), *[tiny] * n, mb.chunk(mb.message(9))
    )
    got = _read_capped(_write(tmp_path, data))
    assert got["seqs"] == [9]
    assert got["damaged_chunks"] == n
    assert "decompression bomb" in str(got["reason"])


def test_messages_stream_out_of_a_chunk(tmp_path: Path) -> None:
    # A chunk's messages are yielded one by one: the first arrives before the reader
    # has looked at the damaged record that ends the chunk.
    body = b"".join(mb.message(i, bytes(40)) for i in range(50)) + bytes(100)
    data = mb.recording(mb.kvtool_context(), mb.schema(), mb.channel(), mb.chunk(body))
    with open_recording(_write(tmp_path, data)) as r:
        it = r.messages()
        first = next(it)
        assert first.seq == 0 and r.recovery.damaged_chunks == 0
        rest = list(it)
        assert len(rest) == 49 and r.recovery.damaged_chunks == 1


# -- issue 8.13: inputs that are not regular files --------------------------------------


def test_issue8_13_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    import subprocess
    import sys

    fifo = tmp_path / "pipe.mcap"
    os.mkfifo(fifo)
    # In a child so that a regression hangs only the child; nobody ever opens the writer
    # end, so an open() of the FIFO would block forever.
    code = (
        "import sys\nfrom kvtool.errors import RecordingError\n"
        "from kvtool.recording import open_recording\n"
        "try:\n    open_recording(sys.argv[1])\nexcept RecordingError as e:\n    print(e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(fifo)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.stdout.strip() == (
        f"{fifo}: is a FIFO (named pipe), not a regular file; kvtool reads recordings only "
        "from regular files (copy the data to a file first)"
    )


def test_issue8_13_device_is_refused_not_called_empty() -> None:
    from kvtool.errors import RecordingError

    with pytest.raises(RecordingError, match=r"^/dev/zero: is a character device, not a regular"):
        open_recording("/dev/zero")


def test_issue8_13_check_input(tmp_path: Path) -> None:
    from kvtool.errors import RecordingError
    from kvtool.recording import check_input

    f = tmp_path / "a.mcap"
    f.write_bytes(b"x")
    assert check_input(f) == str(f)
    with pytest.raises(RecordingError, match=r"is a directory, not a recording"):
        check_input(tmp_path)
    with pytest.raises(RecordingError, match=r"nope: cannot open: No such file"):
        check_input(tmp_path / "nope")
    os.mkfifo(tmp_path / "p")
    with pytest.raises(RecordingError, match=r"is a FIFO"):
        check_input(tmp_path / "p")


# -- issue 8.14: one bad record never makes the file unreadable -------------------------


def test_issue8_14_superscript_dp_rank(tmp_path: Path) -> None:
    data = mb.recording(
        mb.kvtool_context(),
        mb.schema(),
        mb.chunk(mb.channel(dp_rank="²") + mb.message(1)),
        mb.chunk(mb.message(2)),
    )
    msgs, rep = _read(_write(tmp_path, data))
    assert [m.seq for m in msgs] == [1, 2] and rep.complete
    assert msgs[0].channel.dp_rank is None


def test_issue8_14_deeply_nested_metadata_is_damage(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    data = mb.recording(
        mb.kvtool_context(),
        mb.schema(),
        mb.channel(),
        mb.metadata("kvtool.groups", {"groups": deep, "source": '"x"'}, raw=True),
        mb.chunk(mb.message(1)),
    )
    with open_recording(_write(tmp_path, data)) as r:
        assert [m.seq for m in r.messages()] == [1]
        rep = r.recovery
        assert r.groups is None
    assert rep.damaged_records == 1
    assert rep.reason is not None and "nested too deeply" in rep.reason


def test_issue8_14_file_that_shrinks_while_read(
    small: tuple[Path, list[tuple[int, bytes]]], tmp_path: Path
) -> None:
    path, _ = small
    copy = _write(tmp_path, path.read_bytes())
    cut = chunk_bodies(path)[3][0]
    with open_recording(copy) as r:
        it = r.messages()
        first = next(it)
        os.truncate(copy, cut)
        rest = list(it)
        rep = r.recovery
    got = [first.seq] + [m.seq for m in rest]
    assert got == _expected_after_cut(path, cut)
    assert rep.truncated and rep.reason is not None and "shrank while being read" in rep.reason


def _hostile_files(tmp_path: Path) -> dict[str, Path]:
    head = (mb.kvtool_context(), mb.schema(), mb.channel())
    z64 = mb.zstd_zeros(64 * 1024)
    flood = mb.message(3) * 2000
    files = {
        "bomb": mb.recording(
            *head,
            mb.chunk(b"", usize=1 << 31, compressed=mb.zstd_zeros(1 << 31), crc=False),
            mb.chunk(mb.message(1)),
        ),
        "zeros": mb.recording(*head, mb.chunk(mb.message(1) + bytes(60_000))),
        "flood": mb.recording(*head, mb.chunk(flood)),
        "tiny": mb.recording(*head, *[mb.chunk(bytes(64 * 1024), compressed=z64, crc=False)] * 50),
    }
    out = {}
    for name, data in files.items():
        out[name] = _write(tmp_path, data, f"{name}.mcap")
    return out


@pytest.mark.parametrize(
    "command",
    [["info"], ["report", "-f", "json"], ["replay", "--format", "jsonl"], ["export", "-o"]],
    ids=["info", "report", "replay", "export"],
)
def test_every_read_command_reads_hostile_files(tmp_path: Path, command: list[str]) -> None:
    from typer.testing import CliRunner

    from kvtool.cli import app

    runner = CliRunner()
    for name, path in _hostile_files(tmp_path).items():
        args = (
            [*command, str(tmp_path / f"{name}.parquet")]
            if command == ["export", "-o"]
            else command
        )
        result = runner.invoke(app, [*args, str(path)])
        assert result.exit_code == 3, (name, result.stderr, result.exception)
        assert isinstance(result.exception, SystemExit), (name, result.exception)
        assert f"{path}:" in result.stderr, name


def test_recovery_is_not_complete_before_the_messages_are_read(tmp_path: Path) -> None:
    """``read_metadata()`` alone left ``recovery`` at its default, which said a truncated
    recording was complete."""
    good = tmp_path / "good.mcap"
    write_capture(good, "gemma3")
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    for path in (good, cut):
        with open_recording(path) as r:
            r.read_metadata()
            assert not r.recovery.complete
            assert r.recovery.reason == "its messages have not been read yet"
            for _ in r.messages():
                pass
            assert r.recovery.complete is (path == good)
