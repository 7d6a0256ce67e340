"""``serve --report-mode``: /metrics, scraped over real HTTP on 127.0.0.1, equals ``report``.

``serve FILE --speed 0`` plays ``d_gemma3_report_full`` (a third of the requests announce
their hits); every served counter and gauge summed by kind is ``report``'s in the same mode
(hit announcements are no stores and no live blocks: docs/SEMANTICS.md R6/R7).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_serve import assert_equals_report, serve_proc, sum_by, wait_for
from tests.test_top import kvtool

REC = (
    Path(__file__).parent
    / "data"
    / "semantics"
    / "d_gemma3_report_full"
    / ("d_gemma3_report_full.mcap")
)


@pytest.mark.parametrize(
    ("mode", "stored", "live"),
    [
        ("incremental", {"full_attention": 6241, "sliding_window": 31205}, 1505 + 6836),
        ("full", {"full_attention": 4661, "sliding_window": 23305}, 196 + 291),
    ],
)
def test_serve_report_mode_on_a_recording_equals_report(
    tmp_path: Path, mode: str, stored: dict[str, int], live: int
) -> None:
    rep = kvtool("report", str(REC), "--format", "json", "--report-mode", mode)
    assert rep.returncode == 0, rep.stderr
    with serve_proc(
        tmp_path, str(REC), "--speed", "0", "--interval", "100ms", "--report-mode", mode
    ) as (proc, url):
        samples = wait_for(url, "kvtool_source_done", 1)
        assert proc.poll() is None
    assert proc.returncode == 0
    assert assert_equals_report(samples, json.loads(rep.stdout)) >= 6
    assert sum_by(samples, "kvtool_blocks_stored_total", "kind") == {
        k: float(v) for k, v in stored.items()
    }
    assert sum(sum_by(samples, "kvtool_live_blocks", "kind").values()) == live
    hits = sum_by(samples, "kvtool_hit_blocks_total", "kind")
    assert sum(hits.values()) == (0 if mode == "incremental" else 1050 * 6)
    # hit_rate, a gauge per series, only where every request announces (--report-mode full).
    rates = samples.get("kvtool_prefix_cache_hit_ratio", [])
    assert len(rates) == (6 if mode == "full" else 0)
