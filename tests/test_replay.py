"""kvtool replay: annotation against vLLM's own output, --check, filters, merging, -o."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.protocol import decode_batch, event_to_builtins
from kvtool.recording import RecordingWriter, open_recording
from kvtool.replay import BatchFilter, EventFilter, Replay, parse_seq_range, parse_time_bound
from tests.conftest import CAPTURES, capture_messages, capture_truth
from tests.replayutil import BASE_NS, STEP_NS, capture_recording, write_recording

GROUPS = Path(__file__).parent / "data" / "groups"
runner = CliRunner()

# The capture whose events vLLM annotated, for each capture (the group-idx layout has no
# kinds on the wire; the same workload in the last array layout has them).
ANNOTATED_TWIN = {"gemma3.legacy-array-group-idx": "gemma3.legacy-array-spec-kind"}


def _groups_file(tmp_path: Path, name: str) -> Path:
    f = tmp_path / f"{name}.groups.json"
    f.write_text(json.dumps(capture_truth(name)["group_metadata"]))
    return f


def _vllm_events(name: str) -> list[dict[str, object]]:
    return [
        event_to_builtins(e)
        for _, seq, p in capture_messages(ANNOTATED_TWIN.get(name, name))
        for e in decode_batch(p, seq=seq).events
    ]


def _jsonl(result: object) -> list[dict[str, object]]:
    return [json.loads(line) for line in result.stdout.splitlines()]  # type: ignore[attr-defined]


def _run(*args: object) -> object:
    return runner.invoke(app, ["replay", *map(str, args)])


# -- annotation reproduces vLLM -------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
def test_stripped_capture_annotates_to_what_vllm_produced(tmp_path: Path, name: str) -> None:
    rec = capture_recording(tmp_path, name, strip=True)
    result = _run(
        rec,
        "--annotate",
        "--groups",
        _groups_file(tmp_path, name),
        "--format",
        "jsonl",
        "--hash-format",
        "int",
    )
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    got = _jsonl(result)
    want = _vllm_events(name)
    assert len(got) == len(want) == capture_truth(name)["num_events"]
    for g, w in zip(got, want, strict=True):
        assert g.get("kv_cache_spec_kind") == w.get("kv_cache_spec_kind")
        assert g.get("kv_cache_spec_sliding_window") == w.get("kv_cache_spec_sliding_window")
        assert {
            k: v for k, v in g.items() if k not in ("seq", "ts", "log_time", "channel", "dp_rank")
        } == w
    # ... and the per-kind/window totals are the truth file's.
    counts: Counter[tuple[object, object]] = Counter()
    for g in got:
        if g["type"] == "BlockStored":
            counts[(g["kv_cache_spec_kind"], g["kv_cache_spec_sliding_window"])] += 1
    truth = capture_truth(name)["block_stored"]["by_kind_window"]
    if all(g["group_idx"] is not None for g in got if g["type"] == "BlockStored"):
        assert counts == {(t["kind"], t["sliding_window"]): t["events"] for t in truth}
    assert "annotating with group metadata from" in result.stderr  # type: ignore[attr-defined]


def test_spec_description_groups_file_annotates_like_metadata(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3", strip=True)
    result = _run(rec, "--annotate", "--groups", GROUPS / "gemma3.specs.json", "-f", "jsonl")
    assert result.exit_code == 0
    assert [
        (e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window")) for e in _jsonl(result)
    ] == [
        (e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window"))
        for e in _vllm_events("gemma3")
    ]


def test_recording_metadata_is_used_and_named(tmp_path: Path) -> None:
    meta = capture_truth("gemma3")["group_metadata"]
    rec = capture_recording(tmp_path, "gemma3", strip=True, groups=meta)
    result = _run(rec, "--annotate", "-f", "jsonl", "--type", "BlockStored")
    assert result.exit_code == 0
    assert f"{rec} (metadata record)" in result.stderr  # type: ignore[attr-defined]
    assert all(e["kv_cache_spec_kind"] for e in _jsonl(result))


def test_learned_from_annotated_stores(tmp_path: Path) -> None:
    """Without metadata, what annotated stores say per group annotates the others."""
    orig = capture_messages("gemma3")
    from tests.replayutil import strip_payload

    half = len(orig) // 2
    mixed = orig[:half] + [(t, s, strip_payload(p)) for t, s, p in orig[half:]]
    rec = write_recording(tmp_path / "mixed.mcap", mixed)
    result = _run(rec, "--annotate", "-f", "jsonl")
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    assert "learned from annotated stores per (channel, rank, group)" in result.stderr  # type: ignore[attr-defined]
    got = _jsonl(result)
    assert [(e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window")) for e in got] == [
        (e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window"))
        for e in _vllm_events("gemma3")
    ]


def test_learned_tables_are_per_channel(tmp_path: Path) -> None:
    """Two engines (channels) with different kinds for group 0 are learned separately."""
    rec = tmp_path / "two.mcap"
    from kvtool.recording import RecordingWriter
    from tests.replayutil import strip_payload

    a = capture_messages("gemma3")
    b = capture_messages("full_only")
    with RecordingWriter(rec) as w:
        ca = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        cb = w.add_channel("tcp://127.0.0.1:6557", "", 0)
        for i, (_, s, p) in enumerate(a):
            w.write(ca, s, p if i < 5 else strip_payload(p), BASE_NS + i * STEP_NS)
        for i, (_, s, p) in enumerate(b):
            w.write(cb, s, p, BASE_NS + i * STEP_NS + 1)
    with Replay([rec], annotate=True) as rp:
        kinds = {
            (it.message.channel.name, ev.group_idx, ev.kv_cache_spec_kind)  # type: ignore[union-attr]
            for it in rp
            for ev in it.events
            if type(ev).__name__ == "BlockStored"
        }
    assert ("tcp://127.0.0.1:5557", 1, "sliding_window") in kinds
    assert ("tcp://127.0.0.1:6557", 0, "full_attention") in kinds
    assert not any(k is None for _, _, k in kinds)


def test_out_of_range_warned_once_per_index(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3", strip=True)
    result = _run(
        rec,
        "--annotate",
        "--group-meta",
        "0=full_attention",
        "--group-meta",
        "1=sliding_window:64",
        "-f",
        "jsonl",
    )
    assert result.exit_code == 0
    err = result.stderr  # type: ignore[attr-defined]
    for idx in (2, 3, 4, 5):
        assert err.count(f"warning: seq 0: Group index `{idx}` not in KV cache metadata\n") == 1
        assert f"Group index `{idx}` not in KV cache metadata (66 stores left unannotated)" in err
    stores = [e for e in _jsonl(result) if e["type"] == "BlockStored"]
    assert {e["kv_cache_spec_kind"] for e in stores if e["group_idx"] >= 2} == {None}


# -- --check --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [c for c in CAPTURES if c != "gemma3.legacy-array-group-idx"])
def test_check_original_capture_agrees(tmp_path: Path, name: str) -> None:
    rec = capture_recording(tmp_path, name)
    kinds = {e.get("kv_cache_spec_kind") for e in _vllm_events(name) if e["type"] == "BlockStored"}
    for extra in (["--groups", str(_groups_file(tmp_path, name))], []):
        result = _run(rec, "--check", *extra)
        if not extra and kinds == {None}:
            # No metadata, no kind on the wire: nothing to check against (issue 24).
            assert result.exit_code == 2, result.stdout  # type: ignore[attr-defined]
            assert "nothing to check the " in result.stderr  # type: ignore[attr-defined]
            continue
        assert result.exit_code == 0, result.stdout  # type: ignore[attr-defined]
        assert result.stdout == ""  # type: ignore[attr-defined]
        assert "no disagreement" in result.stderr  # type: ignore[attr-defined]


def test_check_capture_without_kinds_reports_unannotated(tmp_path: Path) -> None:
    name = "gemma3.legacy-array-group-idx"
    rec = capture_recording(tmp_path, name)
    result = _run(rec, "--check", "--groups", _groups_file(tmp_path, name))
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [  # type: ignore[attr-defined]
        f"group {g}: 66 stores left unannotated; first at seq 0" for g in range(6)
    ]


def test_issue24_check_without_metadata_or_kinds_has_nothing_to_check(tmp_path: Path) -> None:
    """Issue 24: on the legacy layout without metadata, --check compared the stores with
    what it learned from them and said '6 group(s) disagree'."""
    rec = capture_recording(tmp_path, "gemma3.legacy-array-group-idx")
    result = _run(rec, "--check")
    assert result.exit_code == 2
    assert result.stdout == ""  # type: ignore[attr-defined]
    assert result.stderr.splitlines() == [  # type: ignore[attr-defined]
        "kvtool: checking: no group metadata; the stores are compared only with each other",
        "kvtool: --check: nothing to check the 396 stores against: no group metadata, and no "
        "store carries a kind; give --groups FILE or --group-meta IDX=KIND[:WINDOW]",
    ]
    # Stores that say their kind are compared with each other, and say so.
    ok = _run(capture_recording(tmp_path, "gemma3"), "--check")
    assert ok.exit_code == 0
    assert (
        "checked 396 stores (396 without metadata only against each other (the stores of "
        "their channel, rank and group)): no disagreement"
    ) in " ".join(ok.stderr.split())  # type: ignore[attr-defined]


def test_check_of_an_empty_recording_says_it_checked_nothing(tmp_path: Path) -> None:
    """An empty recording said 'checked 0 stores (): no disagreement' and 'from none'."""
    rec = tmp_path / "empty.mcap"
    with RecordingWriter(rec):
        pass
    result = _run(rec, "--annotate", "--check")
    assert result.exit_code == 0
    assert result.stdout == ""  # type: ignore[attr-defined]
    assert result.stderr.splitlines() == [  # type: ignore[attr-defined]
        "kvtool: annotating with group metadata from none (the input has no channel)",
        "kvtool: checked no stores (the input holds none): nothing to compare",
    ]


def test_check_wrong_table_reports_exactly_the_wrong_groups(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")
    result = _run(rec, "--check", "--groups", GROUPS / "gemma3.wrong.json")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()  # type: ignore[attr-defined]
    assert [ln.split(":")[0] for ln in lines] == ["group 2", "group 3", "group 5"]
    assert lines[0] == (
        "group 2: metadata says sliding_window (window 128), but 66 stores "
        "say sliding_window (window 64); first at seq 0"
    )
    assert "metadata says full_attention (no window)" in lines[1]
    assert "66 stores carry group_idx 5, which is not in the metadata" in lines[2]


def test_check_learned_kind_change_mid_stream(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")
    # Second half re-annotated with a different window for group 1 (and only group 1).
    from kvtool.annotate import parse_group_flags
    from kvtool.wire import annotate_payload
    from tests.replayutil import strip_payload

    table = parse_group_flags(
        [
            "0=full_attention",
            "1=sliding_window:128",
            *(f"{g}=sliding_window:64" for g in range(2, 6)),
        ]
    )
    half = len(msgs) // 2
    changed = msgs[:half] + [
        (t, s, annotate_payload(strip_payload(p), table)[0]) for t, s, p in msgs[half:]
    ]
    rec = write_recording(tmp_path / "changed.mcap", changed)
    result = _run(rec, "--check")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1
    assert lines[0].startswith("group 1: ")
    assert "conflicting annotations on tcp://127.0.0.1:5557 rank 0" in lines[0]


# -- output formats ---------------------------------------------------------------------------


def test_jsonl_contract(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3.byteshash")
    result = _run(rec, "-f", "jsonl", "--seq", "0:0")
    first = _jsonl(result)[0]
    assert list(first)[:7] == [
        "seq",
        "ts",
        "log_time",
        "channel",
        "dp_rank",
        "type",
        "block_hashes",
    ]
    assert first["seq"] == 0 and first["log_time"] == BASE_NS
    assert first["channel"] == "tcp://127.0.0.1:5557" and first["dp_rank"] == 0
    h = first["block_hashes"][0]  # type: ignore[index]
    assert isinstance(h, str) and len(h) == 64 and h == h.lower()
    rec2 = capture_recording(tmp_path, "full_only.legacy-array-initial.signed")
    ints = _jsonl(_run(rec2, "-f", "jsonl", "--hash-format", "int"))
    hashes = [h for e in ints for h in e.get("block_hashes", [])]  # type: ignore[attr-defined]
    assert all(isinstance(h, int) for h in hashes) and min(hashes) < 0


def test_default_format_is_jsonl_when_piped_and_pretty_renders(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")
    piped = _run(rec, "--seq", "0")
    assert piped.stdout.startswith('{"seq":0,')  # type: ignore[attr-defined]
    pretty = _run(rec, "--seq", "0", "-f", "pretty")
    assert pretty.exit_code == 0
    assert "BlockStored" in pretty.stdout and "sliding_window w64" in pretty.stdout  # type: ignore[attr-defined]


@pytest.mark.parametrize("columns", [80, 100, 200])
def test_pretty_lines_fit_the_width(
    tmp_path: Path, columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At 80 columns the token count and then the hash give way; the type, group, kind,
    # window and block count always stay, aligned from line to line.
    monkeypatch.setenv("COLUMNS", str(columns))
    rec = capture_recording(tmp_path, "gemma3")
    res = _run(rec, "-f", "pretty")
    assert res.exit_code == 0  # type: ignore[attr-defined]
    lines = res.stdout.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == capture_truth("gemma3")["num_events"]
    assert max(len(ln) for ln in lines) <= columns
    assert all(ln == ln.rstrip() for ln in lines)
    events = [ln for ln in lines if "BlockStored" in ln or "BlockRemoved" in ln]
    assert len({ln.index(" g") for ln in events}) == 1  # aligned
    assert any(ln.endswith(" 1 block") or " 1 block " in ln for ln in lines)
    assert not any(" 1 blocks" in ln for ln in lines)
    stored = [ln for ln in lines if "BlockStored" in ln]
    assert all("sliding_window w64" in ln or "full_attention" in ln for ln in stored)
    assert all(("tokens" in ln) == (columns >= 200) for ln in stored)
    assert all(("hash " in ln) == (columns >= 100) for ln in stored)


# -- filters ----------------------------------------------------------------------------------


def test_event_filters(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")

    def kinds(*args: object) -> Counter[tuple[object, ...]]:
        return Counter(
            (e["type"], e.get("kv_cache_spec_kind"), e.get("group_idx"))
            for e in _jsonl(_run(rec, "-f", "jsonl", *args))
        )

    assert set(kinds("--type", "BlockRemoved")) <= {("BlockRemoved", None, g) for g in range(6)}
    assert sum(kinds("--type", "removed,cleared").values()) == 1528 + 1
    full = kinds("--kind", "full_attention")
    assert set(full) == {("BlockStored", "full_attention", 0)} and full.total() == 66
    assert kinds("--window", "64").total() == 330
    assert kinds("--window", "none").total() == 66
    assert set(kinds("--group", "2")) == {
        ("BlockStored", "sliding_window", 2),
        ("BlockRemoved", None, 2),
    }
    assert kinds("--kind", "unannotated").total() == 0


def test_batch_filters(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "full_only")

    def seqs(*args: object) -> list[int]:
        return sorted({e["seq"] for e in _jsonl(_run(rec, "-f", "jsonl", *args))})  # type: ignore[misc]

    assert seqs("--seq", "3:5") == [3, 4, 5]
    assert seqs("--seq", "70:") == [70, 71, 72, 73]
    # 1 ms between batches: seconds from the start.
    assert seqs("--since", "0.010", "--until", "12ms") == [10, 11, 12]
    iso = "2025-11-24T16:00:00.005+00:00"  # BASE_NS is 2025-11-24T16:00:00Z
    assert seqs("--since", iso)[0] == 5
    assert seqs("--channel", "tcp://127.0.0.1:5557") == seqs()
    assert seqs("--channel", "5557") == seqs()
    assert seqs("--channel", "tcp://*:6000") == []
    assert seqs("--rank", "0") == seqs()
    assert seqs("--rank", "1") == []


def test_merge_by_receive_time(tmp_path: Path) -> None:
    a = capture_messages("full_only")[:10]
    b = capture_messages("gemma3")[:10]
    ra = write_recording(tmp_path / "a.mcap", a, endpoint="tcp://127.0.0.1:5557")
    rb = write_recording(
        tmp_path / "b.mcap",
        b,
        endpoint="tcp://127.0.0.1:5558",
        dp_rank=1,
        base_ns=BASE_NS + STEP_NS // 2,
    )
    with Replay([rb, ra]) as rp:
        order = [(it.message.channel.endpoint, it.message.seq, it.dp_rank) for it in rp]
    assert [o[0][-4:] for o in order] == ["5557", "5558"] * 10
    assert [o[1] for o in order] == [i // 2 for i in range(20)]
    assert {o[2] for o in order} == {0, 1}
    result = _run(ra, rb, "-f", "jsonl", "--rank", "1")
    assert {e["channel"] for e in _jsonl(result)} == {"tcp://127.0.0.1:5558"}


def test_library_filters_without_decoding(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")
    with Replay([rec], batch_filter=BatchFilter(seq_first=2, seq_last=3)) as rp:
        items = list(rp)
    assert [i.message.seq for i in items] == [2, 3]
    assert all(i.batch is None for i in items)  # nothing needed decoding
    with Replay([rec], event_filter=EventFilter(types=frozenset({"AllBlocksCleared"}))) as rp:
        items = list(rp)
    assert len(items) == 1 and rp.stats.events == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--type", "Stored2"], "--type 'Stored2': expected one of"),
        (["--seq", "5:2"], "--seq '5:2': the range is empty"),
        (["--seq", "a:b"], "expected A:B"),
        (["--since", "yesterday"], "--since 'yesterday': expected seconds"),
        (["--window", "wide"], "--window 'wide'"),
        (["--rank", "x"], "--rank 'x'"),
        (["--group", "two"], "--group 'two'"),
        (["--groups", "g.json"], "give metadata for --annotate or --check"),
        (["--group-meta", "0=full_attention"], "give metadata for --annotate or --check"),
        (["--group", "0=full_attention"], "give group metadata as --group-meta 0=full"),
        (
            ["--annotate", "--group-meta", "0=full_attention", "--group-meta", "0=mamba"],
            "given twice",
        ),
        (["--check", "-o", "x.mcap"], "--check only reports"),
    ],
)
def test_bad_flags_one_line_exit_2(tmp_path: Path, args: list[str], match: str) -> None:
    rec = capture_recording(tmp_path, "full_only")
    result = _run(rec, *args)
    assert result.exit_code == 2, result.stderr  # type: ignore[attr-defined]
    assert result.stderr.count("\n") == 1  # type: ignore[attr-defined]
    assert match in result.stderr  # type: ignore[attr-defined]
    assert result.stdout == ""  # type: ignore[attr-defined]


def test_parsers() -> None:
    assert parse_seq_range("7") == (7, 7)
    assert parse_seq_range(":9") == (None, 9)
    assert parse_time_bound("2m").offset_ns == 120_000_000_000
    assert parse_time_bound("2026-01-01T00:00:00").absolute_ns == 1_767_225_600_000_000_000


# -- -o ---------------------------------------------------------------------------------------


def test_output_copies_selected_batches_unchanged(tmp_path: Path) -> None:
    meta = capture_truth("gemma3")["group_metadata"]
    rec = capture_recording(tmp_path, "gemma3", groups=meta)
    out = tmp_path / "slice.mcap"
    result = _run(rec, "--seq", "10:19", "-o", out)
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    assert result.stdout == ""  # type: ignore[attr-defined]
    assert f"wrote 10 batches to {out}" in result.stderr  # type: ignore[attr-defined]
    with open_recording(out) as r:
        got = [
            (m.seq, m.data, m.log_time, m.channel.endpoint, m.channel.dp_rank) for m in r.messages()
        ]
        assert r.groups == meta
        assert r.recovery.complete
    want = capture_messages("gemma3")[10:20]
    assert [(s, d) for s, d, *_ in got] == [(s, p) for _, s, p in want]
    assert got[0][2] == BASE_NS + 10 * STEP_NS
    assert got[0][3:] == ("tcp://127.0.0.1:5557", 0)
    again = _run(rec, "-o", out)
    assert again.exit_code != 0 and "file exists" in again.stderr  # type: ignore[attr-defined]
    assert _run(rec, "-o", out, "--force", "--kind", "mamba").exit_code == 0


def test_output_with_annotate_keeps_bytes_and_stores_the_table(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3", strip=True)
    out = tmp_path / "annotated.mcap"
    result = _run(rec, "--annotate", "--groups", GROUPS / "gemma3.json", "-o", out)
    assert result.exit_code == 0
    with open_recording(out) as r:
        data = [m.data for m in r.messages()]
        groups = r.groups
    with open_recording(rec) as r:
        assert data == [m.data for m in r.messages()]
    assert groups == json.loads((GROUPS / "gemma3.json").read_text())


# -- damage ----------------------------------------------------------------------------------


def test_truncated_recording_replays_what_is_left_exit_3(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3", chunk_size=16 * 1024)
    data = rec.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = _run(cut, "-f", "jsonl")
    assert result.exit_code == 3
    assert len(_jsonl(result)) > 0
    assert "cut.mcap" in result.stderr  # type: ignore[attr-defined]


def test_undecodable_payload_is_skipped_exit_3(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")[:4]
    msgs[1] = (b"", 1, b"\xc1 not msgpack")
    rec = write_recording(tmp_path / "bad.mcap", msgs)
    result = _run(rec, "-f", "jsonl")
    assert result.exit_code == 3
    assert {e["seq"] for e in _jsonl(result)} == {0, 2, 3}
    assert "1 payload and 0 events could not be decoded" in result.stderr  # type: ignore[attr-defined]


def test_learned_mode_with_nothing_to_learn_says_so(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3.legacy-array-group-idx")
    result = _run(rec, "--annotate", "-f", "jsonl", "--seq", "0")
    assert result.exit_code == 0
    err = result.stderr  # type: ignore[attr-defined]
    assert "no store carries a kind to learn from" in err
    assert "not in KV cache metadata" not in err  # vLLM's warning is about real metadata
    assert {e.get("kv_cache_spec_kind") for e in _jsonl(result)} == {None}


def test_an_existing_output_is_refused_in_one_line_before_anything_is_said(
    tmp_path: Path,
) -> None:
    # Before: the "annotating with group metadata" line came first, then the refusal.
    rec = capture_recording(tmp_path, "gemma3")
    out = tmp_path / "copy.mcap"
    assert _run(rec, "-o", out).exit_code == 0  # type: ignore[attr-defined]
    res = _run(rec, "--annotate", "-o", out)
    assert res.exit_code == 2  # type: ignore[attr-defined]
    assert res.stderr.strip().splitlines() == [  # type: ignore[attr-defined]
        f"kvtool: {out}: file exists; pass --force to overwrite it"
    ]
