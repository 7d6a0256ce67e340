"""``kvtool info``: the library summary and the command, on recordings of real captures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.info import summarize
from kvtool.recording import RecordingWriter
from tests.conftest import capture_messages, capture_truth
from tests.recutil import BASE_NS, ENDPOINT, STEP_NS, chunk_bodies, write_capture

runner = CliRunner()

GROUPS: list[dict[str, object]] = [
    {"group_idx": 0, "kind": "full_attention", "block_size": 16, "sliding_window": None},
    {"group_idx": 1, "kind": "sliding_window", "block_size": 16, "sliding_window": 64},
]


def _info_json(*args: str) -> tuple[int, object, str]:
    result = runner.invoke(app, ["info", "--format", "json", *args])
    return result.exit_code, json.loads(result.stdout) if result.stdout else None, result.stderr


def test_info_json_matches_truth(tmp_path: Path, capture: str) -> None:
    truth = capture_truth(capture)
    path = tmp_path / f"{capture}.mcap"
    write_capture(path, capture, chunk_size=8192)
    code, out, err = _info_json(str(path))
    assert code == 0, err
    assert err == ""
    assert isinstance(out, dict)
    assert out["batches"] == truth["num_batches"]
    assert out["events"] == truth["events_by_type"]
    assert out["blocks_stored"] == truth["block_stored"]["total"]["blocks"]
    assert out["blocks_removed"] == truth["block_removed"]["total"]["blocks"]
    assert out["tokens_stored"] == truth["block_stored"]["total"]["tokens"]
    wire = truth["wire"]
    assert out["channels"] == [
        {
            "endpoint": ENDPOINT,
            "topic": "",
            "dp_rank": 0,
            "batches": truth["num_batches"],
            "seq_first": wire["seq_first"],
            "seq_last": wire["seq_last"],
        }
    ]
    assert out["gaps"] == {"recovered": 0, "lost": 0, "lost_ranges": []}
    assert out["gaps_source"] == "file"
    assert out["start_time_ns"] == BASE_NS
    assert out["end_time_ns"] == BASE_NS + (truth["num_batches"] - 1) * STEP_NS
    assert out["restarts"] == 0
    assert out["duration_s"] == pytest.approx((truth["num_batches"] - 1) * STEP_NS / 1e9)
    assert out["groups"] is None
    assert out["truncated"] is False
    assert out["complete"] is True
    assert out["undecodable"] == 0
    assert out["size_bytes"] == os.path.getsize(path)


def test_required_json_keys(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, "gemma3", limit=5)
    _code, out, _err = _info_json(str(path))
    assert isinstance(out, dict)
    required = {
        "batches",
        "events",
        "blocks_stored",
        "blocks_removed",
        "channels",
        "gaps",
        "restarts",
        "duration_s",
        "groups",
        "truncated",
    }
    assert required <= set(out)
    assert set(out["events"]) == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    assert set(out["gaps"]) == {"recovered", "lost", "lost_ranges"}
    assert set(out["channels"][0]) == {
        "endpoint",
        "topic",
        "dp_rank",
        "batches",
        "seq_first",
        "seq_last",
    }


def test_gaps_from_file_without_ledger(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, "gemma3", skip={10, 11, 12, 40})
    info = summarize(path)
    assert info.batches == 60
    assert info.gaps.lost == 4
    assert info.gaps.lost_ranges == [[10, 12], [40, 40]]
    assert info.gaps.recovered == 0
    assert info.gaps.source == "file"


def test_gaps_from_ledger(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    ledger: dict[str, object] = {
        "channels": [],
        "recovered": 7,
        "lost": 4,
        "lost_ranges": [[10, 12], [40, 40]],
        "restarts": 1,
    }
    write_capture(path, "gemma3", skip={10, 11, 12, 40}, ledger=ledger, groups=GROUPS)
    info = summarize(path)
    assert (info.gaps.recovered, info.gaps.lost) == (7, 4)
    assert info.gaps.lost_ranges == [[10, 12], [40, 40]]
    assert info.gaps.source == "ledger"
    assert info.restarts == 1
    assert info.groups is not None and [g.to_json() for g in info.groups] == GROUPS
    assert info.groups_source == "groups.json"


def test_restart_counted_not_a_gap(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    msgs = capture_messages("full_only")
    with RecordingWriter(path) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        for i, seq in enumerate([0, 1, 2, 3, 0, 1, 2]):
            w.write(ch, seq, msgs[i][2], BASE_NS + i)
    info = summarize(path)
    assert info.restarts == 1
    assert info.gaps.lost == 0
    assert info.channels[0].seq_first == 0 and info.channels[0].seq_last == 2


def test_several_channels_and_ranks(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    msgs = capture_messages("gemma3")
    with RecordingWriter(path) as w:
        a = w.add_channel("tcp://h:5557", "", 0)
        b = w.add_channel("tcp://h:5558", "", None)  # rank learnt from the batches
        w.add_channel("tcp://h:5559", "", 2)  # never sent anything
        for i, (_t, seq, payload) in enumerate(msgs):
            w.write(a if i % 2 == 0 else b, seq // 2, payload, BASE_NS + i)
    info = summarize(path)
    assert [(c.endpoint, c.dp_rank, c.batches, c.seq_first, c.seq_last) for c in info.channels] == [
        ("tcp://h:5557", 0, 32, 0, 31),
        ("tcp://h:5558", 0, 32, 0, 31),
        ("tcp://h:5559", 2, 0, None, None),
    ]
    assert info.batches == 64 and info.gaps.lost == 0


def test_undecodable_payloads_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    msgs = capture_messages("full_only")
    with RecordingWriter(path) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        w.write(ch, 0, msgs[0][2], BASE_NS)
        w.write(ch, 1, b"\xc1 not msgpack", BASE_NS + 1)
        w.write(ch, 2, msgs[2][2], BASE_NS + 2)
    result = runner.invoke(app, ["info", "-f", "json", str(path)])
    # Skipped input exits 3, as in `kvtool report`.
    assert result.exit_code == 3
    assert result.stderr == (
        f"kvtool: {path}: 1 undecodable payload and 0 undecodable events skipped\n"
    )
    out = json.loads(result.stdout)
    assert out["undecodable"] == 1 and out["batches"] == 3


def test_truncated_file_prints_what_was_recovered_and_exits_3(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    written = write_capture(path, "gemma3", chunk_size=2048)
    data = path.read_bytes()
    start, length = chunk_bodies(path)[4]
    cut = start + length + 100
    path.write_bytes(data[:cut])
    result = runner.invoke(app, ["info", "--format", "json", str(path)])
    assert result.exit_code == 3
    assert "Traceback" not in result.output
    out = json.loads(result.stdout)
    assert out["truncated"] is True and out["complete"] is False
    assert 0 < out["batches"] < len(written)
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"kvtool: {path}: recording is truncated at byte ")
    assert f"recovered {out['batches']} messages (seq 0-{out['batches'] - 1})" in lines[0]
    assert out["recovery"] == lines[0].removeprefix("kvtool: ")
    # The table says it too, and the same single stderr line.
    table = runner.invoke(app, ["info", str(path)])
    assert table.exit_code == 3
    assert "TRUNCATED" in table.stdout
    assert len(table.stderr.splitlines()) == 1


def test_damaged_chunk_in_middle_with_ledger(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    ledger: dict[str, object] = {"recovered": 3, "lost": 0, "lost_ranges": [], "restarts": 0}
    write_capture(path, "gemma3", chunk_size=2048, ledger=ledger)
    data = bytearray(path.read_bytes())
    start, length = chunk_bodies(path)[2]
    data[start + length - 10] ^= 0xFF
    path.write_bytes(bytes(data))
    info = summarize(path)
    assert not info.complete and not info.truncated
    assert info.gaps.source == "ledger+file"
    assert info.gaps.recovered == 3
    assert info.gaps.lost == 64 - info.batches
    assert len(info.gaps.lost_ranges) == 1
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 3
    assert "DAMAGED" in result.stdout
    assert result.stderr.count("\n") == 1 and "1 damaged chunk " in result.stderr


def test_table_output(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, "gemma3", groups=GROUPS)
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    for needle in (
        f"File:      {path}",
        "Batches:   64",
        "Events:    1,925 (BlockStored 396, BlockRemoved 1,528, AllBlocksCleared 1)",
        "Blocks:    stored 1,890 (30,240 tokens), removed 1,528",
        "Gaps:      none [from file]",
        "Restarts:  0",
        "Groups:    2 groups (from groups.json): 0=full_attention, 1=sliding_window:64",
        "Status:    complete",
        "Duration:  0.630 s",
        "  tcp://127.0.0.1:5557  ''        0       64  0-63",
    ):
        assert needle in out, needle
    assert all(line == line.rstrip() for line in out.splitlines())


def test_several_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.mcap", tmp_path / "b.mcap"
    write_capture(a, "gemma3", limit=3)
    write_capture(b, "full_only", limit=4)
    code, out, err = _info_json(str(a), str(b))
    assert code == 0 and err == ""
    assert isinstance(out, list) and [o["batches"] for o in out] == [3, 4]
    bad = tmp_path / "bad.mcap"
    bad.write_text("nope")
    result = runner.invoke(app, ["info", "-f", "json", str(a), str(bad)])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["batches"] == 3  # the readable file is still reported
    assert result.stderr.splitlines() == [
        f"kvtool: {bad}: not an MCAP file (starts with b'nope', not the MCAP magic); "
        "kvtool reads recordings written by `kvtool record`"
    ]


@pytest.mark.parametrize(
    ("content", "message", "status"),
    [
        (b"", "recording is truncated at byte 0 (the file is empty)", 3),
        (b"\x89MCAP0\r\n\x01", "recording is truncated at byte 9, before its MCAP header", 3),
        (b"PK\x03\x04 zip", "not an MCAP file", 1),
    ],
)
def test_unreadable_file_one_line(
    tmp_path: Path, content: bytes, message: str, status: int
) -> None:
    path = tmp_path / "x.mcap"
    path.write_bytes(content)
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == status
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvtool: {path}: ") and message in lines[0]


def test_newer_version_one_line(tmp_path: Path) -> None:
    path = tmp_path / "new.mcap"
    with RecordingWriter(path, context={"format_version": 3}) as w:
        w.add_channel(ENDPOINT)
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"kvtool: {path}: recording format version 3.0 is newer than this kvtool reads "
        "(up to 1); upgrade kvtool (pip install -U kvtool)\n"
    )


def test_empty_recording(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    with RecordingWriter(path):
        pass
    info = summarize(path)
    assert info.batches == 0 and info.channels == [] and info.duration_s == 0.0
    assert info.complete and info.start_time is None
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 0 and "Batches:   0" in result.stdout


def test_directory_means_its_recordings(tmp_path: Path) -> None:
    write_capture(tmp_path / "b.mcap", "gemma3", limit=2)
    write_capture(tmp_path / "a.mcap", "full_only", limit=3)
    (tmp_path / "notes.txt").write_text("not a recording")
    code, out, err = _info_json(str(tmp_path))
    assert code == 0, err
    assert isinstance(out, list)
    assert [(Path(o["file"]).name, o["batches"]) for o in out] == [("a.mcap", 3), ("b.mcap", 2)]
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["info", str(empty)])
    assert result.exit_code == 2
    assert result.stderr == f"kvtool: {empty}: directory holds no .mcap recordings\n"


def test_gaps_are_per_channel(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    payload = capture_messages("full_only")[0][2]
    with RecordingWriter(path) as w:
        a = w.add_channel("tcp://h:5557", "", 0)
        b = w.add_channel("tcp://h:5558", "", 1)
        for seq in range(10):
            if seq not in (5, 6):
                w.write(a, seq, payload, BASE_NS + seq)
            if seq not in (6, 7):
                w.write(b, seq, payload, BASE_NS + seq)
    info = summarize(path)
    assert info.gaps.lost == 4
    assert info.gaps.lost_ranges == [[5, 6], [6, 7]]


# -- issue 8.15 / 11.12: what info prints ------------------------------------------------

ESC = "\x1b]0;owned\x07\x1b[2J"


def test_issue8_15_strings_from_the_file_are_made_printable(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    groups: list[dict[str, object]] = [
        {"group_idx": 0, "kind": f"full{ESC}", "block_size": 16, "sliding_window": None}
    ]
    msgs = capture_messages("full_only")
    with RecordingWriter(path, context={"command_line": ["kvtool", f"record{ESC}"]}) as w:
        ch = w.add_channel(f"tcp://127.0.0.1:5557{ESC}", f"t{ESC}", 0)
        w.add_groups(groups, f"g{ESC}.json")
        for i, (_t, seq, payload) in enumerate(msgs[:3]):
            w.write(ch, seq, payload, BASE_NS + i)
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned\\x07" in out  # visible, escaped
    assert "full\\x1b]0;owned\\x07\\x1b[2J" in out
    assert "tcp://127.0.0.1:5557\\x1b" in out


def test_issue11_12_info_fits_100_columns_and_collapses_groups(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    kinds = ["full_attention"] + ["sliding_window"] * 5 + ["full_attention"] * 2
    groups: list[dict[str, object]] = [
        {
            "group_idx": i,
            "kind": k,
            "block_size": 16,
            "sliding_window": 64 if k == "sliding_window" else None,
        }
        for i, k in enumerate(kinds)
    ]
    argv = ["kvtool", "record", *[f"tcp://gpu-{n}.example.internal:5557" for n in range(12)]]
    with RecordingWriter(path, context={"command_line": argv}) as w:
        w.add_channel("tcp://" + "a" * 150 + ":5557", "", 0)
        w.add_groups(groups, "groups.json")
    result = runner.invoke(app, ["info", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    groups_line = next(line for line in lines if line.startswith("Groups:"))
    assert groups_line == (
        "Groups:    8 groups (from groups.json): 0=full_attention, 1-5=sliding_window:64, "
        "6-7=full_attention"
    )
    assert [line for line in lines if len(line) > 100] == []
    assert "tcp://" + "a" * 150 + ":5557" in "".join(line.strip() for line in lines)
    recorded = "\n".join(lines)
    assert "tcp://gpu-11.example.internal:5557" in recorded  # wrapped, not cut


def test_issue11_12_plural_forms(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, "gemma3", limit=1, groups=GROUPS[:1])
    result = runner.invoke(app, ["info", str(path)])
    out = result.stdout
    assert "Groups:    1 group (from groups.json): 0=full_attention" in out
    assert "(s)" not in out
    data = path.read_bytes()
    cut = tmp_path / "cut.mcap"
    start, length = chunk_bodies(path)[0]
    cut.write_bytes(data[: start + length // 2] + b"\x00" * 7 + data[start + length // 2 + 7 :])
    result = runner.invoke(app, ["info", str(cut)])
    assert "(s)" not in result.stderr and "1 damaged chunk skipped" in result.stderr


def test_issue11_12_lost_batches_in_status_and_exit_3(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    ledger: dict[str, object] = {
        "channels": [],
        "recovered": 0,
        "lost": 4,
        "lost_ranges": [[10, 12], [40, 40]],
        "restarts": 0,
    }
    write_capture(path, "gemma3", skip={10, 11, 12, 40}, ledger=ledger)
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 3
    assert "Status:    complete; 4 batches LOST while recording (see Gaps)" in result.stdout
    assert result.stderr == (
        f"kvtool: {path}: 4 batches were lost while recording (seq 10-12, 40); counts miss "
        "their events\n"
    )
    code, out, _ = _info_json(str(path))
    assert code == 3 and isinstance(out, dict) and out["gaps"]["lost"] == 4


def test_issue8_14_huge_group_idx_is_damage_and_the_rest_is_read(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    msgs = capture_messages("gemma3")
    bad: list[dict[str, object]] = [
        {"group_idx": 2**63 - 1, "kind": "sliding_window", "block_size": 16, "sliding_window": 64}
    ]
    with RecordingWriter(path) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        w.add_groups(bad, "bad.json")
        for i, (_t, seq, payload) in enumerate(msgs[:20]):
            w.write(ch, seq, payload, BASE_NS + i)
    info = summarize(path)
    assert info.batches == 20 and info.groups is None
    assert not info.complete
    assert info.recovery is not None and "kvtool.groups record is malformed" in info.recovery
    result = runner.invoke(app, ["report", "-f", "json", str(path)])
    assert result.exit_code == 3, result.stderr
    assert json.loads(result.stdout)["totals"]["store_events"] > 0


@pytest.mark.parametrize("name", ["sglang_full", "sglang_swa"])
def test_issue21_info_says_an_sglang_stream_is_sglang_like(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.mcap"
    write_capture(path, name)
    truth = capture_truth(name)
    info = summarize(path)
    assert info.source_like == "sglang"
    assert info.events == {**dict.fromkeys(info.events, 0), **truth["events_by_type"]}
    assert info.blocks_stored == truth["block_stored"]["blocks"]
    result = runner.invoke(app, ["info", str(path)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.stderr
    assert "SGLang-like" in result.stdout
    assert "sliding-window evictions send no event" in " ".join(result.stdout.split())


def test_issue21_a_vllm_stream_is_not_sglang_like(tmp_path: Path, capture: str) -> None:
    path = tmp_path / f"{capture}.mcap"
    write_capture(path, capture)
    # The legacy signed capture has signed hashes and no group_idx but no clear at seq 0.
    assert summarize(path).source_like is None


def test_issue20_info_takes_pool_blocks() -> None:
    """`info --pool-blocks N` shows the pool as report takes it (issue 20 D2)."""
    gemma3 = Path(__file__).parent.parent / "recordings" / "gemma3.mcap"
    plain = runner.invoke(app, ["info", str(gemma3), "--format", "json"])
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["pool_blocks"] is None
    given = runner.invoke(app, ["info", str(gemma3), "--format", "json", "--pool-blocks", "500"])
    assert given.exit_code == 0, given.output
    assert json.loads(given.stdout)["pool_blocks"] == 500
    table = runner.invoke(app, ["info", str(gemma3), "--pool-blocks", "500"])
    assert "500 blocks (num_gpu_blocks; 499 usable)" in table.stdout
    bad = runner.invoke(app, ["info", str(gemma3), "--pool-blocks", "0"])
    assert bad.exit_code == 2
    assert "--pool-blocks" in bad.output and "Traceback" not in bad.output
