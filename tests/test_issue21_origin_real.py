"""Issue 21 deliverable 3: with vLLM's proposed ``origin`` field (vllm-project/vllm#51699)
hits and stores are exact, on a real stream.

Scenario ``j``'s real bytes (vLLM 0.33's ``KVCacheManager``, every request in
``kv_cache_report_mode="full"``, recorded by ``kvtool record``) with ``origin`` set on every
``BlockStored`` as the PR defines it: ``REUSED`` on the events ``emit_cached_block_events``
made (the hit announcements), ``NEW`` on the others. Which events those were comes from the
run itself (``origin.json``: per batch seq, their places in the batch, written by
``bench/vllm_semantics.py`` from the wrapped ``emit_cached_block_events``; the run's frames
equal the recording's payloads byte for byte). Rewritten into a real MCAP recording, the
report equals the truth in every mode with no bound and no finding of the inference.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingReader, RecordingWriter

J = Path(__file__).parent / "data" / "semantics_more" / "j_gemma3_b16_all_full"
runner = CliRunner()


def with_origin(path: Path) -> Path:
    """j's recording, each BlockStored given ``origin`` (``REUSED``: an announcement)."""
    reused = {int(k): set(v) for k, v in json.loads((J / "origin.json").read_text()).items()}
    with RecordingReader(J / f"{J.name}.mcap") as r, RecordingWriter(path) as w:
        chans: dict[int, int] = {}
        marked = 0
        for m in r.messages():
            c = m.channel
            if c.id not in chans:
                chans[c.id] = w.add_channel(c.endpoint, c.topic, c.dp_rank)
            ts, events, *rank = msgspec.msgpack.decode(bytes(m.data))
            for i, ev in enumerate(events):
                if ev["type"] == "BlockStored":
                    ev["origin"] = "REUSED" if i in reused.get(m.seq, ()) else "NEW"
                    marked += ev["origin"] == "REUSED"
            w.write(chans[c.id], m.seq, msgspec.msgpack.encode([ts, events, *rank]), m.log_time)
    assert marked == sum(len(v) for v in reused.values()) == 171 + 342  # every one placed
    return path


@functools.cache
def recording(tmp: Path) -> Path:
    return with_origin(tmp / "j_origin.mcap")


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recording(tmp_path_factory.mktemp("origin"))


def report(path: Path, mode: str, *more: str) -> dict[str, Any]:
    args = ["report", str(path), "--groups", str(J / "groups.json"), "--report-mode", mode, *more]
    res = runner.invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


@pytest.mark.parametrize("mode", ["auto", "incremental", "full"])
def test_issue21_origin_on_real_bytes_is_exact(rec: Path, mode: str) -> None:
    doc = report(rec, mode)
    truth = json.loads((J / "truth.json").read_text())
    rows = {r["group_idx"]: r for r in doc["by_group"]}
    for t in truth["by_group"]:
        row, st, h = rows[t["group_idx"]], t["stores"], t["hits"]
        assert row["blocks_stored"] == st["physical_blocks_newly_cached"]
        assert row["stored_while_live"] == st["second_physical_copy_of_a_cached_key"]
        assert row["hit_announced_blocks"] == st["hit_reannouncements_report_mode_full"]
        assert row["tokens_announced"] == st["tokens_stored_announce"]
        assert row["tokens_stored"] == st["tokens_stored_real"]
        assert row["hit_blocks"] == h["hit_blocks_admitted_report_mode_full"]
        assert row["hit_tokens"] == h["hit_tokens_admitted_report_mode_full"]
        assert row["live_blocks_end"] == t["end"]["physical_cached_blocks_end"]
        assert row["blocks_stored_bound"] == row["hit_announced_blocks_bound"] == 0
    said = doc["source"]["findings"]
    assert not [f for f in said if "could be hit announcements" in f]  # no bound: told
    # The announcements are what origin says, in every mode: no finding of the inference.
    assert not [f for f in said if "--report-mode incremental counts them" in f]
    want = (
        "9,426 blocks were hit announcements (origin=REUSED, vllm-project/vllm#51699), not "
        "stores: hit_blocks/hit_tokens count the hits"
    )
    assert want in said


def test_issue21_origin_without_it_the_same_bytes_need_the_inference(rec: Path) -> None:
    """The same stream without ``origin``: incremental reads every announcement as a store."""
    plain = report(J / f"{J.name}.mcap", "incremental")
    marked = report(rec, "incremental")
    assert plain["totals"]["hit_announced_blocks"] == 0
    assert marked["totals"]["hit_announced_blocks"] == 3142 + 6284


def test_issue21_origin_units_of_work_merge_alike(rec: Path) -> None:
    """--jobs 2 (units of work merged, their read stats too): the same report."""
    one, two = report(rec, "auto"), report(rec, "auto", "--jobs", "2")
    assert two["totals"] == one["totals"]
    assert two["source"]["findings"] == one["source"]["findings"]
