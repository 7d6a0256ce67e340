"""Issue 21 deliverable 3: a hit rate where every request announces (``hit_rate``).

``hit_rate = hit_tokens / (hit_tokens + tokens_stored)``, given with ``--report-mode full``
only, checked against the physical truth of scenario ``j`` (vLLM 0.33's real
``KVCacheManager``, every request in ``kv_cache_report_mode="full"``) and against vLLM's own
``PrefixCacheStats`` of that run (``truth.json``'s ``vllm_prefix_cache_stats``, recorded at
admission as vLLM's scheduler does: ``bench/vllm_semantics.py``).
"""

from __future__ import annotations

import csv
import functools
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.report.registry import metric

MORE = Path(__file__).parent / "data" / "semantics_more"
J = MORE / "j_gemma3_b16_all_full"
HALF = MORE / "i_gemma3_b32_h16_half_full"
runner = CliRunner()


def _args(d: Path, mode: str) -> list[str]:
    return [str(d / f"{d.name}.mcap"), "--groups", str(d / "groups.json"), "--report-mode", mode]


@functools.cache
def report(d: Path, mode: str) -> dict[str, Any]:
    res = runner.invoke(app, ["report", *_args(d, mode), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def truth() -> dict[str, Any]:
    out: dict[str, Any] = json.loads((J / "truth.json").read_text())
    return out


@pytest.mark.parametrize("table", ["by_group", "by_kind"])
def test_issue21_hit_rate_equals_the_truth_where_every_request_announces(table: str) -> None:
    key = "group_idx" if table == "by_group" else "kind"
    rows = {r[key]: r for r in report(J, "full")[table]}
    for t in truth()[table]:
        hit = t["hits"]["hit_tokens_admitted_report_mode_full"]
        stored = t["stores"]["tokens_stored_real"]
        row = rows[t[key]]
        assert (row["hit_tokens"], row["tokens_stored"]) == (hit, stored)
        assert row["hit_rate"] == round(hit / (hit + stored), 6)
    assert report(J, "full")["totals"]["hit_rate"] == 0.330435


def test_issue21_hit_rate_against_vllms_prefix_cache_stats() -> None:
    """vLLM's hits are kvtool's hit tokens less the re-admissions after a preemption, which
    vLLM keeps apart; its queries are whole prompts (README: how the two rates differ)."""
    st = truth()["vllm_prefix_cache_stats"]
    assert (st["queries"], st["hits"]) == (132_750, 45_728)
    for row in report(J, "full")["by_group"]:
        assert row["hit_tokens"] == st["hits"] + st["preempted_hits"] == 46_208
        assert abs(row["hit_rate"] - st["hits"] / st["queries"]) < 0.015  # 0.3304 vs 0.3445


@pytest.mark.parametrize(("d", "mode"), [(J, "auto"), (HALF, "auto"), (HALF, "incremental")])
def test_issue21_hit_rate_is_null_unless_every_request_announces(d: Path, mode: str) -> None:
    doc = report(d, mode)
    for table in ("by_group", "by_kind", "by_window"):
        assert {r["hit_rate"] for r in doc[table]} == {None}
    assert doc["totals"]["hit_rate"] is None
    said = [f for f in doc["source"]["findings"] if f.startswith("hit_rate is not given")]
    assert len(said) == (mode == "auto")


def test_issue21_hit_rate_in_csv_table_and_diff() -> None:
    res = runner.invoke(app, ["report", *_args(J, "full"), "--format", "csv"])
    assert res.exit_code == 0, res.stderr
    recs = list(csv.DictReader(io.StringIO(res.stdout)))
    assert {r["hit_rate"] for r in recs if r.get("kind") == "full_attention"} == {"0.330435"}
    res = runner.invoke(
        app,
        ["report", *_args(J, "full"), "--columns", "hit_tokens,hit_rate"],
        env={"COLUMNS": "120"},
    )
    assert res.exit_code == 0, res.stderr
    assert "0.330435" in res.stdout or "0.33" in res.stdout
    # A fall is worse (diff --fail-on), from j (0.3304) to i (0.2867).
    assert metric("hit_rate").worse == "down"
    a, b = str(J / f"{J.name}.mcap"), str(HALF / f"{HALF.name}.mcap")
    res = runner.invoke(
        app,
        ["diff", a, b, "--report-mode", "full", "--format", "json", "--fail-on", "hit_rate:-5%"],
    )
    assert res.exit_code == 1, res.output
    got = next(m for m in json.loads(res.stdout)["totals"]["metrics"] if m["metric"] == "hit_rate")
    assert (got["a"], got["worse"]) == (0.330435, True)
