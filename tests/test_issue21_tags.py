"""Issue 21: unknown event tags counted by tag (info, report, both decoders); replay keeps
SGLang's ``cache_salt``."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from kvtool import columns, protocol
from kvtool.cli import app
from kvtool.recording import RecordingWriter
from tests.replayutil import capture_recording

runner = CliRunner()
ENC = msgspec.msgpack.Encoder()


def stored(hashes: list[int], group: int = 0) -> dict[str, object]:
    """A vLLM 0.33 map-encoded BlockStored (as tests/test_report.py's ``stored``)."""
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": group,
        "kv_cache_spec_kind": "full_attention",
        "kv_cache_spec_sliding_window": None,
    }


def unknown(tag: str, hashes: list[int]) -> dict[str, object]:
    """An event of a type kvtool does not know (vLLM's proposed BlockInactive …)."""
    return {"type": tag, "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


def batches(base: int = 0) -> list[list[dict[str, object]]]:
    """Five batches: 3 BlockInactive and 1 BlockTransferred among 4 known stores."""
    return [
        [stored([base + 1]), unknown("BlockInactive", [base + 1])],
        [unknown("BlockInactive", [base + 2]), stored([base + 2])],
        [stored([base + 3])],
        [unknown("BlockTransferred", [base + 3]), unknown("BlockInactive", [base + 4])],
        [stored([base + 4])],
    ]


def record(path: Path, evs: list[list[dict[str, object]]], endpoint: str) -> Path:
    """Record batches (array batch, map events) one per second on one channel."""
    with RecordingWriter(path) as w:
        ch = w.add_channel(endpoint, "", 0)
        for seq, events in enumerate(evs):
            ts = 1_700_000_000.0 + seq
            w.write(ch, seq, ENC.encode([ts, events, 0]), log_time=int(ts * 1e9))
    return path


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    return record(tmp_path / "tags.mcap", batches(), "tcp://127.0.0.1:5557")


def test_issue21_decode_batch_names_unknown_tags() -> None:
    """decode_batch keeps the tag of each unknown event, known or malformed ones not."""
    payload = ENC.encode(
        [1.0, [stored([1]), unknown("BlockInactive", [1]), {"type": "BlockStored", "x": 1}], 0]
    )
    bad = ENC.encode(
        [1.0, [unknown("BlockInactive", [1]), {"type": "BlockStored", "token_ids": 5}]]
    )
    assert protocol.decode_batch(payload).unknown_tags == ("BlockInactive",)
    b = protocol.decode_batch(bad)
    assert len(b.skipped) == 2
    assert b.unknown_tags == ("BlockInactive",)


@pytest.mark.parametrize("decoder", ["numba", "msgspec"])
def test_issue21_both_decoders_count_unknown_tags(rec: Path, decoder: columns.Decoder) -> None:
    """The numba scanner (msgspec fallback for such payloads) and msgspec count the same."""
    st = columns.ReadStats()
    for raw in columns.iter_raw_chunks([rec], stats=st):
        columns.add_decoded(columns.decode_chunk(raw, decoder=decoder), st)
    assert st.skipped_events == 4
    assert st.unknown_tags == {"BlockInactive": 3, "BlockTransferred": 1}
    assert st.events == 4


def test_issue21_info_table_and_json(rec: Path) -> None:
    """info: an "Unknown events:" row and ``unknown_events`` in JSON; exit 3 (data skipped)."""
    res = runner.invoke(app, ["info", str(rec)], env={"COLUMNS": "200"})
    assert res.exit_code == 3, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("Unknown events:"))
    assert line.split(":", 1)[1].strip() == "BlockInactive 3, BlockTransferred 1"
    # Unknown tags decode: worded apart from undecodable events, of which there are none.
    assert (
        "4 events of unknown type skipped (BlockInactive 3, BlockTransferred 1): decodable, "
        "but of a type this kvtool does not know (a newer vLLM?)"
    ) in res.stderr
    assert "undecodable" not in res.stderr.lower()
    assert not [x for x in res.stdout.splitlines() if x.startswith("Undecodable:")]
    res = runner.invoke(app, ["info", str(rec), "--format", "json"])
    assert res.exit_code == 3
    doc = json.loads(res.stdout)
    assert doc["skipped_events"] == 4
    assert doc["unknown_events"] == {"BlockInactive": 3, "BlockTransferred": 1}
    assert list(doc["unknown_events"]) == ["BlockInactive", "BlockTransferred"]


def test_issue21_info_words_unknown_and_undecodable_apart(tmp_path: Path) -> None:
    """A recording with an unknown tag and an undecodable event: each counted in its row."""
    bad = {"type": "BlockStored", "block_hashes": [9], "token_ids": 5}
    path = record(
        tmp_path / "both.mcap", [[unknown("BlockInactive", [1]), bad]], "tcp://127.0.0.1:5557"
    )
    res = runner.invoke(app, ["info", str(path)], env={"COLUMNS": "200"})
    assert res.exit_code == 3, res.output
    rows = {
        x.split(":", 1)[0]: x.split(":", 1)[1].strip() for x in res.stdout.splitlines() if ":" in x
    }
    assert rows["Undecodable"] == "0 payloads, 1 event skipped"
    assert rows["Unknown events"] == "BlockInactive 1"
    assert "0 undecodable payloads and 1 undecodable event skipped" in res.stderr
    assert "1 event of unknown type skipped (BlockInactive 1)" in res.stderr


FINDING = "3 events of unknown type BlockInactive, 1 BlockTransferred were skipped (a newer vLLM?)"


@pytest.mark.parametrize("decoder", ["numba", "msgspec"])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_issue21_report_counts_unknown_tags(
    tmp_path: Path, jobs: str, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """report: ``source.unknown_events`` and one finding naming every tag, for any --jobs
    (two recordings of two streams: two units of work merged) and either decoder."""
    if decoder == "msgspec":
        monkeypatch.setenv(columns.DECODER_ENV, "msgspec")
    a = record(tmp_path / "a.mcap", batches(), "tcp://127.0.0.1:5557")
    b = record(tmp_path / "b.mcap", batches(100), "tcp://127.0.0.1:5558")
    res = runner.invoke(app, ["report", str(a), str(b), "--jobs", jobs, "--format", "json"])
    assert res.exit_code == 3, res.output
    doc = json.loads(res.stdout)
    assert doc["source"]["skipped_events"] == 8
    assert doc["source"]["unknown_events"] == {"BlockInactive": 6, "BlockTransferred": 2}
    want = FINDING.replace("3 events", "6 events").replace("1 Block", "2 Block")
    assert want in doc["source"]["findings"]
    # Every skipped event was of an unknown type: no "undecodable event(s)" line as well.
    assert not [f for f in doc["source"]["findings"] if "undecodable event" in f]


def test_issue21_report_one_file_finding(rec: Path) -> None:
    """One recording: the finding reads as the issue words it, on the table too."""
    res = runner.invoke(app, ["report", str(rec), "--format", "json"])
    assert res.exit_code == 3
    assert FINDING in json.loads(res.stdout)["source"]["findings"]


def test_issue21_distinct_tags_are_bounded_and_printable(tmp_path: Path) -> None:
    """At most 64 tags by name (the rest under "(other)"); a tag's escape never prints raw."""
    evs = [[unknown(f"Tag{i:02d}", [i])] for i in range(70)]
    evs.append([unknown("Evil\x1b[2J", [1])])
    path = record(tmp_path / "many.mcap", evs, "tcp://127.0.0.1:5557")
    res = runner.invoke(app, ["info", str(path), "--format", "json"])
    doc = json.loads(res.stdout)["unknown_events"]
    assert len(doc) == protocol.MAX_UNKNOWN_TAGS + 1
    assert doc[protocol.OTHER_TAGS] == 71 - protocol.MAX_UNKNOWN_TAGS
    evs = [[unknown("Evil\x1b[2J", [1])], [unknown("Evil\x1b[2J", [2])]]
    path = record(tmp_path / "evil.mcap", evs, "tcp://127.0.0.1:5557")
    res = runner.invoke(app, ["info", str(path)], env={"COLUMNS": "200"})
    assert "\x1b" not in res.stdout + res.stderr
    assert "Evil\\x1b[2J 2" in res.stdout
    res = runner.invoke(app, ["report", str(path)], env={"COLUMNS": "200"})
    assert "\x1b" not in res.stdout + res.stderr
    assert "2 events of unknown type Evil\\x1b[2J were skipped" in res.stdout + res.stderr


def test_issue21_replay_jsonl_keeps_cache_salt(tmp_path: Path) -> None:
    """SGLang 0.5.23's BlockStored ``cache_salt`` (map events) survives replay --format jsonl."""
    path = capture_recording(tmp_path, "sglang_full")
    res = runner.invoke(app, ["replay", str(path), "--format", "jsonl"])
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in res.stdout.splitlines()]
    salts = [r["cache_salt"] for r in recs if r["type"] == "BlockStored" and r["cache_salt"]]
    assert len(salts) == 18
    assert sorted(set(salts)) == ["salt-0", "salt-1", "salt-2"]
    ev = protocol.decode_batch(ENC.encode([1.0, [{**stored([1]), "cache_salt": "s"}]])).events[0]
    assert isinstance(ev, protocol.BlockStored) and ev.cache_salt == "s"
