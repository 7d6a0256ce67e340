"""Issue 21: tiers -- ``report --by medium``, tier transitions, store-only tiers.

The tiered stream here is written as a publisher sends it (msgpack map events, encoded by
msgspec) into a real MCAP recording, in the order SGLang's HiCache and vLLM's offloading
connector send theirs: a block stored on GPU, its copy stored on CPU while the GPU one is
live (an offload), the GPU copy evicted, the block stored on GPU again from CPU (a load),
a CPU block backed up to storage, which never sends a remove.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingWriter
from kvtool.report import build_report
from kvtool.report.tiers import direction, medium_sort_key
from tests.recutil import BASE_NS, ENDPOINT, STEP_NS, write_capture

runner = CliRunner()
TS = 1_767_225_600.0


def _store(hashes: list[int], medium: str | None) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))),
        "block_size": 16,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def _remove(hashes: list[int], medium: str | None) -> dict[str, object]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": 0}


BATCHES: list[list[dict[str, object]]] = [
    [{"type": "AllBlocksCleared"}],
    [_store([1, 2, 3, 4], "GPU")],
    [_store([1, 2], "CPU")],  # offload GPU -> CPU, GPU copies live: 2
    [_remove([1, 2, 3], "GPU"), _store([3], "CPU")],  # evicted, then moved to CPU: 1
    [_store([1], "GPU")],  # load CPU -> GPU: 1
    [_store([2], "STORAGE")],  # backed up CPU -> STORAGE: 1 (no remove ever)
    [_remove([1], "CPU")],
    [_store([5], "GPU"), _store([1], "GPU")],  # new; a second GPU copy (no transition)
    [_store([4], "CPU")],  # offload GPU -> CPU: 1
]


def write_tiered(path: Path) -> None:
    with RecordingWriter(path) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        for seq, events in enumerate(BATCHES):
            payload = msgspec.msgpack.encode([TS + seq * 0.01, events, 0])
            w.write(ch, seq, payload, BASE_NS + seq * STEP_NS)


def _run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _json(*args: str) -> dict:
    out: dict = json.loads(_run(*args, "--format", "json"))
    return out


def test_issue21_by_medium_rows_and_transitions(tmp_path: Path) -> None:
    rec = tmp_path / "tiered.mcap"
    write_tiered(rec)
    rep = _json("report", str(rec), "--by", "kind,medium")
    rows = {r["medium"]: r for r in rep["by_medium"]}
    assert list(rows) == ["GPU", "CPU", "STORAGE"]  # tier order
    gpu, cpu, storage = rows["GPU"], rows["CPU"], rows["STORAGE"]
    # Each medium is a cache of its own: a CPU copy of a GPU-live block is a new block.
    assert (gpu["blocks_stored"], gpu["blocks_removed"], gpu["live_blocks_end"]) == (7, 3, 4)
    assert gpu["stored_while_live"] == 1  # block 1 twice on GPU
    assert gpu["blocks_recomputed"] == 1  # block 1 came back from CPU (a load)
    assert gpu["blocks_cleared"] == 0
    assert (cpu["blocks_stored"], cpu["blocks_removed"], cpu["live_blocks_end"]) == (4, 1, 3)
    assert cpu["stored_while_live"] == 0
    assert cpu["peak_live_blocks"] == 3
    assert (storage["blocks_stored"], storage["remove_events"]) == (1, 0)
    # Additive counts add up to the report's totals.
    for col in ("store_events", "blocks_stored", "tokens_stored", "blocks_removed"):
        assert sum(r[col] for r in rows.values()) == rep["totals"][col]
    assert rep["tier_transitions"] == [
        {
            "kind": "full_attention",
            "from_medium": "GPU",
            "to_medium": "CPU",
            "direction": "offload",
            "blocks": 4,
        },
        {
            "kind": "full_attention",
            "from_medium": "CPU",
            "to_medium": "GPU",
            "direction": "load",
            "blocks": 1,
        },
        {
            "kind": "full_attention",
            "from_medium": "CPU",
            "to_medium": "STORAGE",
            "direction": "offload",
            "blocks": 1,
        },
    ]
    findings = rep["source"]["findings"]
    (line,) = [f for f in findings if "store-only tier" in f]
    assert line.startswith("medium STORAGE: 1 blocks stored and none removed")


def test_issue21_by_medium_table_and_csv(tmp_path: Path) -> None:
    rec = tmp_path / "tiered.mcap"
    write_tiered(rec)
    table = _run("report", str(rec), "--by", "medium")
    assert "by medium" in table
    assert "tier transitions" in table
    assert "offload" in table and "load" in table
    lines = list(
        csv.DictReader(io.StringIO(_run("report", str(rec), "--by", "medium", "-f", "csv")))
    )
    media = [r["medium"] for r in lines if r["table"] == "by_medium"]
    assert media == ["GPU", "CPU", "STORAGE", ""]  # and the total row
    moves = [r for r in lines if r["table"] == "tier_transitions"]
    assert [(r["from_medium"], r["to_medium"], r["blocks"]) for r in moves] == [
        ("GPU", "CPU", "4"),
        ("CPU", "GPU", "1"),
        ("CPU", "STORAGE", "1"),
    ]
    md = _run("report", str(rec), "--by", "medium", "-f", "markdown")
    assert "### by medium" in md and "### tier transitions" in md


def test_issue21_by_medium_transitions_across_chunks(tmp_path: Path) -> None:
    """Chunk boundaries change nothing (the second medium appears in a later chunk)."""
    rec = tmp_path / "tiered.mcap"
    write_tiered(rec)
    whole = build_report([rec], split=["medium"])
    small = build_report([rec], split=["medium"], chunk_bytes=64)
    assert whole.by_medium is not None and small.by_medium is not None
    assert small.by_medium.to_dicts() == whole.by_medium.to_dicts()
    assert whole.tier_transitions is not None and small.tier_transitions is not None
    assert small.tier_transitions.to_dicts() == whole.tier_transitions.to_dicts()


def test_issue21_one_medium_row_equals_totals(tmp_path: Path) -> None:
    rec = tmp_path / "gemma3.mcap"
    write_capture(rec, "gemma3")
    rep = _json("report", str(rec), "--by", "medium")
    (row,) = rep["by_medium"]
    assert row.pop("medium") == "GPU"
    assert row == rep["totals"]
    assert rep["tier_transitions"] == []
    assert not [f for f in rep["source"]["findings"] if "store-only" in f]


def test_issue21_events_without_medium_are_the_null_medium(tmp_path: Path) -> None:
    rec = tmp_path / "legacy.mcap"
    write_capture(rec, "full_only.legacy-array-initial.signed")
    rep = _json("report", str(rec), "--by", "medium")
    (row,) = rep["by_medium"]
    assert row.pop("medium") is None
    assert row == rep["totals"]
    table = _run("report", str(rec), "--by", "medium")
    assert "by medium" in table


@pytest.mark.parametrize(
    ("source", "target", "want"),
    [
        ("GPU", "CPU", "offload"),
        ("CPU_PINNED", "GPU", "load"),
        ("CPU", "DISK", "offload"),
        ("CPU", "CPU_PINNED", "move"),
        ("GPU", "NVME_X", "move"),
    ],
)
def test_issue21_transition_direction(source: str, target: str, want: str) -> None:
    assert direction(source, target) == want


def test_issue21_medium_order() -> None:
    media = ["DISK", None, "CPU_PINNED", "zz", "GPU", "EXTERNAL"]
    assert sorted(media, key=medium_sort_key) == [
        "GPU",
        "CPU_PINNED",
        "DISK",
        "EXTERNAL",
        "zz",
        None,
    ]


def _write(path: Path, batches: list[tuple[int, list[dict[str, object]]]]) -> None:
    with RecordingWriter(path) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        for i, (seq, events) in enumerate(batches):
            payload = msgspec.msgpack.encode([TS + i * 0.01, events, 0])
            w.write(ch, seq, payload, BASE_NS + i * STEP_NS)


def test_issue21_clear_and_restart_end_every_tier(tmp_path: Path) -> None:
    """A clear names no medium: it clears every tier; a restart starts every tier afresh."""
    rec = tmp_path / "cleared.mcap"
    _write(
        rec,
        [
            (0, [_store([1, 2], "GPU"), _store([7], "CPU")]),
            (1, [{"type": "AllBlocksCleared"}]),
            (2, [_store([1], "CPU")]),  # GPU's copy went with the clear: no transition
            (3, [_store([3], "GPU")]),
            (0, [_store([3], "CPU")]),  # the publisher restarted: no transition either
            (1, [_store([3], "GPU"), _store([3], "CPU_PINNED")]),  # CPU -> CPU_PINNED: a move
        ],
    )
    rep = _json("report", str(rec), "--by", "medium")
    rows = {r["medium"]: r for r in rep["by_medium"]}
    assert rows["GPU"]["blocks_cleared"] == 2 + 1  # the clear; block 3 at the restart
    assert rows["CPU"]["blocks_cleared"] == 1 + 1
    assert rep["tier_transitions"] == [
        {
            "kind": "full_attention",
            "from_medium": "CPU",
            "to_medium": "GPU",
            "direction": "load",
            "blocks": 1,
        },
        {
            "kind": "full_attention",
            "from_medium": "CPU",
            "to_medium": "CPU_PINNED",
            "direction": "move",
            "blocks": 1,
        },
    ]


def _offload(hashes: list[int], removed: bool = False) -> dict[str, object]:
    """vLLM's OffloadingConnector.take_events: CPU events without group_idx or tokens."""
    if removed:
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "CPU"}
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": 0,
        "lora_id": None,
        "medium": "CPU",
        "lora_name": None,
    }


def test_issue21_offloading_connector_events_without_group(tmp_path: Path) -> None:
    """A CPU tier whose events carry no group_idx still pairs with the GPU group's blocks."""
    rec = tmp_path / "offload.mcap"
    _write(
        rec,
        [
            (0, [_store([1, 2], "GPU")]),
            (1, [_offload([1, 2])]),  # offloaded while live on GPU: 2
            (2, [_remove([1, 2], "GPU")]),
            (3, [_store([1], "GPU")]),  # loaded back: 1
            (4, [_offload([2], removed=True)]),
        ],
    )
    rep = _json("report", str(rec), "--by", "medium")
    rows = {r["medium"]: r for r in rep["by_medium"]}
    assert (rows["CPU"]["blocks_stored"], rows["CPU"]["blocks_removed"]) == (2, 1)
    assert (rows["CPU"]["live_blocks_end"], rows["CPU"]["orphan_removes"]) == (1, 0)
    assert [
        (t["kind"], t["from_medium"], t["to_medium"], t["direction"], t["blocks"])
        for t in rep["tier_transitions"]
    ] == [
        ("full_attention", "GPU", "CPU", "offload", 2),
        ("full_attention", "CPU", "GPU", "load", 1),
    ]
