"""The kvtool profile on MCAP: identity, version and the names in format.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from mcap.reader import make_reader
from mcap.writer import Writer

from kvtool.errors import RecordingError, TruncatedRecording, UnsupportedVersion
from kvtool.info import summarize
from kvtool.recording import RecordingWriter, open_recording
from kvtool.recording import format as fmt
from tests.recutil import write_capture


def test_profile_names_follow_design() -> None:
    assert fmt.PROFILE == "kvtool"
    assert fmt.SCHEMA_NAME == "vllm.KVEventBatch"
    assert fmt.MESSAGE_ENCODING == "msgpack"
    assert fmt.FORMAT_VERSION == 1
    assert "Version history:" in (fmt.__doc__ or "")
    assert fmt.channel_topic("tcp://h:1", "") == "tcp://h:1"
    assert fmt.channel_topic("tcp://h:1", "kv") == "tcp://h:1#kv"


def test_written_file_has_kvtool_identity(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, limit=5)
    with open(path, "rb") as f:
        reader = make_reader(f)
        header = reader.get_header()
        summary = reader.get_summary()
        assert summary is not None
        assert header.profile == "kvtool"
        assert header.library.startswith("kvtool ")
        (schema,) = summary.schemas.values()
        assert schema.name == "vllm.KVEventBatch"
        (channel,) = summary.channels.values()
        assert channel.message_encoding == "msgpack"
        assert channel.metadata == {"endpoint": "tcp://127.0.0.1:5557", "topic": "", "dp_rank": "0"}
        meta = {m.name: m.metadata for m in reader.iter_metadata()}
    assert json.loads(meta["kvtool.recording"]["format_version"]) == 1
    assert json.loads(meta["kvtool.channel"]["endpoint"]) == "tcp://127.0.0.1:5557"


@pytest.mark.parametrize(
    ("value", "expected"), [(1, (1, 0)), ("1", (1, 0)), ("1.3", (1, 3)), (0, (0, 0))]
)
def test_parse_format_version(value: object, expected: tuple[int, int]) -> None:
    assert fmt.parse_format_version("r.mcap", value) == expected


@pytest.mark.parametrize("value", ["abc", "1.x", -1, None, True, 1.5])
def test_parse_format_version_rejects_garbage(value: object) -> None:
    with pytest.raises(RecordingError, match=r"r\.mcap: format_version .* is not a version"):
        fmt.parse_format_version("r.mcap", value)


def test_newer_major_version_is_refused_with_upgrade_hint(tmp_path: Path) -> None:
    path = tmp_path / "future.mcap"
    with RecordingWriter(path, context={"format_version": 2}) as w:
        w.write(
            w.add_channel("tcp://h:1"), 0, b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\xc0", 1
        )
    with pytest.raises(
        UnsupportedVersion,
        match=r"future\.mcap: recording format version 2\.0 is newer than this kvtool reads "
        r"\(up to 1\); upgrade kvtool",
    ):
        open_recording(path)


def test_newer_minor_version_is_read(tmp_path: Path) -> None:
    path = tmp_path / "minor.mcap"
    with RecordingWriter(path, context={"format_version": "1.7"}) as w:
        w.write(w.add_channel("tcp://h:1"), 3, b"\x93\x00\x90\xc0", 1)
    with open_recording(path) as r:
        assert [m.seq for m in r.messages()] == [3]
        assert r.recovery.complete


def test_unknown_metadata_and_keys_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "extra.mcap"
    with RecordingWriter(path, context={"future_key": {"a": 1}}) as w:
        w.add_metadata("kvtool.future-record", {"x": [1, 2]})
        w.write(w.add_channel("tcp://h:1"), 0, b"\x93\x00\x90\xc0", 1)
    with open_recording(path) as r:
        assert len(list(r.messages())) == 1
        assert r.context["future_key"] == {"a": 1}
        assert r.read_metadata()["kvtool.future-record"] == [{"x": [1, 2]}]


def test_not_mcap(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a recording\n")
    with pytest.raises(RecordingError, match=r"notes\.txt: not an MCAP file \(starts with"):
        open_recording(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.mcap"
    path.write_bytes(b"")
    with pytest.raises(
        TruncatedRecording,
        match=r"empty\.mcap: recording is truncated at byte 0 \(the file is empty\); nothing",
    ):
        open_recording(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match=r"nope\.mcap: cannot open: No such file"):
        open_recording(tmp_path / "nope.mcap")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match=r"is a directory, not a recording"):
        open_recording(tmp_path)


def test_only_magic_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "magic.mcap"
    path.write_bytes(fmt.MCAP_MAGIC[:5])
    with pytest.raises(TruncatedRecording, match=r"magic\.mcap: recording is truncated at byte 5"):
        open_recording(path)
    path.write_bytes(fmt.MCAP_MAGIC)
    with pytest.raises(TruncatedRecording, match=r"truncated at byte 8, before its MCAP header"):
        open_recording(path)


def _foreign(path: Path, profile: str) -> None:
    with open(path, "wb") as f:
        w = Writer(f)
        w.start(profile=profile, library="rosbag2 test")
        sid = w.register_schema("std_msgs/String", "jsonschema", b"{}")
        cid = w.register_channel("/chatter", "json", sid)
        w.add_message(cid, 1, b'{"data": "hi"}', 1, 0)
        w.finish()


def test_mcap_of_another_profile(tmp_path: Path) -> None:
    path = tmp_path / "ros.mcap"
    _foreign(path, "ros2")
    with pytest.raises(
        RecordingError,
        match=r"ros\.mcap: MCAP file of profile 'ros2' \(written by 'rosbag2 test'\), "
        r"not a kvtool recording",
    ):
        open_recording(path)


def test_mcap_without_profile(tmp_path: Path) -> None:
    path = tmp_path / "plain.mcap"
    _foreign(path, "")
    with pytest.raises(RecordingError, match=r"plain\.mcap: MCAP file without a profile"):
        open_recording(path)


def test_foreign_channel_in_kvtool_profile_is_skipped(tmp_path: Path) -> None:
    # A json side channel next to a KV-event channel: skipped and counted, not decoded.
    path = tmp_path / "mixed.mcap"
    with open(path, "wb") as f:
        w = Writer(f)
        w.start(profile="kvtool", library="hand-made")
        good = w.register_schema(fmt.SCHEMA_NAME, fmt.SCHEMA_ENCODING, fmt.SCHEMA_DATA)
        other = w.register_schema("std_msgs/String", "jsonschema", b"{}")
        kv = w.register_channel("tcp://h:1", "msgpack", good, {"endpoint": "tcp://h:1"})
        js = w.register_channel("/chatter", "json", other)
        wrong_schema = w.register_channel("/odd", "msgpack", other)
        w.add_message(js, 1, b"{}", 1, 0)
        w.add_message(kv, 2, b"\x93\x00\x90\xc0", 2, 7)
        w.add_message(wrong_schema, 3, b"\x90", 3, 0)
        w.finish()
    with open_recording(path) as r:
        msgs = list(r.messages())
        assert [(m.channel.endpoint, m.seq) for m in msgs] == [("tcp://h:1", 7)]
        assert r.recovery.skipped_channels == 2
        assert r.recovery.skipped_messages == 2
        assert r.recovery.complete


def test_damaged_header(tmp_path: Path) -> None:
    path = tmp_path / "hdr.mcap"
    write_capture(path, limit=3)
    data = bytearray(path.read_bytes())
    data[8] = 0x33
    path.write_bytes(bytes(data))
    with pytest.raises(
        RecordingError, match=r"hdr\.mcap: not a valid MCAP file \(the record at byte 8"
    ):
        open_recording(path)


GOLDEN = Path(__file__).parent / "data" / "recordings"


def test_golden_v1_recording_still_reads() -> None:
    # A format-1 file written by kvtool 0.1.0: every later kvtool must read it the same.
    path = GOLDEN / "full_only-v1.mcap"
    expected = json.loads((GOLDEN / "full_only-v1.expected.json").read_text())
    with open_recording(path) as r:
        msgs = list(r.messages())
        assert r.recovery.complete
    assert [m.seq for m in msgs] == expected["seqs"]
    assert [hashlib.sha256(m.data).hexdigest() for m in msgs] == expected["payload_sha256"]
    got = summarize(path).to_json()
    for key in ("file", "command_line", "recorded_at"):
        got.pop(key)
    assert got == {k: v for k, v in expected.items() if k not in ("seqs", "payload_sha256")}


def test_seq_wrap_without_notes_from_another_writer(tmp_path: Path) -> None:
    # A kvtool-profile file from a writer that leaves no kvtool.seq notes: a drop from
    # the top quarter of the 32-bit range to the bottom quarter is a wrap, any other
    # drop a publisher restart.
    path = tmp_path / "other.mcap"
    with open(path, "wb") as f:
        w = Writer(f)
        w.start(profile="kvtool", library="another writer")
        sid = w.register_schema(fmt.SCHEMA_NAME, fmt.SCHEMA_ENCODING, fmt.SCHEMA_DATA)
        cid = w.register_channel("tcp://h:1", "msgpack", sid, {"endpoint": "tcp://h:1"})
        for i, seq32 in enumerate([2**32 - 2, 2**32 - 1, 0, 1, 5, 2]):
            w.add_message(cid, i, b"\x93\x00\x90\xc0", i, seq32)
        w.finish()
    with open_recording(path) as r:
        seqs = [m.seq for m in r.messages()]
    assert seqs == [2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**32 + 5, 2]
