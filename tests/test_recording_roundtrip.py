"""Write → read roundtrips: payload bytes, times, seqs and metadata come back unchanged."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcap.reader import make_reader

from kvtool.errors import ExitStatus, RecordingError
from kvtool.recording import RecordingPathError, RecordingWriter, open_recording
from tests.conftest import capture_messages
from tests.recutil import BASE_NS, ENDPOINT, STEP_NS, chunk_extents, write_capture

EMPTY_BATCH = b"\x93\xcb\x41\xd9\x00\x00\x00\x00\x00\x00\x90\xc0"  # [ts, [], None]


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
@pytest.mark.parametrize("chunk_size", [512, 16 * 1024, 4 * 1024 * 1024])
def test_roundtrip_payloads_identical(tmp_path: Path, compression: str, chunk_size: int) -> None:
    path = tmp_path / "r.mcap"
    written = write_capture(path, "gemma3", chunk_size=chunk_size, compression=compression)
    with open_recording(path) as r:
        msgs = list(r.messages())
        rep = r.recovery
    assert [(m.seq, m.data) for m in msgs] == written
    assert [m.log_time for m in msgs] == [BASE_NS + i * STEP_NS for i in range(len(written))]
    assert all(m.channel.endpoint == ENDPOINT and m.channel.dp_rank == 0 for m in msgs)
    assert rep.complete and not rep.truncated and rep.messages == len(written)
    assert rep.reason is None
    assert rep.summary() == f"{path}: complete, {len(written)} messages"
    if chunk_size == 512:
        assert len(chunk_extents(path)) > 10


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_mcap_library_reads_our_files(tmp_path: Path, compression: str) -> None:
    # Compatibility: the mcap package's own reader (what `mcap info` / Foxglove use).
    path = tmp_path / "r.mcap"
    written = write_capture(path, "gemma3", chunk_size=2048, compression=compression)
    with open(path, "rb") as f:
        reader = make_reader(f)
        got = [(m.sequence, m.data, ch.topic) for _s, ch, m in reader.iter_messages()]
        stats = reader.get_summary()
    assert got == [(seq, data, ENDPOINT) for seq, data in written]
    assert stats is not None and stats.statistics is not None
    assert stats.statistics.message_count == len(written)


def test_publish_time_is_batch_ts(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, "full_only", limit=3)
    with open_recording(path) as r:
        msgs = list(r.messages())
    # Captures use fixed timestamps; publish_time is the batch ts (s → ns), not log_time.
    assert all(m.publish_time != m.log_time for m in msgs)
    assert all(0 < m.publish_time < 10**19 for m in msgs)


def test_metadata_context_groups_ledger(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    groups: list[dict[str, object]] = [
        {"group_idx": 0, "kind": "full_attention", "block_size": 16, "sliding_window": None},
        {"group_idx": 1, "kind": "sliding_window", "block_size": 16, "sliding_window": 64},
    ]
    ledger: dict[str, object] = {
        "channels": [],
        "recovered": 2,
        "lost": 0,
        "lost_ranges": [],
        "restarts": 0,
    }
    write_capture(path, limit=4, groups=groups, ledger=ledger)
    with open_recording(path) as r:
        assert r.groups == groups
        assert r.ledger == ledger
        assert r.context["format_version"] == 1
        assert "command_line" in r.context
        assert r.channels[1].endpoint == ENDPOINT


def test_channels_one_per_endpoint_topic(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    with RecordingWriter(path) as w:
        a = w.add_channel("tcp://h:5557", "", 0)
        b = w.add_channel("tcp://h:5558", "", 1)
        c = w.add_channel("tcp://h:5557", "kv", None)
        assert w.add_channel("tcp://h:5557", "", 0) == a
        for i, ch in enumerate([a, b, c, a]):
            w.write(ch, i, EMPTY_BATCH, i)
    with open_recording(path) as r:
        msgs = list(r.messages())
        chans = {ch.name: (ch.endpoint, ch.topic, ch.dp_rank) for ch in r.channels.values()}
    assert chans == {
        "tcp://h:5557": ("tcp://h:5557", "", 0),
        "tcp://h:5558": ("tcp://h:5558", "", 1),
        "tcp://h:5557#kv": ("tcp://h:5557", "kv", None),
    }
    assert [m.channel.name for m in msgs] == [
        "tcp://h:5557",
        "tcp://h:5558",
        "tcp://h:5557#kv",
        "tcp://h:5557",
    ]


@pytest.mark.parametrize(
    "seqs",
    [
        [2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1],  # wrap of the 32-bit field
        [5 * 2**32 + 7, 5 * 2**32 + 8],  # starts above 2**32
        [2**32 + 5, 2**32 + 6, 0, 1],  # restart from above 2**32
        [3 * 2**30 + 1, 0, 1],  # restart from the top quarter: not a wrap
        [10, 11, 2**33 + 3, 2**33 + 4],  # a gap across several wraps
    ],
)
def test_full_seq_survives_32_bit_sequence(tmp_path: Path, seqs: list[int]) -> None:
    path = tmp_path / "r.mcap"
    with RecordingWriter(path, chunk_size=64) as w:
        ch = w.add_channel("tcp://h:1")
        for i, s in enumerate(seqs):
            w.write(ch, s, EMPTY_BATCH, i)
    with open_recording(path) as r:
        assert [m.seq for m in r.messages()] == seqs
    with open(path, "rb") as f:
        assert [m.sequence for _s, _c, m in make_reader(f).iter_messages()] == [
            s & 0xFFFFFFFF for s in seqs
        ]


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    path.write_bytes(b"precious")
    with pytest.raises(RecordingPathError, match=r"r\.mcap: file exists; pass --force") as ei:
        RecordingWriter(path)
    assert ei.value.exit_status == ExitStatus.USAGE
    assert path.read_bytes() == b"precious"
    # --force replaces a regular file, whatever it holds (issue 24).
    for n in (3, 1):
        with RecordingWriter(path, force=True) as w:
            ch = w.add_channel("tcp://h:1")
            for seq in range(n):
                w.write(ch, seq, EMPTY_BATCH, 1 + seq)
    with open_recording(path) as r:
        assert len(list(r.messages())) == 1


def test_unwritable_paths(tmp_path: Path) -> None:
    with pytest.raises(RecordingPathError, match=r"cannot create: No such file or directory"):
        RecordingWriter(tmp_path / "missing-dir" / "r.mcap")
    with pytest.raises(RecordingPathError, match=r"is a directory"):
        RecordingWriter(tmp_path, force=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_permission_denied(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(RecordingPathError, match=r"cannot create: Permission denied"):
            RecordingWriter(ro / "r.mcap")
    finally:
        ro.chmod(0o700)


def test_bad_options() -> None:
    with pytest.raises(RecordingError, match=r"unknown compression 'brotli'"):
        RecordingWriter("unused.mcap", compression="brotli")
    with pytest.raises(RecordingError, match=r"must be positive"):
        RecordingWriter("unused.mcap", chunk_size=0)


def test_disk_full_is_one_clean_error() -> None:
    # /dev/full fails every write with ENOSPC.
    with pytest.raises(RecordingError, match=r"/dev/full: cannot write: No space left on device"):
        RecordingWriter("/dev/full", force=True)


def test_file_size_limit_keeps_flushed_part_readable(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    msgs = capture_messages("gemma3")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    written = 0
    w = RecordingWriter(path, chunk_size=1024)
    ch = w.add_channel(ENDPOINT, "", 0)
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, hard))
    try:
        with pytest.raises(
            RecordingError,
            match=r"write failed after \d+ messages: File too large; "
            r"what was flushed before stays readable",
        ):
            for i, (_t, seq, payload) in enumerate(msgs * 4):
                w.write(ch, seq + 64 * (i // 64), payload, BASE_NS + i)
                w.flush()
                written += 1
        # Later calls raise the same error; close() only closes.
        with pytest.raises(RecordingError, match=r"File too large"):
            w.write(ch, 10**6, EMPTY_BATCH, 1)
        w.close()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert w.closed
    with open_recording(path) as r:
        got = list(r.messages())
        rep = r.recovery
    assert rep.truncated and not rep.complete
    assert 0 < len(got) <= written
    assert [m.data for m in got] == [p for _t, _s, p in (msgs * 4)[: len(got)]]


def test_timed_flush_makes_data_readable_while_recording(tmp_path: Path) -> None:
    # What a SIGKILL leaves: the file as it is on disk while the writer is still open.
    path = tmp_path / "live.mcap"
    with RecordingWriter(path, flush_interval_ns=20_000_000) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        w.write(ch, 0, EMPTY_BATCH, 1)
        with open_recording(path) as r:
            assert list(r.messages()) == []  # within the interval: still in memory
            assert r.recovery.truncated
        time.sleep(0.03)
        w.write(ch, 1, EMPTY_BATCH, 2)  # past the interval: the chunk is closed and flushed
        with open_recording(path) as r:
            assert [m.seq for m in r.messages()] == [0, 1]
            assert r.recovery.truncated
            assert r.recovery.summary().endswith("recovered 2 messages (seq 0-1); the rest is lost")
        w.write(ch, 2, EMPTY_BATCH, 3)
        time.sleep(0.03)
        w.maybe_flush()  # a recorder's poll loop calls this when no message comes
        with open_recording(path) as r:
            assert [m.seq for m in r.messages()] == [0, 1, 2]


def test_writer_closes_on_exception(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    with pytest.raises(KeyboardInterrupt), RecordingWriter(path) as w:
        w.write(w.add_channel("tcp://h:1"), 0, EMPTY_BATCH, 1)
        raise KeyboardInterrupt
    with open_recording(path) as r:
        assert len(list(r.messages())) == 1
        assert r.recovery.complete


def test_write_to_unknown_channel_or_closed_writer(tmp_path: Path) -> None:
    w = RecordingWriter(tmp_path / "r.mcap")
    with pytest.raises(RecordingError, match=r"channel 9 was not added"):
        w.write(9, 0, EMPTY_BATCH, 1)
    ch = w.add_channel("tcp://h:1")
    w.close()
    w.close()  # idempotent
    with pytest.raises(RecordingError, match=r"already closed"):
        w.write(ch, 0, EMPTY_BATCH, 1)


def test_reader_streams_and_rereads(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    written = write_capture(path, "gemma3", chunk_size=1024)
    with open_recording(path) as r:
        it = r.messages()
        first = next(it)
        assert r.groups is None  # metadata access mid-iteration does not disturb it
        rest = list(it)
        again = list(r)
    assert [first.data] + [m.data for m in rest] == [p for _s, p in written]
    assert [m.data for m in again] == [p for _s, p in written]


def test_out_of_range_values(tmp_path: Path) -> None:
    with RecordingWriter(tmp_path / "r.mcap") as w:
        ch = w.add_channel("tcp://h:1")
        with pytest.raises(RecordingError, match=r"seq -1 / log_time 5 out of range"):
            w.write(ch, -1, EMPTY_BATCH, 5)
        with pytest.raises(RecordingError, match=r"out of range"):
            w.write(ch, 0, EMPTY_BATCH, 2**64)
        w.write(ch, 2**64 - 1, EMPTY_BATCH, 1, publish_time=-3)  # publish_time falls back
    with open_recording(tmp_path / "r.mcap") as r:
        (m,) = list(r.messages())
    assert (m.seq, m.publish_time) == (2**64 - 1, 1)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    msgs=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2**64 - 1),
            st.binary(max_size=300)
            | st.sampled_from([b"\x89MCAP0\r\n", b"\x06" + bytes(12), b"\x0f\x04" + bytes(11)]),
        ),
        max_size=40,
    ),
    compression=st.sampled_from(["zstd", "lz4", "none"]),
    chunk_size=st.sampled_from([1, 200, 4096]),
)
def test_any_bytes_roundtrip(
    tmp_path: Path, msgs: list[tuple[int, bytes]], compression: str, chunk_size: int
) -> None:
    # Arbitrary payloads (also ones that look like MCAP records) and arbitrary seqs come
    # back exactly, and a clean file never reports damage.
    path = tmp_path / f"h{abs(hash((tuple(msgs), compression, chunk_size)))}.mcap"
    with RecordingWriter(path, chunk_size=chunk_size, compression=compression) as w:
        ch = w.add_channel("tcp://h:1")
        for i, (seq, data) in enumerate(msgs):
            w.write(ch, seq, data, i)
    with open_recording(path) as r:
        got = [(m.seq, m.data) for m in r.messages()]
        assert r.recovery.complete, r.recovery.summary()
    assert got == msgs
    path.unlink()


# -- issue 9.3: typed records, JSON on disk unchanged ------------------------------------

# The ledger exactly as the recorder builds it today (capture.Recorder.ledger()).
LEDGER: dict[str, object] = {
    "channels": [
        {
            "channel": ENDPOINT,
            "endpoint": ENDPOINT,
            "topic": "",
            "dp_rank": 0,
            "batches": 60,
            "seq_first": 0,
            "seq_last": 63,
            "gaps": [
                {"first": 10, "last": 12, "recovered": 0, "lost_ranges": [[10, 12]]},
                {"first": 40, "last": None, "recovered": 2, "lost_ranges": [[40, 40]]},
            ],
            "restarts": [{"log_time": BASE_NS, "from_seq": 63, "to_seq": 0}],
            "gaps_omitted": 3,
        }
    ],
    "recovered": 2,
    "lost": 4,
    "lost_ranges": [[10, 12], [40, 40]],
    "restarts": 1,
}


def test_issue9_3_ledger_struct_keeps_the_json_on_disk(tmp_path: Path) -> None:
    import json

    from kvtool.recording.ledger import (
        ChannelLedger,
        GapLedger,
        GapRecord,
        RestartRecord,
    )

    built = GapLedger(
        channels=[
            ChannelLedger(
                channel=ENDPOINT,
                endpoint=ENDPOINT,
                topic="",
                dp_rank=0,
                batches=60,
                seq_first=0,
                seq_last=63,
                gaps=[
                    GapRecord(first=10, last=12, lost_ranges=[(10, 12)]),
                    GapRecord(first=40, recovered=2, lost_ranges=[(40, 40)]),
                ],
                restarts=[RestartRecord(log_time=BASE_NS, from_seq=63, to_seq=0)],
                gaps_omitted=3,
            )
        ],
        recovered=2,
        lost=4,
        lost_ranges=[(10, 12), (40, 40)],
        restarts=1,
    )
    # Same keys, same order, same values as the untyped dict the recorder writes today.
    assert json.dumps(built.to_json()) == json.dumps(LEDGER)
    path = tmp_path / "r.mcap"
    write_capture(path, "gemma3", skip={10, 11, 12, 40}, ledger=built.to_json())
    with open_recording(path) as r:
        assert r.gap_ledger == built
        assert r.ledger == LEDGER
        assert r.gap_ledger is not None
        assert r.gap_ledger.lost_by_channel() == {ENDPOINT: [(10, 12), (40, 40)]}


def test_issue9_3_typed_context_and_groups(tmp_path: Path) -> None:
    from kvtool.recording.ledger import GroupMeta, GroupsRecord

    groups: list[dict[str, object]] = [
        {"group_idx": 1, "kind": "sliding_window", "block_size": 16, "sliding_window": 64},
        {"group_idx": 0, "kind": "full_attention", "block_size": 16, "sliding_window": None},
    ]
    path = tmp_path / "r.mcap"
    with RecordingWriter(path, context={"endpoints": [ENDPOINT], "bind": False}) as w:
        w.add_channel(ENDPOINT, "", 0)
        w.add_groups(groups, "g.json")
        w.add_groups(groups[1:], "flags", channel=ENDPOINT)
    with open_recording(path) as r:
        ctx = r.recording_context
        assert ctx is not None and ctx.format_version == 1 and ctx.endpoints == [ENDPOINT]
        assert ctx.to_json()["endpoints"] == [ENDPOINT]
        recs = r.group_records
        assert recs[0] == GroupsRecord(
            groups=[
                GroupMeta(group_idx=1, kind="sliding_window", block_size=16, sliding_window=64),
                GroupMeta(group_idx=0, kind="full_attention", block_size=16),
            ],
            source="g.json",
        )
        assert recs[0].to_json() == {"groups": groups, "source": "g.json"}
        assert recs[1].channel == ENDPOINT
        assert r.groups == [groups[1], groups[0]]  # by index, as vLLM returns it


def test_issue9_3_old_file_reads_typed() -> None:
    path = Path(__file__).parent / "data" / "recordings" / "full_only-v1.mcap"
    with open_recording(path) as r:
        assert sum(1 for _ in r.messages()) == 19 and r.recovery.complete
        ledger = r.gap_ledger
        assert ledger is not None and ledger.lost == 1 and ledger.lost_ranges == [(8, 8)]
        assert ledger.channels[0].gaps[0].recovered == 1
        assert r.recording_context is not None
        assert r.recording_context.kvtool_version == "0.1.0"
        assert r.groups == [
            {"group_idx": 0, "kind": "full_attention", "block_size": 16, "sliding_window": None}
        ]


@pytest.mark.parametrize(
    "ledger",
    [
        {"lost": "many"},
        {"lost": -1},
        {"lost_ranges": [[5, 2]]},
        {"lost_ranges": [[1, 2**64]]},
        {"channels": [{"gaps": [{"last": 3}]}]},
        [1, 2, 3],
    ],
)
def test_issue9_3_malformed_ledger_is_damage(tmp_path: Path, ledger: object) -> None:
    path = tmp_path / "r.mcap"
    written = [(seq, payload) for _t, seq, payload in capture_messages("full_only")[:5]]
    with RecordingWriter(path) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        for i, (seq, payload) in enumerate(written):
            w.write(ch, seq, payload, BASE_NS + i * STEP_NS)
        w.add_metadata("kvtool.gaps", {"ledger": ledger})
    with open_recording(path) as r:
        assert [(m.seq, m.data) for m in r.messages()] == written
        rep = r.recovery
        assert r.gap_ledger is None and r.ledger is None
    assert rep.damaged_records == 1 and not rep.complete
    assert rep.reason is not None and "kvtool.gaps record is malformed" in rep.reason


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_issue8_3_writer_never_writes_a_chunk_its_reader_refuses(
    tmp_path: Path, compression: str
) -> None:
    """A hostile peer's megabytes of zeros compress far past the reader's bomb bound: the
    writer stores such a chunk uncompressed, so every received batch reads back."""
    path = tmp_path / "zeros.mcap"
    real = capture_messages("gemma3")[:5]
    with RecordingWriter(path, compression=compression) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        for i, (_topic, seq, payload) in enumerate(real):
            w.write(ch, seq, payload, BASE_NS + i * STEP_NS)
        w.write(ch, 5, b"\x00" * (4 << 20), BASE_NS + 5 * STEP_NS)
        w.write(ch, 6, real[0][2], BASE_NS + 6 * STEP_NS)
    with open_recording(path) as r:
        got = [(m.seq, len(m.data)) for m in r.messages()]
        assert r.recovery.complete and not r.recovery.damaged
    assert [s for s, _ in got] == [0, 1, 2, 3, 4, 5, 6]
    assert got[5][1] == 4 << 20
    assert path.stat().st_size > 4 << 20  # that chunk is stored as received


def test_discard_if_empty_removes_only_the_writers_own_file(tmp_path: Path) -> None:
    """A recorder that reached no publisher leaves no empty file -- but only its own: a file
    put at the path since (the recording moved away, another file in its place) stays."""
    path = tmp_path / "r.mcap"
    w = RecordingWriter(path)
    os.rename(path, tmp_path / "moved.mcap")
    path.write_bytes(b"the user's file")
    assert w.discard_if_empty() is False
    w.close()
    assert path.read_bytes() == b"the user's file"

    own = tmp_path / "own.mcap"
    w = RecordingWriter(own)
    assert w.discard_if_empty() is True
    w.close()
    assert not own.exists()


def test_discard_if_empty_keeps_a_recording_with_messages(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    w = RecordingWriter(path)
    ch = w.add_channel(ENDPOINT, "", 0)
    w.write(ch, 0, capture_messages("gemma3")[0][2], BASE_NS)
    assert w.discard_if_empty() is False
    w.close()
    with open_recording(path) as r:
        assert [m.seq for m in r.messages()] == [0]
