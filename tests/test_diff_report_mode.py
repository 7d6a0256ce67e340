"""``diff --report-mode``: the one option of ``report``, for both sides or one per side.

On ``d_gemma3_report_full`` (a third of vLLM 0.33's requests in ``kv_cache_report_mode="full"``)
the recording diffed against itself, side A read ``incremental`` and side B ``full``, shows
what docs/SEMANTICS.md R6/R7 say the announcements change: every announced block leaves
``blocks_stored`` (6,241 -> 4,661 full attention, 31,205 -> 23,305 sliding window), live
blocks fall to the physical truth (1,505 -> 196, 6,836 -> 291), and the hit columns appear.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvtool.cli import app

D = Path(__file__).parent / "data" / "semantics" / "d_gemma3_report_full"
REC = D / "d_gemma3_report_full.mcap"
runner = CliRunner()


@functools.cache
def report(mode: str) -> dict[str, Any]:
    result = runner.invoke(app, ["report", str(REC), "--report-mode", mode, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def diff_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["diff", str(REC), str(REC), *args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def _metrics(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["metric"]: m for m in row["metrics"]}


def test_diff_report_mode_incremental_vs_full_shows_the_announcements() -> None:
    d = diff_json("--report-mode", "incremental", "--report-mode", "full")
    rows = {r["key"]["kind"]: _metrics(r) for r in d["rows"]}
    assert set(rows) == {"full_attention", "sliding_window"}
    want = {  # (A: incremental, B: full), the table and SEMANTICS.md R6/R7
        "full_attention": {
            "blocks_stored": (6241, 4661),
            "live_blocks_end": (1505, 196),
            "stored_while_live": (3607, 1319),
            "hit_announced_blocks": (0, 1580),
            "hit_blocks": (0, 1050),
            "blocks_removed": (4221, 4221),
        },
        "sliding_window": {
            "blocks_stored": (31205, 23305),
            "live_blocks_end": (6836, 291),
            "stored_while_live": (14211, 135),
            "hit_announced_blocks": (0, 7900),
            "hit_blocks": (0, 5250),
            "blocks_removed": (22765, 22765),
        },
    }
    for kind, metrics in want.items():
        got = {name: (rows[kind][name]["a"], rows[kind][name]["b"]) for name in metrics}
        assert got == metrics, kind
        # Every announced block is one store less (R6): the documented difference.
        m = rows[kind]
        assert -m["blocks_stored"]["delta"] == m["hit_announced_blocks"]["b"]
        assert not m["blocks_removed"]["changed"]
    # Each side is exactly the report in its mode.
    for side, mode in (("a", "incremental"), ("b", "full")):
        by_kind = {r["kind"]: r for r in report(mode)["by_kind"]}
        for kind in rows:
            for name, m in rows[kind].items():
                assert m[side] == by_kind[kind][name], (mode, kind, name)


def test_diff_report_mode_once_reads_both_sides_in_it() -> None:
    for mode in ("incremental", "full"):
        d = diff_json("--report-mode", mode)
        assert not d["changed"], mode
        tot = _metrics(d["totals"])
        assert tot["blocks_stored"]["a"] == report(mode)["totals"]["blocks_stored"]
    # The default is auto, which takes this stream's announcements (the same as full here).
    d = diff_json()
    assert _metrics(d["totals"])["blocks_stored"]["a"] == report("auto")["totals"]["blocks_stored"]


def test_diff_report_mode_three_times_or_unknown_is_a_usage_error() -> None:
    three = ["--report-mode", "full"] * 3
    result = runner.invoke(app, ["diff", str(REC), str(REC), *three])
    assert result.exit_code == 2
    assert "--report-mode given 3 times" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    result = runner.invoke(app, ["diff", str(REC), str(REC), "--report-mode", "sometimes"])
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr + result.stdout
