"""One annotation core and one merge: replay, export and report agree on every event."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path

import msgspec
import polars as pl
import pytest
from typer.testing import CliRunner

from kvtool.annotate import Annotation, GroupLearner, StatusKinds, parse_group_flags
from kvtool.cli import app
from kvtool.columns import (
    CLEARED,
    REMOVED,
    STORED,
    ReadStats,
    annotate_table,
    iter_annotated,
    iter_tables,
    learn_table,
    make_annotator,
)
from kvtool.inputs import MergeFindings, merge_messages, resolve_annotation
from kvtool.protocol import BlockRemoved, BlockStored
from kvtool.recording import RecordingWriter, open_recording
from kvtool.replay import Replay
from kvtool.report import build_report
from tests.conftest import CAPTURES, capture_messages, capture_truth
from tests.replayutil import BASE_NS, STEP_NS, capture_recording, strip_payload, write_recording

runner = CliRunner()
ENC = msgspec.msgpack.Encoder()
A = "tcp://127.0.0.1:5557"
B = "tcp://127.0.0.1:6557"

KW = tuple[str | None, int | None]


# -- building edge-case recordings ------------------------------------------------------------


def stored(
    hashes: list[int],
    g: int | None,
    kind: str | None = None,
    window: int | None = None,
    *,
    legacy: bool = False,
) -> dict[str, object]:
    ev: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(4 * len(hashes))),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    if not legacy:
        ev["group_idx"] = g
    if kind is not None:
        ev["kv_cache_spec_kind"] = kind
    if window is not None:
        ev["kv_cache_spec_sliding_window"] = window
    return ev


def removed(hashes: list[int], g: int | None) -> dict[str, object]:
    ev: dict[str, object] = {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
    if g is not None:
        ev["group_idx"] = g
    return ev


def write(
    path: Path,
    channels: dict[str, list[list[dict[str, object]]]],
    groups: list[dict[str, object]] | None = None,
) -> Path:
    """One recording; each channel's batches are seqs 0.. interleaved by receive time."""
    with RecordingWriter(path) as w:
        if groups is not None:
            w.add_groups(groups, "test")
        ids = {ep: w.add_channel(ep, "", 0) for ep in channels}
        msgs = sorted(
            (BASE_NS + seq * STEP_NS + ci, ep, seq, events)
            for ci, (ep, batches) in enumerate(channels.items())
            for seq, events in enumerate(batches)
        )
        for t, ep, seq, events in msgs:
            w.write(ids[ep], seq, ENC.encode([t / 1e9, events, 0]), log_time=t)
    return path


def _edge_cases(tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    """name -> (recording, --group flags)."""
    out: dict[str, tuple[Path, list[str]]] = {}
    # The issue's disagreement: a group's first store has no kind, its second says one.
    out["mixed"] = (
        write(
            tmp / "mixed.mcap",
            {
                A: [
                    [stored([1], 1)],
                    [stored([2], 1, "sliding_window", 64), stored([3], 0, "full_attention")],
                    [removed([1], 1), stored([4], 0)],
                ]
            },
        ),
        [],
    )
    out["two-channels"] = (
        write(
            tmp / "two.mcap",
            {
                A: [
                    [stored([1], 1, "sliding_window", 128)],
                    [stored([2], 1)],
                    [removed([1, 2], 1)],
                ],
                B: [[stored([1], 1)], [stored([5], 1, "mamba")], [removed([1], 1)]],
            },
        ),
        [],
    )
    out["legacy-removes"] = (
        write(
            tmp / "legacy.mcap",
            {
                A: [
                    [stored([1], 0, "full_attention"), stored([1], 1, "sliding_window", 64)],
                    [stored([2], 1, "sliding_window", 64)],
                    [removed([2], None), removed([1], None)],
                    [stored([7], None, legacy=True), removed([7], None)],
                ]
            },
        ),
        [],
    )
    out["out-of-range"] = (
        write(
            tmp / "oor.mcap",
            {
                A: [
                    [stored([1], 0), stored([2], 7, "mamba"), stored([3], 1, "full_attention")],
                    [removed([2], 7), removed([3], 1), {"type": "AllBlocksCleared"}],
                ]
            },
        ),
        ["0=full_attention", "1=sliding_window:64"],
    )
    out["conflict"] = (
        write(
            tmp / "conflict.mcap",
            {
                A: [
                    [stored([1], 1, "full_attention")],
                    [stored([2], 1, "sliding_window", 64)],
                    [stored([3], 1), stored([4], 1, "sliding_window", 64)],
                    [removed([3, 1], 1)],
                ]
            },
        ),
        [],
    )
    out["recording-metadata"] = (
        write(
            tmp / "meta.mcap",
            {A: [[stored([1], 0, "mamba"), stored([2], 1)], [removed([1, 2], 0), stored([3], 9)]]},
            groups=[
                {"group_idx": 0, "kind": "full_attention", "block_size": 4, "sliding_window": None},
                {"group_idx": 1, "kind": "sliding_window", "block_size": 4, "sliding_window": 32},
            ],
        ),
        [],
    )
    return out


# -- the three views of one input -----------------------------------------------------------


def replay_view(paths: list[Path], flags: list[str]) -> tuple[list[tuple], list[tuple]]:
    """Stores and removes as ``replay --annotate`` gives them: (channel, seq, kind, window)."""
    stores, removes = [], []
    with Replay(paths, annotate=True, group_flags=flags or None) as rp:
        for item in rp:
            ch = item.message.channel.name
            for ev in item.events:
                if isinstance(ev, BlockStored):
                    stores.append(
                        (
                            ch,
                            item.message.seq,
                            ev.kv_cache_spec_kind,
                            ev.kv_cache_spec_sliding_window,
                        )
                    )
                elif isinstance(ev, BlockRemoved):
                    assert item.table is not None
                    kw = item.table.group(ev.group_idx) or (None, None)
                    removes.append((ch, item.message.seq, *kw))
    return stores, removes


def export_view(paths: list[Path], flags: list[str]) -> tuple[list[tuple], list[tuple]]:
    """The same from the exported (annotated) table, one row per event."""
    chunks = list(
        iter_annotated([str(p) for p in paths], group_flags=flags or None, chunk_bytes=64)
    )
    df = pl.concat(chunks).filter(pl.col("block_index") == 0)
    rows = df.select("channel", "seq", "kind", "sliding_window", "type_code").rows()
    stores = [(c, s, k, w) for c, s, k, w, t in rows if t == STORED]
    removes = [(c, s, k, w) for c, s, k, w, t in rows if t == REMOVED]
    assert all(t in (STORED, REMOVED, CLEARED) for *_, t in rows)
    return stores, removes


def assert_views_agree(paths: list[Path], flags: list[str]) -> None:
    r_stores, r_removes = replay_view(paths, flags)
    e_stores, e_removes = export_view(paths, flags)
    assert r_stores == e_stores
    assert r_removes == e_removes
    rep = build_report([str(p) for p in paths], group_flags=flags or None, chunk_bytes=64)
    by_kind = {r["kind"]: r for r in rep.by_kind.to_dicts()}
    want = Counter(k or "unannotated" for _c, _s, k, _w in r_stores)
    assert {k: r["store_events"] for k, r in by_kind.items() if r["store_events"]} == dict(want)
    by_window = {
        r["sliding_window"]: r["store_events"]
        for r in rep.by_window.to_dicts()
        if r["store_events"]
    }
    assert by_window == dict(Counter(w for _c, _s, _k, w in r_stores))
    # Removes that carry group_idx: the report's attribution is the group's annotation.
    if all(k is not None for _c, _s, k, _w in r_removes):
        got = {k: r["remove_events"] for k, r in by_kind.items() if r["remove_events"]}
        assert got == dict(Counter(k for _c, _s, k, _w in r_removes))


# -- issue 9, "done when" ---------------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("variant", ["as-recorded", "stripped+groups", "half-stripped"])
def test_issue9_1_every_capture_same_kind_in_replay_export_report(
    tmp_path: Path, name: str, variant: str
) -> None:
    msgs = capture_messages(name)
    flags: list[str] = []
    if variant == "stripped+groups":
        msgs = [(t, s, strip_payload(p)) for t, s, p in msgs]
        flags = [
            f"{g['group_idx']}={g['kind']}"
            + (f":{g['sliding_window']}" if g["sliding_window"] is not None else "")
            for g in capture_truth(name)["group_metadata"]
        ]
    elif variant == "half-stripped":
        # Unannotated stores first, annotated later: learned from the whole input.
        half = len(msgs) // 2
        msgs = [(t, s, strip_payload(p)) for t, s, p in msgs[:half]] + msgs[half:]
    rec = write_recording(tmp_path / f"{name}.mcap", msgs)
    assert_views_agree([rec], flags)


@pytest.mark.parametrize(
    "case",
    ["mixed", "two-channels", "legacy-removes", "out-of-range", "conflict", "recording-metadata"],
)
def test_issue9_1_edge_cases_same_kind_in_replay_export_report(tmp_path: Path, case: str) -> None:
    rec, flags = _edge_cases(tmp_path)[case]
    assert_views_agree([rec], flags)


@pytest.mark.parametrize(
    "case",
    ["mixed", "two-channels", "legacy-removes", "out-of-range", "conflict", "recording-metadata"],
)
def test_edge_cases_same_report_when_decoded_in_worker_processes(tmp_path: Path, case: str) -> None:
    """The decoding processes of ``--jobs 2`` hand the builder every column it reads.

    Removes without ``group_idx`` are attributed with the event index: a worker that left
    it out of its table made the sharded report fail (it was found by building the
    in-process table from the same column list).
    """
    rec, flags = _edge_cases(tmp_path)[case]
    one = build_report([str(rec)], group_flags=flags or None, chunk_bytes=64).to_dict()
    # chunk_bytes=64: the input is many chunks, so it is read by two processes.
    two = build_report([str(rec)], group_flags=flags or None, chunk_bytes=64, jobs=2).to_dict()
    assert two == one


def test_issue9_1_first_store_unannotated_second_annotated(tmp_path: Path) -> None:
    """The recorded disagreement: replay labelled both stores of group 1, report only one."""
    rec, _ = _edge_cases(tmp_path)["mixed"]
    stores, removes = replay_view([rec], [])
    assert [(k, w) for _c, _s, k, w in stores] == [
        ("sliding_window", 64),
        ("sliding_window", 64),
        ("full_attention", None),
        ("full_attention", None),
    ]
    assert [(k, w) for _c, _s, k, w in removes] == [("sliding_window", 64)]
    rep = build_report([str(rec)])
    row = {r["kind"]: r for r in rep.by_kind.to_dicts()}["sliding_window"]
    assert row["store_events"] == 2
    assert "unannotated" not in {r["kind"] for r in rep.by_kind.to_dicts() if r["store_events"]}


def test_issue9_1_two_channels_group_1_different_kinds(tmp_path: Path) -> None:
    rec, _ = _edge_cases(tmp_path)["two-channels"]
    stores, _ = replay_view([rec], [])
    assert {(c, k) for c, _s, k, _w in stores} == {(A, "sliding_window"), (B, "mamba")}


def test_issue9_1_conflict_resolved_the_same_way_and_listed(tmp_path: Path) -> None:
    rec, _ = _edge_cases(tmp_path)["conflict"]
    ann = resolve_annotation([rec])
    assert ann.learned == {(A, 0, 1): ("sliding_window", 64)}
    (c,) = ann.conflicts
    assert c.chosen == ("sliding_window", 64)
    assert [(kw, n) for kw, n, _seq in c.said] == [
        (("sliding_window", 64), 2),
        (("full_attention", None), 1),
    ]
    stores, removes = replay_view([rec], [])
    # A store keeps what it says; the unannotated store and the remove take the resolution.
    assert [k for _c, _s, k, _w in stores] == [
        "full_attention",
        "sliding_window",
        "sliding_window",
        "sliding_window",
    ]
    assert {k for _c, _s, k, _w in removes} == {"sliding_window"}
    check = runner.invoke(app, ["replay", str(rec), "--check"])
    assert check.exit_code == 1
    assert "conflicting annotations on tcp://127.0.0.1:5557 rank 0" in check.stdout
    assert "every command uses sliding_window (window 64)" in check.stdout
    rep = build_report([str(rec)])
    assert any("conflicting annotations" in f for f in rep.findings)
    ann_run = runner.invoke(app, ["replay", str(rec), "--annotate", "-f", "jsonl"])
    assert "conflicting annotations" in ann_run.stderr


def test_issue9_1_out_of_range_is_warned_and_left_alone(tmp_path: Path) -> None:
    rec, flags = _edge_cases(tmp_path)["out-of-range"]
    stores, _ = replay_view([rec], flags)
    assert [(k, w) for _c, _s, k, w in stores] == [
        ("full_attention", None),
        ("mamba", None),
        ("sliding_window", 64),
    ]
    ann = make_annotator([str(rec)], group_flags=flags)
    list(iter_tables([str(rec)]))
    st = ReadStats()
    for df in iter_tables([str(rec)], stats=st):
        ann(df, st)
    assert ann.out_of_range == {7: 1}


def test_issue9_1_cli_replay_jsonl_export_and_report_agree(tmp_path: Path) -> None:
    rec, _ = _edge_cases(tmp_path)["mixed"]
    out = runner.invoke(app, ["replay", str(rec), "--annotate", "--format", "jsonl"])
    assert out.exit_code == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    jsonl = [
        (e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window"))
        for e in lines
        if e.get("type") == "BlockStored"
    ]
    csv = tmp_path / "out.csv"
    exp = runner.invoke(app, ["export", str(rec), "-o", str(csv)])
    assert exp.exit_code == 0, exp.stderr
    table = pl.read_csv(csv).filter(
        (pl.col("type") == "BlockStored") & (pl.col("block_index") == 0)
    )
    assert list(zip(table["kind"], table["sliding_window"], strict=True)) == jsonl
    rep = runner.invoke(app, ["report", str(rec), "--format", "json"])
    assert rep.exit_code == 0, rep.stderr
    by_kind = {
        r["kind"]: r["store_events"] for r in json.loads(rep.stdout)["by_kind"] if r["store_events"]
    }
    assert by_kind == dict(Counter(k for k, _w in jsonl))


# -- the learner and the resolved annotation ----------------------------------------------------


def test_issue9_1_learner_does_not_depend_on_order_or_split() -> None:
    obs = [
        ("a", 0, 1, "sliding_window", 64, (3,)),
        ("a", 0, 1, "full_attention", None, (1,)),
        ("a", 0, 1, "full_attention", None, (5,)),
        ("a", 0, 1, "sliding_window", 64, (2,)),
        ("b", 1, 0, "mamba", None, (4,)),
    ]
    one = GroupLearner()
    for ch, r, g, k, w, pos in obs:
        one.observe_store(ch, r, g, k, w, position=pos)
    rev = GroupLearner()
    for ch, r, g, k, w, pos in reversed(obs):
        rev.observe_store(ch, r, g, k, w, position=pos)
    left, right = GroupLearner(), GroupLearner()
    for i, (ch, r, g, k, w, pos) in enumerate(obs):
        (left if i % 2 else right).observe_store(ch, r, g, k, w, position=pos)
    left.merge(right)
    # 2 vs 2: the tie goes to the value said first in merge order (position (1,)).
    want = {("a", 0, 1): ("full_attention", None), ("b", 1, 0): ("mamba", None)}
    assert one.resolved() == rev.resolved() == left.resolved() == want
    assert one.conflicts() == rev.conflicts() == left.conflicts()


def test_issue9_1_chunk_learning_equals_learning_pass_and_annotation_pickles(
    tmp_path: Path,
) -> None:
    rec, _ = _edge_cases(tmp_path)["conflict"]
    st = ReadStats()
    learner = GroupLearner()
    for df in iter_tables([str(rec)], stats=st, chunk_bytes=1):
        learner.merge(learn_table(df, st.channels))
    ann = resolve_annotation([rec])
    assert learner.resolved() == dict(ann.learned)
    assert learner.conflicts() == list(ann.conflicts)
    again = pickle.loads(pickle.dumps(ann))
    assert isinstance(again, Annotation) and again == ann
    # Chunks annotated in reverse order give the same rows.
    chunks = list(iter_tables([str(rec)], stats=st, chunk_bytes=1))
    fwd = [annotate_table(c, ann, st.channels) for c in chunks]
    bwd = [annotate_table(c, ann, st.channels) for c in reversed(chunks)][::-1]
    for a, b in zip(fwd, bwd, strict=True):
        assert a.equals(b)
        assert a.schema == chunks[0].schema


def test_status_kinds_adapter() -> None:
    table = parse_group_flags(["0=full_attention", "1=sliding_window:64"])
    st = StatusKinds(table)
    assert st.store("a", 1, None) == "sliding_window"
    assert st.store("a", 5, "mamba") == "mamba"
    assert st.store("a", None, None) == "unannotated"
    assert st.remove("a", 0) == "full_attention"
    assert st.remove("a", None) == "unattributed"
    learned = StatusKinds()
    assert learned.store("a", 1, None) == "unannotated"
    assert learned.store("a", 1, "mamba") == "mamba"
    assert learned.store("a", 1, None) == "mamba"
    assert learned.remove("a", 1) == "mamba"
    assert learned.remove("b", 1) == "unattributed"


# -- issue 8.5: no packed group keys -------------------------------------------------------------


def test_issue8_5_legacy_group_idx_does_not_borrow_another_channels_kind(tmp_path: Path) -> None:
    big = 2**24
    rec = write(
        tmp_path / "collide.mcap",
        {
            A: [[stored([1], big)], [removed([1], big)]],
            B: [[stored([2], 0, "mamba")], [stored([3], 0)], [removed([2], 0)]],
        },
    )
    stores, removes = export_view([rec], [])
    assert (A, 0, None, None) in stores
    assert (B, 1, "mamba", None) in stores
    assert (A, 1, None, None) in removes
    rep = build_report([str(rec)])
    by_kind = {r["kind"]: r for r in rep.by_kind.to_dicts()}
    assert by_kind["mamba"]["store_events"] == 2
    assert by_kind["unannotated"]["store_events"] == 1


def test_issue8_5_colliding_learned_keys_do_not_crash(tmp_path: Path) -> None:
    big = 2**24
    rec = write(
        tmp_path / "collide2.mcap",
        {
            A: [[stored([1], big, "sliding_window", 8)], [stored([4], big)]],
            B: [[stored([2], 0, "mamba")], [stored([3], 0)]],
        },
    )
    stores, _ = export_view([rec], [])
    assert [(c, k) for c, _s, k, _w in stores] == [
        (A, "sliding_window"),
        (B, "mamba"),
        (A, "sliding_window"),
        (B, "mamba"),
    ]
    assert_views_agree([rec], [])


# -- issue 9.2 / 8.8: one merge order, one definition of the same batch ---------------------------


def _totals(paths: list[Path]) -> dict[str, object]:
    rep = build_report([str(p) for p in paths])
    return rep.totals.to_dicts()[0]


def test_issue8_8_same_file_twice_is_counted_once(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")
    copy = tmp_path / "copy.mcap"
    copy.write_bytes(rec.read_bytes())
    one = _totals([rec])
    assert _totals([rec, rec]) == one
    assert _totals([rec, copy]) == one
    rep = build_report([str(rec), str(copy)])
    assert any("counted once" in f for f in rep.findings)
    with Replay([rec]) as rp:
        n = sum(1 for _ in rp)
    with Replay([rec, copy]) as rp:
        assert sum(1 for _ in rp) == n
        assert rp.merge_findings.duplicates == n
    out = runner.invoke(app, ["replay", str(rec), str(copy), "-f", "jsonl"])
    assert "counted once" in out.stderr


def test_issue8_8_file_plus_its_replay_slice_is_counted_once(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")
    part = tmp_path / "slice.mcap"
    res = runner.invoke(app, ["replay", str(rec), "--seq", "3:9", "-o", str(part)])
    assert res.exit_code == 0, res.stderr
    assert _totals([rec, part]) == _totals([rec])
    assert _totals([part, rec]) == _totals([rec])


def test_issue8_8_same_key_different_payload_keeps_both(tmp_path: Path) -> None:
    a = write(tmp_path / "a.mcap", {A: [[stored([1], 0, "full_attention")]]})
    b = write(tmp_path / "b.mcap", {A: [[stored([2], 0, "full_attention")]]})
    fnd = MergeFindings()
    with open_recording(a) as ra, open_recording(b) as rb:
        got = list(merge_messages([ra.messages(), rb.messages()], findings=fnd))
    assert len(got) == 2
    assert (fnd.duplicates, fnd.differing) == (0, 1)
    assert "both were kept" in fnd.lines()[0]
    assert _totals([a, b])["store_events"] == 2


def test_issue9_2_merge_order_is_receive_time_then_channel_then_seq(tmp_path: Path) -> None:
    """Ties on receive time are broken by channel, then seq, whatever the input order."""

    def rec(path: Path, ep: str, seqs: list[int]) -> Path:
        with RecordingWriter(path) as w:
            ch = w.add_channel(ep, "", 0)
            for s in seqs:
                w.write(ch, s, ENC.encode([1.0, [stored([s], 0)], 0]), log_time=BASE_NS)
        return path

    x = rec(tmp_path / "x.mcap", B, [0, 1])
    y = rec(tmp_path / "y.mcap", A, [0, 1])
    orders = []
    for paths in ([x, y], [y, x]):
        with Replay(paths) as rp:
            orders.append([(i.message.channel.endpoint, i.message.seq) for i in rp])
        df = pl.concat(list(iter_tables([str(p) for p in paths])))
        assert df.select("channel", "seq").rows() == orders[-1]
    assert orders[0] == orders[1] == [(A, 0), (A, 1), (B, 0), (B, 1)]


def test_issue8_8_export_of_two_copies_has_each_row_once(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "full_only")
    copy = tmp_path / "copy.mcap"
    copy.write_bytes(rec.read_bytes())
    one = pl.concat(list(iter_annotated([str(rec)])))
    two = pl.concat(list(iter_annotated([str(rec), str(copy)])))
    assert two.drop("recording").equals(one.drop("recording"))


@pytest.mark.parametrize("case", ["mixed", "conflict", "out-of-range", "two-channels"])
def test_issue9_1_wire_adapter_agrees_with_struct_adapter(tmp_path: Path, case: str) -> None:
    """``replay --publish --annotate`` sends what ``replay --annotate`` prints."""
    from kvtool.annotate import annotate
    from kvtool.protocol import decode_batch
    from kvtool.wire import annotate_payload

    rec, flags = _edge_cases(tmp_path)[case]
    with Replay([rec], annotate=True, group_flags=flags or None) as rp:
        for item in rp:
            assert item.table is not None and item.batch is not None
            wire, _bad = annotate_payload(item.message.data, item.table)
            want, _ = annotate(decode_batch(item.message.data), item.table)
            assert decode_batch(wire) == want == item.batch
