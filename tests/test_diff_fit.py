"""The diff table with ``--all`` fits 80 columns: long metric names give way to short labels.

With eleven-digit counts and every metric shown, the metric column (26 wide for
``hit_announced_blocks_bound``) pushed the change column to a block below. When the names
make a table too wide and the registry's short labels make it fit, the metric column shows
the short labels, and one line names the metrics they stand for (``--fail-on`` takes either).
Names stay when they fit, and when even the short labels do not (then columns go below, as
in every table).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from kvtool.diff import diff_recordings, diff_reports, parse_fail_on
from kvtool.render.diff import HEADER, SHORT_NOTE, render_table
from kvtool.report.registry import SHORT_LABELS
from tests.test_diff import _big_report, recs  # noqa: F401  (recs: the module's fixture)

HEAD = re.compile(r"^metric +A +B +delta +change$")


def _text(d: object, width: int) -> str:
    buf = io.StringIO()
    render_table(
        d, Console(file=buf, width=width, color_system=None, soft_wrap=True), all_metrics=True
    )  # type: ignore[arg-type]
    return buf.getvalue()


def test_diff_all_metrics_with_huge_counts_fits_80_columns_in_one_block() -> None:
    d = diff_reports(
        _big_report("chunked_local_attention", 10**9),
        _big_report("chunked_local_attention", 3 * 10**9 + 7),
        by="group",
    )
    text = _text(d, 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text
    # One block per table: the header once per table (rows and totals), never repeated.
    heads = [line for line in lines if HEAD.match(line)]
    assert len(heads) == len(d.rows) + 1
    # Every metric on one line, its change column included (no block below); only the
    # longest names give way (the others fit).
    swapped = {n for n in SHORT_LABELS if len(n) >= len("ambiguous_copy_evictions")}
    for m in d.totals.metrics:
        label = SHORT_LABELS[m.metric] if m.metric in swapped else m.metric
        assert any(re.match(rf"{re.escape(label)} +\S+ +\S+ +\S+ +\S+$", ln) for ln in lines), m
    assert re.search(r"33,000,000,077 +\+22,000,000,077 +\+200\.0%", text)
    # The short labels are named once, with the metrics they stand for.
    flat = " ".join(text.split())
    assert len([line for line in lines if line.startswith(SHORT_NOTE)]) == 1
    assert "announced_bound = hit_announced_blocks_bound" in flat
    assert "life_p99_high = lifetime_p99_s_bound_high" in flat
    assert "recomp_dist_p99" not in flat  # a name that fits keeps its name
    assert "hit_announced_blocks_bound " not in text  # never shown as a name in a table


def test_diff_names_stay_when_they_fit(recs: dict[str, Path]) -> None:  # noqa: F811
    d = diff_recordings([recs["base"]], [recs["dropped"]], by="kind")
    text = _text(d, 80)
    assert SHORT_NOTE not in text
    assert re.search(r"^hit_announced_blocks_bound +", text, re.MULTILINE)
    assert re.search(r"^recompute_distance_p50 +", text, re.MULTILINE)


def test_diff_names_stay_when_even_short_labels_do_not_fit() -> None:
    d = diff_reports(
        _big_report("full_attention", 10**9), _big_report("full_attention", 2), by="kind"
    )
    text = _text(d, 40)
    assert SHORT_NOTE not in text
    assert max(len(line) for line in text.splitlines()) <= 40
    assert "hit_announced_blocks_bound" in text
    assert HEADER[0] == "metric"


def test_fail_on_takes_the_short_label() -> None:
    assert parse_fail_on("announced_bound:+1").metric == "hit_announced_blocks_bound"
    assert parse_fail_on("recomp_dist_p99{kind=full_attention}:5%").metric == (
        "recompute_distance_p99"
    )
    assert parse_fail_on("blocks_removed:+1").metric == "blocks_removed"
