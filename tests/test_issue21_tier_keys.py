"""Issue 21: each medium is a cache of its own in the report's kernel (no false findings).

A tiered stream as vLLM 0.33's ``OffloadingConnector`` sends it
(``offloading/events.py``: a CPU ``BlockStored`` carries the GPU entry's hashes, parent,
tokens and ``group_idx``, ``medium="CPU"``; its ``BlockRemoved`` per group): GPU stores of a
hybrid model (full attention + sliding window, the same hashes in both groups), offloads to
CPU while the GPU copies are live, GPU evictions of offloaded keys, loads back from CPU
(parentless GPU stores of keys live on CPU only) and CPU evictions, written to a real MCAP
file. A CPU copy of a key live on GPU is a transfer, not a second copy or a hit
announcement; a GPU eviction of an offloaded key takes the GPU copy: ``auto`` reports no
announcement, no ambiguous copy and no finding, and every count is the sum of the media's
(each as a stream of that medium alone reports it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingWriter
from tests.recutil import BASE_NS, ENDPOINT, STEP_NS

runner = CliRunner()
TS = 1_767_225_600.0
GROUPS = [
    {"group_idx": 0, "kind": "full_attention", "block_size": 16, "sliding_window": None},
    {"group_idx": 1, "kind": "sliding_window", "block_size": 16, "sliding_window": 32},
]


def _store(hashes: list[int], parent: int | None, medium: str) -> list[dict[str, object]]:
    """One store per group (a hybrid model stores the same hashes once per group)."""
    return [
        {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": parent,
            "token_ids": list(range(16 * len(hashes))),
            "block_size": 16,
            "lora_id": None,
            "medium": medium,
            "lora_name": None,
            "group_idx": g["group_idx"],
            "kv_cache_spec_kind": g["kind"],
            "kv_cache_spec_sliding_window": g["sliding_window"],
        }
        for g in GROUPS
    ]


def _remove(hashes: list[int], medium: str) -> list[dict[str, object]]:
    return [
        {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": g}
        for g in (0, 1)
    ]


A, B, C = [101, 102, 103], [201, 202], [301, 302, 303]
BATCHES: list[list[dict[str, object]]] = [
    [{"type": "AllBlocksCleared"}],
    _store(A, None, "GPU"),  # request A computes its prompt
    _store(A, None, "CPU"),  # offloaded while the GPU copies are live: a transfer
    _store(B, None, "GPU") + _remove(A, "GPU"),  # B evicts A on GPU; A is live on CPU
    _store(A, None, "GPU"),  # A loaded back from CPU: new GPU blocks, no announcement
    _store([104], 103, "GPU") + _store(B, None, "CPU"),  # A decodes; B offloaded
    _remove(A[:1], "CPU") + _store(C, None, "GPU") + _remove(B, "GPU"),
    _store([104], 103, "CPU") + _store(B, None, "GPU"),  # a load of B
    _remove(C, "GPU") + _store(C, None, "CPU") + _remove(A[1:], "CPU"),
]


def write(path: Path, media: tuple[str, ...] = ("GPU", "CPU")) -> Path:
    """The stream as a real MCAP recording (only the events of ``media``, and the clear)."""
    with RecordingWriter(path) as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        for seq, events in enumerate(BATCHES):
            kept = [e for e in events if e.get("medium", media[0]) in media]
            payload = msgspec.msgpack.encode([TS + seq * 0.01, kept, 0])
            w.write(ch, seq, payload, BASE_NS + seq * STEP_NS)
    return path


def report(path: Path, *args: str) -> dict[str, Any]:
    groups = path.parent / "groups.json"
    groups.write_text(json.dumps(GROUPS))
    res = runner.invoke(app, ["report", str(path), "--groups", str(groups), "-f", "json", *args])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


QUIET = (
    "stored_while_live",
    "hit_announced_blocks",
    "hit_announced_blocks_bound",
    "blocks_stored_bound",
    "ambiguous_copy_evictions",
    "orphan_removes",
)
COUNTS = (
    "blocks_stored",
    "blocks_removed",
    "blocks_cleared",
    "live_blocks_end",
    "blocks_recomputed",
    "tokens_stored",
    "live_keys",
    *QUIET,
)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_issue21_a_tiered_stream_gives_no_false_finding(tmp_path: Path, jobs: str) -> None:
    doc = report(write(tmp_path / "tiered.mcap"), "--jobs", jobs)
    assert doc["source"]["findings"] == []
    for row in [doc["totals"], *doc["by_group"], *doc["by_kind"]]:
        assert {k: row[k] for k in QUIET} == dict.fromkeys(QUIET, 0)
    # GPU: 3 + 2 + 3 + 1 + 3 + 2 blocks per group; A's and B's loads are recomputes there.
    gpu = [r for r in doc["by_group"] if r["group_idx"] == 0]
    assert len(gpu) == 1
    assert gpu[0]["blocks_recomputed"] == 5


def test_issue21_a_tiered_streams_counts_are_its_media_s(tmp_path: Path) -> None:
    """Every count of the tiered stream is the sum of the media's, each reported alone."""
    both = report(write(tmp_path / "tiered.mcap"))
    alone = [report(write(tmp_path / f"{m}.mcap", (m,))) for m in ("GPU", "CPU")]
    for table, key in (("totals", None), ("by_kind", "kind"), ("by_group", "group_idx")):
        rows = [both[table]] if key is None else both[table]
        for i, row in enumerate(rows):
            parts = [d[table] if key is None else d[table][i] for d in alone]
            if key is not None:
                assert {p[key] for p in parts} == {row[key]}
            want = {k: sum(p[k] for p in parts) for k in COUNTS if k != "blocks_cleared"}
            assert {k: row[k] for k in want} == want, (table, row.get(key))
    by_medium = {
        r["medium"]: r for r in report(write(tmp_path / "m.mcap"), "--by", "medium")["by_medium"]
    }
    for m, d in zip(("GPU", "CPU"), alone, strict=True):
        assert {k: by_medium[m][k] for k in COUNTS} == {k: d["totals"][k] for k in COUNTS}
