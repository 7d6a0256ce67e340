"""Annotation: vLLM's take_events rule, group tables, spec descriptions, learning, checking."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from kvtool.annotate import (
    Annotator,
    Checker,
    GroupInfo,
    GroupLearner,
    GroupTable,
    annotate,
    groups_from_list,
    load_groups_file,
    parse_group_flags,
    resolve_groups,
    spec_kind,
    spec_sliding_window,
)
from kvtool.cli import app
from kvtool.errors import MetadataError
from kvtool.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    event_to_builtins,
)
from kvtool.wire import annotate_payload
from tests.conftest import capture_messages, capture_truth
from tests.replayutil import capture_recording

GROUPS = Path(__file__).parent / "data" / "groups"
GEMMA_REC = Path(__file__).resolve().parent.parent / "recordings" / "gemma3.mcap"
runner = CliRunner()


def _stored(
    group_idx: int | None,
    kind: str | None = None,
    window: int | None = None,
) -> BlockStored:
    return BlockStored(
        block_hashes=[1, 2],
        token_ids=[1] * 32,
        block_size=16,
        group_idx=group_idx,
        kv_cache_spec_kind=kind,
        kv_cache_spec_sliding_window=window,
    )


def _batch(*events: object) -> KVEventBatch:
    return KVEventBatch(ts=1.0, events=list(events))  # type: ignore[arg-type]


TABLE = parse_group_flags(["0=full_attention", "1=sliding_window:64"])


# -- the rule (vllm/v1/core/kv_cache_manager.py take_events) ------------------------------


def test_in_range_store_gets_kind_and_window() -> None:
    out, warnings = annotate(_batch(_stored(1)), TABLE)
    ev = out.events[0]
    assert isinstance(ev, BlockStored)
    assert (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window) == ("sliding_window", 64)
    assert warnings == []


def test_in_range_store_is_overwritten_both_fields() -> None:
    """Both fields come from the table, even a None window over a recorded one."""
    out, _ = annotate(_batch(_stored(0, "sliding_window", 128)), TABLE)
    ev = out.events[0]
    assert isinstance(ev, BlockStored)
    assert (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window) == ("full_attention", None)


def test_group_none_untouched() -> None:
    ev = _stored(None, "mamba", None)
    out, warnings = annotate(_batch(ev), TABLE)
    assert out.events[0] is ev
    assert warnings == []


@pytest.mark.parametrize("idx", [2, 7, -1])
def test_out_of_range_warns_with_vllm_wording_and_leaves_event(idx: int) -> None:
    ev = _stored(idx, None, None)
    out, warnings = annotate(_batch(ev), TABLE)
    assert out.events[0] is ev
    assert warnings == [f"Group index `{idx}` not in KV cache metadata"]


def test_only_block_stored_is_touched() -> None:
    rem = BlockRemoved(block_hashes=[1], group_idx=1)
    clr = AllBlocksCleared()
    batch = _batch(rem, clr)
    out, warnings = annotate(batch, TABLE)
    assert out is batch
    assert warnings == []


def test_array_events_keep_their_class() -> None:
    _, _, payload = capture_messages("gemma3.legacy-array-group-idx")[0]
    batch = decode_batch(payload)
    table = groups_from_list(capture_truth("gemma3")["group_metadata"], source="t")
    out, _ = annotate(batch, table)
    assert [type(e) for e in out.events] == [type(e) for e in batch.events]
    assert out.event_encoding == "array"


def test_annotator_counts_and_warns_once_per_index() -> None:
    ann = Annotator(TABLE)
    _, w1 = ann(_batch(_stored(5), _stored(5), _stored(0), _stored(6)))
    _, w2 = ann(_batch(_stored(5), _stored(6), _stored(7)))
    assert w1 == [
        "Group index `5` not in KV cache metadata",
        "Group index `6` not in KV cache metadata",
    ]
    assert w2 == ["Group index `7` not in KV cache metadata"]
    assert dict(ann.out_of_range) == {5: 3, 6: 2, 7: 1}
    assert ann.summary()[0] == (
        "Group index `5` not in KV cache metadata (3 stores left unannotated)"
    )


def test_unknown_kind_string_is_a_kind() -> None:
    table = groups_from_list(
        [{"group_idx": 0, "kind": "linear_attention_v9", "block_size": 16, "sliding_window": None}],
        source="t",
    )
    out, _ = annotate(_batch(_stored(0)), table)
    assert out.events[0].kv_cache_spec_kind == "linear_attention_v9"  # type: ignore[union-attr]


# -- spec descriptions (vllm/v1/kv_cache_interface.py) -------------------------------------


def _sw(w: int, cls: str = "SlidingWindowSpec") -> dict[str, object]:
    return {"spec": cls, "sliding_window": w, "block_size": 16}


def _u(*specs: dict[str, object]) -> dict[str, object]:
    return {"spec": "UniformTypeKVCacheSpecs", "specs": list(specs), "block_size": 16}


FULL = {"spec": "FullAttentionSpec", "block_size": 16}
MLA = {"spec": "MLAAttentionSpec", "block_size": 16}
SINK = {"spec": "SinkFullAttentionSpec", "block_size": 16}
MAMBA = {"spec": "MambaSpec", "block_size": 16}

SPEC_CASES = [
    (FULL, "full_attention", None),
    # A full-attention spec recording a window is still full attention without a window.
    ({"spec": "FullAttentionSpec", "sliding_window": 512}, "full_attention", None),
    (MLA, "mla_attention", None),
    ({"spec": "HiddenStateCacheSpec"}, "mla_attention", None),
    ({"spec": "RSWASpec", "rswa_window": 1024}, "full_attention", None),
    ({"spec": "TQFullAttentionSpec"}, "full_attention", None),
    (SINK, "sink_full_attention", None),
    (_sw(1024), "sliding_window", 1024),
    (_sw(128, "SlidingWindowMLASpec"), "sliding_window_mla", 128),
    (
        {"spec": "ChunkedLocalAttentionSpec", "attention_chunk_size": 8192},
        "chunked_local_attention",
        None,
    ),
    (MAMBA, "mamba", None),
    ({"spec": "EncoderOnlyAttentionSpec"}, "encoder_only_attention", None),
    ({"spec": "CrossAttentionSpec"}, "cross_attention", None),
    ({"spec": "CircularBufferSpec"}, "unknown", None),
    ({"spec": "AttentionSpec"}, "unknown", None),
    ({"spec": "KVCacheSpec"}, "unknown", None),
    # Uniform wrappers: one inner kind -> that kind (and its window when all agree).
    (_u(FULL, FULL), "full_attention", None),
    (_u(_sw(64), _sw(64)), "sliding_window", 64),
    (_u(_sw(64), _sw(128)), "sliding_window", None),
    (_u(MAMBA), "mamba", None),
    # Several kinds, all under the full-attention base spec -> full_attention.
    (_u(FULL, MLA), "full_attention", None),
    (_u(MLA, SINK, FULL), "full_attention", None),
    # Several kinds otherwise -> unknown; the window still only when all agree.
    (_u(FULL, _sw(64)), "unknown", None),
    (_u(_sw(128), _sw(128, "SlidingWindowMLASpec")), "unknown", 128),
    (_u(MAMBA, _sw(64)), "unknown", None),
    (_u({"spec": "ChunkedLocalAttentionSpec"}, FULL), "unknown", None),
]


@pytest.mark.parametrize(
    ("spec", "kind", "window"), SPEC_CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(SPEC_CASES)]
)
def test_spec_kind_and_window_follow_vllm(
    spec: dict[str, object], kind: str, window: int | None
) -> None:
    assert spec_kind(spec) == kind
    assert spec_sliding_window(spec) == window


def test_uniform_accepts_layer_map() -> None:
    spec = {
        "spec": "UniformTypeKVCacheSpecs",
        "kv_cache_specs": {"layers.0": MLA, "layers.1": FULL},
    }
    assert spec_kind(spec) == "full_attention"


def test_spec_description_file_every_class() -> None:
    table = load_groups_file(GROUPS / "every_spec.json")
    got = [(g.group_idx, g.kind, g.sliding_window, g.block_size) for g in table.groups.values()]
    assert got == [
        (0, "full_attention", None, 16),
        (1, "sliding_window", 1024, 16),
        (2, "sliding_window_mla", 128, 64),
        (3, "mla_attention", None, 64),
        (4, "sink_full_attention", None, 16),
        (5, "chunked_local_attention", None, 16),
        (6, "mamba", None, 16),
        (7, "encoder_only_attention", None, 16),
        (8, "cross_attention", None, 16),
        (9, "mla_attention", None, 64),
        (10, "full_attention", None, 64),
        (11, "unknown", None, 16),
        (12, "sliding_window", 64, 16),
    ]


def test_spec_descriptions_may_carry_group_idx() -> None:
    table = groups_from_list([{**_sw(64), "group_idx": 1}, {**FULL, "group_idx": 0}], source="t")
    assert table.describe() == "0=full_attention 1=sliding_window:64"


# -- groups files ---------------------------------------------------------------------------


def test_truth_metadata_file_loads(tmp_path: Path) -> None:
    meta = capture_truth("gemma3")["group_metadata"]
    f = tmp_path / "g.json"
    f.write_text(json.dumps(meta))
    table = load_groups_file(f)
    assert table.to_metadata() == meta
    assert table.source == str(f)
    assert table.lookup(3) == GroupInfo(3, "sliding_window", 16, 64)
    assert table.lookup(6) is None


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "groups file is not JSON"),
        ('{"a": 1}', "expected a JSON list of groups"),
        ("[]", "the list of groups is empty"),
        ("[3]", "entry 0: expected an object"),
        ('[{"spec": "FlashSpec"}]', "unknown spec class 'FlashSpec'"),
        ('[{"spec": "SlidingWindowSpec"}]', 'needs "sliding_window"'),
        ('[{"spec": "UniformTypeKVCacheSpecs", "specs": []}]', 'needs "specs"'),
        ('[{"kind": "full_attention"}]', 'missing "group_idx"'),
        ('[{"group_idx": 0, "kind": "a"}, {"group_idx": 0, "kind": "b"}]', "duplicate group_idx 0"),
        (
            '[{"group_idx": 0, "kind": "a"}, {"group_idx": 2, "kind": "b"}]',
            "group_idx 1 is missing",
        ),
        ('[{"group_idx": "0", "kind": "a"}]', '"group_idx" must be an integer'),
        ('[{"group_idx": 0, "kind": 5}]', '"kind" must be a non-empty string'),
        (
            '[{"group_idx": 0, "kind": "a", "sliding_window": "64"}]',
            '"sliding_window" must be an integer',
        ),
    ],
)
def test_bad_groups_file_names_file_and_problem(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(MetadataError, match=match) as info:
        load_groups_file(f)
    assert str(f) in str(info.value)
    assert info.value.exit_status == 2


def test_missing_groups_file(tmp_path: Path) -> None:
    with pytest.raises(MetadataError, match="cannot read groups file"):
        load_groups_file(tmp_path / "nope.json")


def test_bad_groups_file_cli_one_line_exit_2(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "full_only")
    f = tmp_path / "bad.json"
    f.write_text('[{"spec": "FlashSpec"}]')
    result = CliRunner().invoke(app, ["replay", str(rec), "--annotate", "--groups", str(f)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert (
        result.stderr
        == f"kvtool: {f}: entry 0: unknown spec class 'FlashSpec' (known: "
        + result.stderr.split("(known: ", 1)[1]
    )
    assert result.stderr.count("\n") == 1


# -- flags and precedence --------------------------------------------------------------------


def test_parse_group_flags() -> None:
    t = parse_group_flags(["0=full_attention", "1=sliding_window:1024", "3=mamba:none"])
    assert t.to_metadata() == [
        {"group_idx": 0, "kind": "full_attention", "block_size": None, "sliding_window": None},
        {"group_idx": 1, "kind": "sliding_window", "block_size": None, "sliding_window": 1024},
        {"group_idx": 3, "kind": "mamba", "block_size": None, "sliding_window": None},
    ]
    assert t.lookup(2) is None  # a gap in the flags counts as out of range


@pytest.mark.parametrize(
    ("flag", "match"),
    [
        ("full_attention", "expected IDX=KIND"),
        ("x=full_attention", "expected IDX=KIND"),
        ("0=", "expected IDX=KIND"),
        ("1=sliding_window:wide", "window 'wide' is not a non-negative integer"),
    ],
)
def test_parse_group_flags_rejects(flag: str, match: str) -> None:
    with pytest.raises(MetadataError, match=match):
        parse_group_flags([flag])


def test_parse_group_flags_duplicate() -> None:
    with pytest.raises(MetadataError, match="group 0 is given twice"):
        parse_group_flags(["0=mamba", "0=full_attention"])


@pytest.mark.parametrize(
    ("flag", "hint"),
    [
        ("0=ful_attention", "did you mean full_attention"),
        ("1=sliding:64", "did you mean sliding_window"),
        ("0=unannotated", ""),  # kvtool's own label is no kind to give a group
        ("0=Full_Attention", "did you mean full_attention"),
    ],
)
def test_issue24_group_meta_kind_is_validated_like_kind(flag: str, hint: str) -> None:
    """Issue 24: --group-meta 0=ful_attention was accepted and made a ful_attention row."""
    with pytest.raises(MetadataError) as info:
        parse_group_flags([flag])
    msg = str(info.value)
    assert msg.startswith(f"--group-meta {flag!r}: not a KV cache kind (vLLM's: full_attention, ")
    assert hint in msg and "\n" not in msg
    result = runner.invoke(app, ["report", str(GEMMA_REC), "--group-meta", flag])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == f"kvtool: {msg}\n"


def test_issue24_partial_group_meta_merges_with_the_recordings_metadata() -> None:
    """Issue 24: a partial --group-meta replaced the recording's metadata for every group,
    and the finding then said 'left unannotated' about stores shown as sliding_window."""
    result = runner.invoke(
        app, ["report", str(GEMMA_REC), "--group-meta", "0=mamba", "-f", "json", "--by", "group"]
    )
    assert result.exit_code == 0, result.stderr
    rep = json.loads(result.stdout)
    groups = {r["group_idx"]: (r["kind"], r["sliding_window"]) for r in rep["by_group"]}
    assert groups == {0: ("mamba", None), **{g: ("sliding_window", 64) for g in range(1, 6)}}
    assert rep["source"]["group_metadata"] == [
        f"--group-meta flags (group 0) over {GEMMA_REC} (metadata record)"
    ]
    assert not [f for f in rep["source"]["findings"] if "unannotated" in f or "not in KV" in f]
    # replay says the same, and annotates the same
    res = runner.invoke(
        app,
        ["replay", str(GEMMA_REC), "--annotate", "--group-meta", "0=mamba", "-f", "jsonl"],
    )
    assert res.exit_code == 0, res.stderr
    assert f"--group-meta flags (group 0) over {GEMMA_REC} (metadata record)" in res.stderr
    assert "not in KV cache metadata" not in res.stderr
    stores = [json.loads(ln) for ln in res.stdout.splitlines()]
    kinds = {
        (e["group_idx"], e["kv_cache_spec_kind"], e["kv_cache_spec_sliding_window"])
        for e in stores
        if e["type"] == "BlockStored"
    }
    assert kinds == {(0, "mamba", None), *((g, "sliding_window", 64) for g in range(1, 6))}


def test_issue24_partial_flags_alone_where_a_channel_has_no_metadata() -> None:
    """A live stream (top) or a recording without metadata: the flags are the table."""
    from kvtool.inputs import resolve_annotation

    ann = resolve_annotation([], group_flags=["0=mamba"], learn_from_input=False)
    table = ann.table_for("tcp://127.0.0.1:5557")
    assert table is not None and table.describe() == "0=mamba"
    assert not ann.needs_learning("tcp://127.0.0.1:5557")
    assert ann.sources() == ["--group-meta flags"]
    ann = resolve_annotation([GEMMA_REC], group_flags=["0=mamba"])
    (name,) = ann.tables
    assert ann.table_for(name).describe().split() == [  # type: ignore[union-attr]
        "0=mamba",
        *(f"{g}=sliding_window:64" for g in range(1, 6)),
    ]
    assert ann.sources() == [f"--group-meta flags (group 0) over {GEMMA_REC} (metadata record)"]


def test_issue24_replay_copy_stores_the_merged_metadata(tmp_path: Path) -> None:
    out = tmp_path / "c.mcap"
    res = runner.invoke(
        app, ["replay", str(GEMMA_REC), "--annotate", "--group-meta", "0=mamba", "-o", str(out)]
    )
    assert res.exit_code == 0, res.stderr
    rep = json.loads(runner.invoke(app, ["report", str(out), "-f", "json", "--by", "group"]).stdout)
    groups = {r["group_idx"]: r["kind"] for r in rep["by_group"]}
    assert groups == {0: "mamba", **{g: "sliding_window" for g in range(1, 6)}}


def test_resolve_groups_precedence(tmp_path: Path) -> None:
    f = tmp_path / "g.json"
    f.write_text('[{"group_idx": 0, "kind": "from_file"}]')
    rec = [{"group_idx": 0, "kind": "from_recording", "block_size": 16, "sliding_window": None}]
    assert resolve_groups(f, None, rec).lookup(0).kind == "from_file"  # type: ignore[union-attr]
    assert resolve_groups(None, ["0=mamba"], rec).lookup(0).kind == "mamba"  # type: ignore[union-attr]
    got = resolve_groups(None, None, rec, recording="run.mcap")
    assert got is not None
    assert got.lookup(0).kind == "from_recording"  # type: ignore[union-attr]
    assert got.source == "run.mcap (metadata record)"
    assert resolve_groups(None, None, None) is None
    with pytest.raises(MetadataError, match="not both"):
        resolve_groups(f, ["0=x"], None)


def test_to_frame_schema() -> None:
    frame = TABLE.to_frame()
    expected = pl.DataFrame(
        {
            "group_idx": [0, 1],
            "kind": ["full_attention", "sliding_window"],
            "sliding_window": [None, 64],
        },
        schema={"group_idx": pl.Int64, "kind": pl.Utf8, "sliding_window": pl.Int64},
    )
    assert_frame_equal(frame, expected)
    assert GroupTable({}, "empty").to_frame().schema == expected.schema


# -- learning and checking -----------------------------------------------------------------


def test_learner_per_channel_and_rank_and_changes() -> None:
    learner = GroupLearner()
    learner.observe("a", 0, [_stored(0, "full_attention"), _stored(1, "sliding_window", 64)], 1)
    learner.observe("b", 0, [_stored(0, "mamba")], 1)
    learner.observe("a", 1, [_stored(0, "mla_attention")], 1)
    learner.observe("a", 0, [_stored(1, "sliding_window", 128), _stored(2)], 9)
    assert learner.table("a", 0).describe() == "0=full_attention 1=sliding_window:64"
    assert learner.table("b", 0).describe() == "0=mamba"
    assert learner.table("a", 1).describe() == "0=mla_attention"
    assert len(learner.changes) == 1
    ch = learner.changes[0]
    assert (ch.channel, ch.dp_rank, ch.group_idx, ch.seq) == ("a", 0, 1, 9)
    assert ch.before == ("sliding_window", 64) and ch.after == ("sliding_window", 128)


def test_checker_reports_each_kind_of_disagreement() -> None:
    checker = Checker(
        parse_group_flags(["0=full_attention", "1=sliding_window:64", "2=sliding_window:64"])
    )
    checker.observe(
        "a",
        0,
        [
            _stored(0, "full_attention"),
            _stored(1, "sliding_window", 32),
            _stored(2),
            _stored(4, "mamba"),
            _stored(None),
        ],
        seq=3,
    )
    lines = checker.disagreements()
    assert [ln.split(":")[0] for ln in lines] == ["group 1", "group 2", "group 4"]
    assert (
        "metadata says sliding_window (window 64), but 1 store says sliding_window "
        "(window 32)" in lines[0]
    )
    assert "1 store left unannotated" in lines[1]
    assert "1 store carries group_idx 4, which is not in the metadata" in lines[2]
    assert checker.stores_without_group == 1


def test_checker_learned_mode_flags_mid_stream_change() -> None:
    checker = Checker(None)
    checker.observe("a", 0, [_stored(0, "full_attention"), _stored(1, "sliding_window", 64)], 0)
    checker.observe("a", 0, [_stored(1, "sliding_window", 64)], 1)
    assert checker.disagreements() == []
    checker.observe("a", 0, [_stored(1, "full_attention")], 2)
    lines = checker.disagreements()
    assert len(lines) == 1
    assert lines[0].startswith("group 1: ")
    assert "conflicting annotations on a rank 0" in lines[0]
    assert "full_attention (no window) by 1 store from seq 2" in lines[0]
    assert "every command uses sliding_window (window 64)" in lines[0]


@pytest.mark.parametrize(
    "name", ["gemma3", "gemma3.byteshash", "gemma3.legacy-array-spec-kind", "full_only"]
)
def test_annotating_a_capture_with_its_metadata_changes_nothing(name: str) -> None:
    """vLLM's own annotation is reproduced: annotate() keeps every event object."""
    table = groups_from_list(capture_truth(name)["group_metadata"], source="t")
    for _, seq, payload in capture_messages(name):
        batch = decode_batch(payload, seq=seq)
        out, warnings = annotate(batch, table)
        assert out is batch
        assert warnings == []
    assert msgspec.json.encode(table.to_metadata())


# -- one rule: decoded structs and the wire agree ---------------------------------------------


_kinds = st.sampled_from(["full_attention", "sliding_window", "mamba", "x_new_kind"])
_windows = st.one_of(st.none(), st.integers(1, 4096))
_group = st.one_of(st.none(), st.integers(-1, 6))


@st.composite
def _wire_event(draw: st.DrawFn, array: bool) -> object:
    tag = draw(st.sampled_from(["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]))
    hashes = draw(st.lists(st.integers(0, 2**64 - 1), max_size=3))
    if tag == "AllBlocksCleared":
        return [tag] if array else {"type": tag}
    group = draw(_group)
    if tag == "BlockRemoved":
        return (
            [tag, hashes, "GPU", group]
            if array
            else {"type": tag, "block_hashes": hashes, "medium": "GPU", "group_idx": group}
        )
    kind = draw(st.one_of(st.none(), _kinds))
    window = draw(_windows)
    if array:
        ev = [tag, hashes, None, [1, 2], 16, None, "GPU", None, None, group]
        if draw(st.booleans()):
            ev += [kind, window]
        return ev
    ev = {
        "type": tag,
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": [1],
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    if group is not None:
        ev["group_idx"] = group
    if kind is not None:
        ev["kv_cache_spec_kind"] = kind
    if window is not None:
        ev["kv_cache_spec_sliding_window"] = window
    return ev


@st.composite
def _table(draw: st.DrawFn) -> GroupTable:
    n = draw(st.integers(1, 5))
    return groups_from_list(
        [
            {"group_idx": i, "kind": draw(_kinds), "sliding_window": draw(_windows)}
            for i in range(n)
        ],
        source="t",
    )


@settings(max_examples=60, deadline=None)
@given(array=st.booleans(), data=st.data(), table=_table())
def test_wire_annotation_equals_struct_annotation(
    array: bool, data: st.DataObject, table: GroupTable
) -> None:
    events = data.draw(st.lists(_wire_event(array), max_size=6))
    payload = msgspec.msgpack.encode([1.5, events, 0])
    by_struct, warnings = annotate(decode_batch(payload), table)
    on_wire, bad = annotate_payload(payload, table)
    by_wire = decode_batch(on_wire)
    assert by_wire.event_encoding == by_struct.event_encoding
    assert [event_to_builtins(e) for e in by_wire.events] == [
        event_to_builtins(e) for e in by_struct.events
    ]
    assert [f"Group index `{i}` not in KV cache metadata" for i in bad] == warnings


@pytest.mark.parametrize(
    "payload",
    [
        '[{"group_idx": 0, "kind": "full_attention", "num_gpu_blocks": 1' + "0" * 5000 + "}]",
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["past-int-digit-limit", "nested-past-recursion-limit"],
)
@pytest.mark.parametrize("command", ["report", "export", "replay"])
def test_unparsable_groups_file_is_one_line_exit_2(
    tmp_path: Path, payload: str, command: str
) -> None:
    """A groups file json cannot turn into values is "not JSON", not an internal error."""
    f = tmp_path / "g.json"
    f.write_text(payload)
    rec = Path(__file__).parent / "data" / "recordings" / "full_only-v1.mcap"
    extra = {"report": [], "export": ["-o", str(tmp_path / "t.parquet")], "replay": ["--annotate"]}
    result = CliRunner().invoke(app, [command, str(rec), *extra[command], "--groups", str(f)])
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"kvtool: {f}: groups file is not JSON: "), result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output
