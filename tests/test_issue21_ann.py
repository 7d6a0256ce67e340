"""Issue 21, hit announcements in the report's kernel (docs/SEMANTICS.md R6, R7).

The truth is tests/data/semantics/d_gemma3_report_full (vLLM 0.33's real KVCacheManager, a
third of the requests in ``kv_cache_report_mode="full"``, the block pool instrumented);
the rules are kvtool/report/announce.py's. Default-mode streams are unchanged, and
``--report-mode incremental`` gives the numbers from before; vLLM's proposed ``origin``
field (vllm-project/vllm#51699) makes the classification exact.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from kvtool import columns
from kvtool.cli import app
from kvtool.columns import RawChunk, decode_chunk
from kvtool.recording import RecordingWriter
from kvtool.render.report import render_json
from kvtool.report import build_report
from tests import semtruth
from tests.test_issue10_decode import with_extras

DATA = Path(__file__).parent / "data"
SEMANTICS = DATA / "semantics"
D = "d_gemma3_report_full"
RECORDINGS = sorted((Path(__file__).parent.parent / "recordings").glob("*.mcap")) + sorted(
    (DATA / "recordings").glob("*.mcap")
)
DEFAULT_MODE = [
    *RECORDINGS,
    SEMANTICS / "b_gemma3_b64_h16" / "b_gemma3_b64_h16.mcap",
    SEMANTICS / "c1_mamba_b576_h64_fi" / "c1_mamba_b576_h64_fi.mcap",
]
NEW_COLUMNS = (
    "hit_announced_blocks",
    "tokens_announced",
    "hit_blocks",
    "hit_tokens",
    "failed_lookups",
    "blocks_stored_bound",
    "hit_announced_blocks_bound",
)
runner = CliRunner()


def _run(path: Path, *extra: str) -> tuple[dict[str, Any], str]:
    result = runner.invoke(app, ["report", str(path), *extra, "--format", "json"])
    assert result.exit_code in (0, 3), result.stderr  # 3: a recording with lost batches
    out: dict[str, Any] = json.loads(result.stdout)
    return out, result.stderr


@functools.cache
def report(path: Path, *extra: str) -> dict[str, Any]:
    return _run(path, *extra)[0]


def d_path() -> Path:
    return SEMANTICS / D / f"{D}.mcap"


@functools.cache
def truth() -> dict[str, Any]:
    out: dict[str, Any] = json.loads((SEMANTICS / D / "truth.json").read_text())
    return out


TRUTH_COLUMNS = (
    *semtruth.BLOCKS,
    "stored_while_live",
    "hit_announced_blocks",
    "hit_blocks",
    "tokens_stored",
    "tokens_announced",
    "distinct_hashes",
)
"""The truth figures this file checks (tests/semtruth.py reads them)."""


def physical(t: dict[str, Any]) -> dict[str, int]:
    """The truth's figures :data:`TRUTH_COLUMNS` for one group or kind row of truth.json."""
    return semtruth.physical(t, TRUTH_COLUMNS)


def _figures(row: dict[str, Any]) -> dict[str, int]:
    return semtruth.columns(row, TRUTH_COLUMNS)


def test_issue21_ann_report_mode_full_run_equals_the_truth_per_group_and_kind() -> None:
    rep = report(d_path())
    by_group = {r["group_idx"]: r for r in rep["by_group"]}
    for g in truth()["by_group"]:
        row = by_group[g["group_idx"]]
        assert _figures(row) == physical(g), g["group_idx"]
        assert row["peak_live_blocks"] == g["peak"]["peak_physical_cached_blocks"]
        # 1,580 announced per group, 530 of them in lookups whose allocation failed
        assert (row["hit_announced_blocks"], row["hit_blocks"], row["hit_tokens"]) == (
            1580,
            1050,
            16800,
        )
        assert row["failed_lookups"] == 14
        assert row["orphan_removes"] == 0
    by_kind = {r["kind"]: r for r in rep["by_kind"]}
    for k in truth()["by_kind"]:
        assert _figures(by_kind[k["kind"]]) == physical(k), k["kind"]
    fa = by_kind["full_attention"]
    # The issue's table: 4,661 stored (not 6,241), 196 live (not 1,505), 1,319 stored
    # while live (not 3,607); sliding window 23,305 / 291 / 135.
    assert (fa["blocks_stored"], fa["live_blocks_end"], fa["stored_while_live"]) == (
        4661,
        196,
        1319,
    )
    sw = by_kind["sliding_window"]
    assert (sw["blocks_stored"], sw["live_blocks_end"], sw["stored_while_live"]) == (
        23305,
        291,
        135,
    )


def test_issue21_ann_bounds_contain_the_truth_and_a_finding_says_so() -> None:
    rep, err = _run(d_path())
    for row, t in zip(
        sorted(rep["by_group"], key=lambda r: r["group_idx"]), truth()["by_group"], strict=True
    ):
        ann, stored = row["hit_announced_blocks"], row["blocks_stored"]
        taken, left = row["blocks_stored_bound"], row["hit_announced_blocks_bound"]
        ann_lo, ann_hi = ann - taken, ann + left
        stored_lo, stored_hi = stored - left, stored + taken
        assert ann_lo <= physical(t)["hit_announced_blocks"] <= ann_hi
        assert stored_lo <= physical(t)["blocks_stored"] <= stored_hi
        assert ann_lo < ann_hi  # 2 runs per group the wire cannot tell (83 blocks)
        assert ann_hi - ann_lo == 83
    assert "finding: 9,480 blocks were hit announcements" in err
    assert "could be hit announcements or second copies" in err


def test_issue21_ann_incremental_mode_gives_the_counts_from_before() -> None:
    # What kvtool reported before hit announcements were told apart (the truth file's
    # kvtool_semantics_model figures were taken with that kvtool).
    rep, err = _run(d_path(), "--report-mode", "incremental")
    by_kind = {r["kind"]: r for r in rep["by_kind"]}
    for k in truth()["by_kind"]:
        old = k["kvtool_semantics_model"]
        row = by_kind[k["kind"]]
        for col in ("store_events", "blocks_stored", "tokens_stored", "blocks_removed"):
            assert row[col] == old[col], (k["kind"], col)
        assert (row["stored_while_live"], row["live_blocks_end"]) == (
            old["restored_blocks"],
            old["live_blocks_end"],
        )
        assert {c: row[c] for c in NEW_COLUMNS} == dict.fromkeys(NEW_COLUMNS, 0)
    assert "hit announcements" not in err


def test_issue21_ann_full_mode_takes_every_ambiguous_run() -> None:
    rep = report(d_path(), "--report-mode", "full")
    for row in rep["by_group"]:
        assert row["hit_announced_blocks"] == 1580
        assert row["hit_announced_blocks_bound"] == row["blocks_stored_bound"] == 0


@pytest.mark.parametrize("path", DEFAULT_MODE, ids=lambda p: p.name)
def test_issue21_ann_default_mode_streams_are_unchanged(path: Path) -> None:
    # No request announced: auto finds nothing, so every output is incremental's (the
    # numbers from before), apart from the new columns, all zero.
    auto, auto_err = _run(path)
    inc, inc_err = _run(path, "--report-mode", "incremental")
    assert auto == inc and auto_err == inc_err
    for table in ("totals", "by_kind", "by_window", "by_group"):
        rows = auto.get(table, [])
        for row in [rows] if isinstance(rows, dict) else rows:
            assert all(row[c] == 0 for c in NEW_COLUMNS), row
    for fmt in ("table", "csv"):
        a = runner.invoke(app, ["report", str(path), "--format", fmt])
        b = runner.invoke(
            app, ["report", str(path), "--format", fmt, "--report-mode", "incremental"]
        )
        assert (a.exit_code, a.stdout) == (b.exit_code, b.stdout)


def _tables(**kw: Any) -> dict[str, Any]:
    rep = build_report([d_path()], **kw)
    buf = io.StringIO()
    render_json(rep, buf)
    got = json.loads(buf.getvalue())
    return {t: got[t] for t in ("totals", "by_kind", "by_group")}


@pytest.mark.parametrize(
    "kw",
    [{"chunk_bytes": 4096}, {"chunk_bytes": 4096, "jobs": 2}, {"jobs": 2}],
    ids=["4k-chunks", "4k-chunks-jobs2", "jobs2"],
)
def test_issue21_ann_state_carries_across_chunks_and_jobs(kw: dict[str, Any]) -> None:
    assert _tables(**kw) == _tables()


def test_issue21_ann_numba_and_msgspec_decoders_give_the_same_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = _tables(chunk_bytes=8192)
    monkeypatch.setenv("KVTOOL_DECODER", "msgspec")
    assert _tables(chunk_bytes=8192) == base


# -- vLLM's proposed origin field (vllm-project/vllm#51699) ---------------------------------


class _Event(msgspec.Struct, tag=True, tag_field="type", omit_defaults=True, gc=False):
    """vLLM's KVCacheEvent base (events map-encoded and tagged since ~0.24)."""


class BlockStored(_Event, tag="BlockStored"):
    """vLLM's BlockStored with #51699's ``origin`` (next to ``ownership``)."""

    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    origin: str | None = None


class BlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM's batch: ``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[BlockStored | BlockRemoved]
    data_parallel_rank: int | None = None


GROUPS = [
    {"group_idx": 0, "kind": "full_attention", "block_size": 16, "sliding_window": None},
    {"group_idx": 1, "kind": "sliding_window", "block_size": 16, "sliding_window": 32},
]


def _stored(hashes: list[int], group: int, parent: int | None, origin: str | None) -> BlockStored:
    return BlockStored(
        hashes, parent, list(range(16 * len(hashes))), 16, None, "GPU", None,
        group_idx=group, origin=origin,
    )  # fmt: skip


def _both(hashes: list[int], parent: int | None, origin: str | None) -> list[BlockStored]:
    return [
        _stored(hashes, 0, parent, origin),
        _stored([h + 100 for h in hashes], 1, parent, origin),
    ]


def _stream(origin: bool) -> list[bytes]:
    """Stores, a hit announced, a parentless second copy and an announcement with a parent.

    Without ``origin``, the second copy has every shape of an announcement (all its blocks
    cached, a shorter prefix too) and the announcement with a parent that of a store.
    """

    def o(value: str) -> str | None:
        return value if origin else None

    batches = [
        _both([1, 2, 3], None, o("NEW")),  # a new prompt: 3 blocks per group
        _both([1, 2, 3], None, o("REUSED")),  # its hit announced (report mode full)
        _both([1, 2, 3], None, o("NEW")),  # a second copy of the whole prompt
        [_stored([2, 3], 0, 1, o("REUSED"))],  # an announcement that names a parent
    ]
    enc = msgspec.msgpack.Encoder()
    return [enc.encode(KVEventBatch(1.0 + i, evs, 0)) for i, evs in enumerate(batches)]


def _record(path: Path, payloads: list[bytes]) -> Path:
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.add_groups(GROUPS, "groups.json")
        for seq, payload in enumerate(payloads):
            w.write(ch, seq, payload, 1_764_000_000_000_000_000 + seq * 10_000_000)
        w.close()
    return path


def test_issue21_ann_origin_is_read_by_both_decoders() -> None:
    raw = with_extras(
        RawChunk(
            log_time=[10**9 + i for i in range(4)],
            seq=list(range(4)),
            channel_id=[0] * 4,
            dp_rank=[0] * 4,
            data=_stream(origin=True),
            where={0: "a.mcap: ch0"},
        )
    )
    a, b = decode_chunk(raw, decoder="numba"), decode_chunk(raw, decoder="msgspec")
    assert a.table.equals(b.table)
    first = a.table.filter(a.table["block_index"] == 0)
    assert first["origin"].to_list() == [1, 1, 2, 2, 1, 1, 2]
    assert first["parent"].to_list() == [None] * 6 + [1]


@pytest.mark.parametrize("origin", [True, False], ids=["origin", "inferred"])
def test_issue21_ann_origin_makes_the_classification_exact(tmp_path: Path, origin: bool) -> None:
    path = _record(tmp_path / "o.mcap", _stream(origin))
    for mode in ("auto", "incremental", "full"):
        rep, _err = _run(path, "--report-mode", mode)
        fa = {r["group_idx"]: r for r in rep["by_group"]}[0]
        got = (fa["blocks_stored"], fa["stored_while_live"], fa["hit_announced_blocks"])
        if origin:
            # REUSED = an announcement, NEW = a store, in every mode.
            assert got == (6, 3, 5), mode
            # two copies of each of the 3 keys: 6 blocks, 6 entries, 3 distinct keys
            assert fa["live_blocks_end"] == fa["live_entries"] == 6 and fa["live_keys"] == 3
            assert fa["hit_blocks"] == 5 and fa["blocks_stored_bound"] == 0
        elif mode == "incremental":
            assert got == (11, 8, 0)
        else:
            # Inferred: the parentless second copy reads as a hit announced (the wire
            # cannot tell), the announcement with a parent as a store.
            assert got == (5, 2, 6), mode


@pytest.mark.parametrize(
    "parent",
    [None, 7, -3, 1 << 63, b"\x01" * 32, b"\x02\x03", "text", True, 1.5, [1, 2]],
    ids=repr,
)
def test_issue21_ann_decoders_agree_on_any_parent(parent: object) -> None:
    ev: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": [5, 6],
        "parent_block_hash": parent,
        "token_ids": list(range(32)),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "origin": "REUSED",
    }
    payload = msgspec.msgpack.encode([1.0, [ev], 0])
    raw = dataclasses.replace(
        with_extras(RawChunk(log_time=[1], seq=[0], channel_id=[0], dp_rank=[0], data=[payload])),
    )
    a, b = decode_chunk(raw, decoder="numba"), decode_chunk(raw, decoder="msgspec")
    assert a.table.equals(b.table), (a.table, b.table)
    got = a.table["parent"][0]
    is_hash = isinstance(parent, int | bytes) and not isinstance(parent, bool)
    assert (got is not None) == is_hash
    assert a.table["origin"][0] == columns.ORIGIN_CODES["REUSED"]
