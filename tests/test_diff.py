"""kvtool diff: real recordings compared through the report engine; --fail-on; render; CLI."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.diff import (
    METRICS,
    SCHEMA,
    MetricDelta,
    RowDiff,
    diff_recordings,
    diff_reports,
    parse_fail_on,
)
from kvtool.errors import UsageError
from kvtool.protocol import decode_batch
from kvtool.render.diff import render_json, render_markdown, render_table
from kvtool.report import Report, build_report
from kvtool.report.source import ReportSource
from tests.conftest import capture_messages, capture_truth
from tests.recutil import write_capture

runner = CliRunner()

# Batches of the gemma3 capture that hold only BlockRemoved events of sliding-window groups
# (1-5): dropping them changes what the sliding-window kind removed and nothing that
# full attention (group 0) did.
DROPPED = frozenset({35, 44, 62})


@pytest.fixture(scope="module")
def recs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("diff")
    groups = capture_truth("gemma3")["group_metadata"]
    out = {
        "base": d / "base.mcap",
        "dropped": d / "dropped.mcap",
        "full_only": d / "full_only.mcap",
    }
    write_capture(out["base"], "gemma3", groups=groups)
    write_capture(out["dropped"], "gemma3", groups=groups, skip=DROPPED)
    write_capture(
        out["full_only"],
        "full_only",
        endpoint="tcp://127.0.0.1:6000",
        groups=capture_truth("full_only")["group_metadata"],
    )
    return out


def dropped_removes() -> tuple[int, int]:
    """Return (events, blocks) of the dropped batches, from the capture's own bytes."""
    events = blocks = 0
    for _topic, seq, payload in capture_messages("gemma3"):
        if seq not in DROPPED:
            continue
        batch = decode_batch(payload)
        for ev in batch.events:
            assert type(ev).__name__ == "BlockRemoved"
            assert ev.group_idx in {1, 2, 3, 4, 5}
            events += 1
            blocks += len(ev.block_hashes)
    return events, blocks


def report_rows(path: Path) -> dict[tuple[str, tuple[object, ...]], dict[str, object]]:
    """Every row of ``report --format json`` keyed by (table, key): what two report runs say."""
    d = build_report([path]).to_dict()
    out: dict[tuple[str, tuple[object, ...]], dict[str, object]] = {
        ("totals", ()): d["totals"]  # type: ignore[dict-item]
    }
    keys = {
        "kind": ("kind",),
        "window": ("sliding_window",),
        "group": ("group_idx", "kind", "sliding_window"),
    }
    for by, cols in keys.items():
        for row in d[f"by_{by}"]:  # type: ignore[attr-defined]
            out[(by, tuple(row[c] for c in cols))] = row
    return out


def changed_pairs(diff) -> set[tuple[str, tuple[object, ...], str]]:  # type: ignore[no-untyped-def]
    out = {("totals", (), m.metric) for m in diff.totals.changes}
    for by, rows in diff.tables.items():
        for r in rows:
            out |= {(by, tuple(r.key.values()), m.metric) for m in r.changes}
    return out


# -- library -----------------------------------------------------------------------------------


def test_issue12_diff_of_a_recording_with_itself_shows_no_change(recs: dict[str, Path]) -> None:
    d = diff_recordings([recs["base"]], [recs["base"]], by="kind")
    assert not d.changed and not d.failed and not d.damaged
    assert [r.label for r in d.rows] == ["full_attention", "sliding_window"]
    for rows in d.tables.values():
        for r in rows:
            assert r.presence == "both" and r.changes == ()
            assert r.verdict == f"{r.label}: no change"
    assert d.totals.verdict == "total: no change"


def test_issue12_diff_shows_exactly_the_changed_metrics(recs: dict[str, Path]) -> None:
    d = diff_recordings([recs["base"]], [recs["dropped"]])
    events, blocks = dropped_removes()
    assert (events, blocks) == (24, 24)
    by_kind = {r.label: r for r in d.rows}
    # Independent of the report engine: the dropped batches held no full-attention event and
    # no store, so full attention and every store-side metric are untouched, but for the
    # recompute distances: they count the evictions of the whole pool, every group's
    # (issue 20) ...
    assert {m.metric for m in by_kind["full_attention"].changes} <= {
        f"recompute_distance_p{q}" for q in (50, 90, 99)
    }
    swa = {m.metric: m for m in by_kind["sliding_window"].metrics}
    for name in ("store_events", "blocks_stored", "tokens_stored", "distinct_hashes"):
        assert not swa[name].changed
    # ... and the sliding-window kind removed exactly what they held.
    assert swa["remove_events"].delta == -events
    assert swa["blocks_removed"].delta == -blocks
    assert swa["blocks_removed"].rel_change == pytest.approx(-blocks / swa["blocks_removed"].a)
    # Same numbers as two report runs: the diff flags a (table, row, metric) exactly when
    # the two reports' JSON values differ, and shows those values.
    ra, rb = report_rows(recs["base"]), report_rows(recs["dropped"])
    assert ra.keys() == rb.keys()
    expected = {
        (table, key, m)
        for (table, key), row in ra.items()
        for m in METRICS
        if row[m] != rb[(table, key)][m]
    }
    assert expected and changed_pairs(d) == expected
    for by, rows in d.tables.items():
        for r in rows:
            for m in r.metrics:
                key = tuple(r.key.values())
                assert (m.a, m.b) == (ra[(by, key)][m.metric], rb[(by, key)][m.metric])


def test_issue12_largest_changes_first(recs: dict[str, Path]) -> None:
    d = diff_recordings([recs["base"]], [recs["dropped"]])
    for r in [*d.rows, d.totals]:
        sizes = [m.magnitude for m in r.changes]
        assert sizes == sorted(sizes, reverse=True)
        assert all(m.changed for m in r.metrics[: len(r.changes)])
    assert d.rows[0].label == "sliding_window"  # the changed kind before the unchanged one


def test_issue12_rows_on_one_side_only(recs: dict[str, Path]) -> None:
    d = diff_recordings([recs["base"]], [recs["full_only"]], by="window")
    rows = {r.label: r for r in d.rows}
    assert rows["window 64"].presence == "a_only"
    assert rows["no window"].presence == "both"
    swa = {m.metric: m for m in rows["window 64"].metrics}
    assert (swa["blocks_stored"].a, swa["blocks_stored"].b) == (1575, 0)
    assert swa["blocks_stored"].rel_change == -1.0
    assert swa["lifetime_p50_s"].b is None and swa["lifetime_p50_s"].delta is None
    assert rows["window 64"].verdict == (
        "window 64: only in A (1,575 blocks stored, 1,314 removed)"
    )
    back = diff_recordings([recs["full_only"]], [recs["base"]], by="kind")
    new = {r.label: r for r in back.rows}["sliding_window"]
    assert new.presence == "b_only"
    assert new.verdict.startswith("sliding_window: only in B (1,575 blocks stored")
    assert {m.metric: m for m in new.metrics}["blocks_stored"].rel_change == float("inf")


def test_issue12_groups_are_keyed_by_index_kind_and_window(recs: dict[str, Path]) -> None:
    d = diff_recordings([recs["base"]], [recs["dropped"]], by="group")
    labels = [r.label for r in d.rows]
    assert sorted(labels) == ["group 0 (full_attention, no window)"] + [
        f"group {g} (sliding_window, window 64)" for g in range(1, 6)
    ]
    # The dropped batches removed blocks of groups 2, 3 and 4 only (seq 35: 3, 4; 44: 2, 3;
    # 62: 2, 3, 4): those change, every other group does not, and changed rows come first.
    assert [r.key["group_idx"] for r in d.rows if r.changed] == [2, 3, 4] or sorted(
        r.key["group_idx"] for r in d.rows[:3]
    ) == [2, 3, 4]

    # (Recompute distances count the whole pool's evictions: every group's may move.)
    def moved(r: RowDiff) -> bool:
        return any(not m.metric.startswith("recompute_distance_") for m in r.changes)

    assert {r.key["group_idx"] for r in d.rows if moved(r)} == {2, 3, 4}
    assert all(moved(r) for r in d.rows[:3]) and not any(moved(r) for r in d.rows[3:])


# -- --fail-on ----------------------------------------------------------------------------------


def _crossed(recs: dict[str, Path], *exprs: str) -> list[bool]:
    d = diff_recordings(
        [recs["base"]], [recs["dropped"]], fail_on=[parse_fail_on(e) for e in exprs]
    )
    return [c.crossed for c in d.checks]


def test_issue12_fail_on_crosses_when_and_only_when_past_the_threshold(
    recs: dict[str, Path],
) -> None:
    ra = report_rows(recs["base"])
    _events, blocks = dropped_removes()
    total = ra[("totals", ())]["blocks_removed"]
    swa = ra[("kind", ("sliding_window",))]["blocks_removed"]
    assert isinstance(total, int) and isinstance(swa, int)
    pct_total = blocks / total * 100
    pct_swa = blocks / swa * 100
    cases = {
        # relative, on the totals
        f"blocks_removed:-{pct_total - 0.01:.2f}%": True,
        f"blocks_removed:-{pct_total + 0.01:.2f}%": False,
        f"blocks_removed:{pct_total - 0.01:.2f}%": True,  # unsigned: either way
        "blocks_removed:+0%": False,  # it fell: a rise threshold is not crossed
        "blocks_removed:+10%": False,
        # absolute, strict
        f"blocks_removed:-{blocks - 1}": True,
        f"blocks_removed:-{blocks}": False,
        # a filter picks the rows
        f"blocks_removed{{kind=sliding_window}}:-{pct_swa - 0.01:.2f}%": True,
        f"blocks_removed{{kind=sliding_window}}:-{pct_swa + 0.01:.2f}%": False,
        "blocks_removed{kind=full_attention}:0": False,
        "blocks_removed{kind=*}:-0": True,
        "blocks_removed{window=none}:0%": False,
        "blocks_removed{window=64}:-0": True,
        "blocks_removed{group=0}:0": False,
        "blocks_removed{group=3}:-0": True,
        "blocks_removed{group=*,kind=full_attention}:0": False,
        "store_events{kind=*}:0": False,  # no store was dropped
    }
    assert _crossed(recs, *cases) == list(cases.values())


def test_issue12_fail_on_never_crosses_on_identical_input(recs: dict[str, Path]) -> None:
    exprs = [f"{m}{{kind=*}}:+0" for m in METRICS] + [f"{m}:0%" for m in METRICS]
    d = diff_recordings([recs["base"]], [recs["base"]], fail_on=[parse_fail_on(e) for e in exprs])
    assert not d.failed and all(c.matched_rows >= 1 for c in d.checks)


def test_issue12_fail_on_from_zero_and_lifetimes(recs: dict[str, Path]) -> None:
    d = diff_recordings(
        [recs["full_only"]],
        [recs["base"]],
        fail_on=[
            parse_fail_on(e)
            for e in (
                "blocks_stored{kind=sliding_window}:+1000%",  # from 0: crosses any % rise
                "lifetime_p50_s{kind=sliding_window}:0",  # no value in A: nothing to compare
                "blocks_stored{kind=mamba}:0",  # a vLLM kind absent on both sides: no row
            )
        ],
    )
    assert [c.crossed for c in d.checks] == [True, False, False]
    assert d.checks[2].matched_rows == 0


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        ("blocks_removed", r"expected METRIC\[\{kind=K,window=N,group=N\}\]:\[\+\|-\]NUMBER"),
        ("blocks_removed:+ten%", "expected METRIC"),
        ("blocks_removed:+10%%", "expected METRIC"),
        ("blocks_removd:+10%", r"unknown metric 'blocks_removd'; metrics: store_events, "),
        ("blocks_removed{rank=0}:1", r"bad filter 'rank=0'; expected kind=NAME"),
        ("blocks_removed{kind}:1", r"bad filter 'kind'"),
        ("blocks_removed{window=sixty}:1", r"window must be an integer, none or \*, not 'sixty'"),
        ("blocks_removed{kind=a,kind=b}:1", "filter 'kind' given twice"),
        ("blocks_removed{group=1_0}:1", r"group must be an integer, none or \*, not '1_0'"),
        ("blocks_removed{group=\u0663}:1", "group must be an integer"),
        ("blocks_removed{window=\uff14}:1", "window must be an integer"),
        ("blocks_removed:+" + "9" * 400, "too large to compare"),
    ],
)
def test_issue12_bad_fail_on_is_a_usage_error(expr: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        parse_fail_on(expr)
    assert str(info.value).startswith(f"--fail-on {expr!r}: ")
    assert "\n" not in str(info.value)


def test_issue12_fail_on_unknown_kind_is_a_usage_error(recs: dict[str, Path]) -> None:
    with pytest.raises(
        UsageError,
        match=r"unknown kind 'sliding'; kinds in the inputs: "
        "full_attention, sliding_window",
    ):
        diff_recordings(
            [recs["base"]],
            [recs["base"]],
            fail_on=[parse_fail_on("blocks_removed{kind=sliding}:1")],
        )


@pytest.mark.parametrize(
    ("expr", "a", "b", "crossed"),
    [
        # exactly at the threshold: not past it, whatever float rounding says
        ("blocks_removed:+0.7%", 1000, 1007, False),
        ("blocks_removed:+1.1%", 1000, 1011, False),
        ("blocks_removed:+0.7%", 1000, 1008, True),
        ("blocks_removed:+1.1%", 1000, 1012, True),
        ("blocks_removed:-0.7%", 1000, 993, False),
        ("blocks_removed:0.3%", 1000, 997, False),
        ("blocks_removed:+0.29%", 1000, 1003, True),
        ("blocks_removed:+10%", 0, 1, True),  # a rise from 0 crosses any % rise
        ("blocks_removed:-10%", 0, 1, False),
        ("lifetime_p50_s:+0.1", 0.3, 0.4, False),  # 0.4 - 0.3 is exactly 0.1 as printed
        ("lifetime_p50_s:+0.1", 0.3, 0.401, True),
        ("lifetime_p50_s:+10%", 0.3, 0.33, False),
    ],
)
def test_issue24_fail_on_compares_exactly(
    expr: str, a: float | int, b: float | int, crossed: bool
) -> None:
    """Issue 24: +0.7 % fired on 1000 -> 1007 but +1.1 % did not on 1000 -> 1011 (floats)."""
    m = MetricDelta("x", a, b, b - a, None if a == 0 else (b - a) / a, a != b)
    assert parse_fail_on(expr).crossed(m) is crossed


def test_parse_fail_on_fields() -> None:
    r = parse_fail_on(" live_blocks_end { kind = sliding_window , window = 64 } : -12.5 % ")
    assert (r.metric, r.filters, r.threshold, r.relative, r.direction, r.table) == (
        "live_blocks_end",
        (("kind", "sliding_window"), ("sliding_window", 64)),
        0.125,
        True,
        -1,
        "group",
    )
    assert parse_fail_on("lifetime_p99_s:0.005").threshold == 0.005
    assert parse_fail_on("orphan_removes{group=none}:+3").filters == (("group_idx", None),)


# -- rendering ----------------------------------------------------------------------------------


def _big_report(kind: str, scale: int) -> Report:
    row: dict[str, object] = {m: scale * (i + 1) for i, m in enumerate(METRICS[:11])}
    row |= {"lifetime_p50_s": 1234.567, "lifetime_p90_s": 98765.432, "lifetime_p99_s": None}
    frame = pl.DataFrame([{"kind": kind, **row}])
    win = pl.DataFrame([{"sliding_window": 4096, **row}])
    grp = pl.DataFrame([{"group_idx": 1, "kind": kind, "sliding_window": 4096, **row}])
    return Report(
        source=ReportSource(
            recordings=[f"{kind}.mcap"],
            channels=[],
            group_metadata=[],
            batches=1,
            events=2,
            block_rows=0,
            duration_s=None,
            duration_clock="receive",
            lifetimes="exact",
            recompute_gaps="exact",
            skipped_batches=0,
            skipped_events=0,
            unknown_events={},
            damaged=[],
        ),
        totals=pl.DataFrame([row]),
        by_kind=frame,
        by_window=win,
        by_group=grp,
    )


def test_issue11_1_diff_table_fits_80_columns_without_ellipsis(recs: dict[str, Path]) -> None:
    # Real recordings, and a synthetic pair with 13-digit counts and the longest vLLM kind.
    diffs = [
        diff_recordings([recs["base"]], [recs["dropped"]], by=by)
        for by in ("kind", "window", "group")
    ]
    diffs.append(diff_recordings([recs["base"]], [recs["full_only"]]))
    diffs.append(
        diff_reports(
            _big_report("chunked_local_attention", 10**9),
            _big_report("chunked_local_attention", 3 * 10**9 + 7),
            by="group",
        )
    )
    for d in diffs:
        buf = io.StringIO()
        # soft_wrap as kvtool's own stdout console: a line too long is not folded here.
        console = Console(file=buf, width=80, color_system=None, soft_wrap=True)
        render_table(d, console, all_metrics=True)
        text = buf.getvalue()
        assert "…" not in text
        for line in text.splitlines():
            assert len(line) <= 80, line
    assert "delta = B - A; change = delta / A (new: A was 0)" in text
    # Eleven-digit counts (tens of billions) are never folded (the longest metric name,
    # hit_announced_blocks_bound, then gives way to its short label: tests/test_diff_fit.py).
    assert re.search(r"33,000,000,077 +\+22,000,000,077", text) and "+200.0%" in text


def test_diff_table_at_40_columns_folds_no_number(recs: dict[str, Path]) -> None:
    # Before: "+0.001" came out as "+0.00" over "1", metric names cut mid-word; now the
    # columns that do not fit go to a block below, the metric repeated.
    d = diff_recordings([recs["base"]], [recs["dropped"]], by="kind")
    buf = io.StringIO()
    console = Console(file=buf, width=40, color_system=None, soft_wrap=True)
    render_table(d, console, all_metrics=True)
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 40
    for m in d.totals.metrics:
        # every metric name whole on its own lines, with whole numbers after it
        assert any(re.match(rf"{m.metric} +[-+0-9.,%a-z ]+$", ln) for ln in lines), m.metric


def test_issue12_strings_from_files_are_printable() -> None:
    evil = "evil\x1b]0;pwned\x07\x1b[2J"
    d = diff_reports(_big_report(evil, 1), _big_report(evil, 2), by="group")
    for render, shown in (
        (
            lambda s: render_table(d, Console(file=s, width=80, color_system=None)),
            "evil\\x1b]0;pwned\\x07\\x1b[2J",
        ),
        # Markdown: the backslashes and brackets escaped too (issue 24)
        (lambda s: render_markdown(d, s), "evil\\\\x1b\\]0;pwned\\\\x07\\\\x1b\\[2J"),
    ):
        buf = io.StringIO()
        render(buf)
        assert "\x1b" not in buf.getvalue() and "\x07" not in buf.getvalue()
        assert shown in buf.getvalue()
    buf = io.StringIO()
    render_json(d, buf)
    assert json.loads(buf.getvalue())["rows"][0]["key"]["kind"] == evil
    assert "\x1b" not in buf.getvalue()


def test_issue12_json_schema(recs: dict[str, Path]) -> None:
    d = diff_recordings(
        [recs["base"]], [recs["full_only"]], fail_on=[parse_fail_on("blocks_stored{kind=*}:+0")]
    )
    buf = io.StringIO()
    render_json(d, buf)
    doc = json.loads(buf.getvalue())
    assert list(doc) == ["schema", "by", "a", "b", "changed", "failed", "totals", "rows", "fail_on"]
    assert (doc["schema"], doc["by"], doc["changed"], doc["failed"]) == (SCHEMA, "kind", True, True)
    assert set(doc["a"]) == {
        "recordings",
        "batches",
        "events",
        "group_metadata",
        "damaged",
        "findings",
    }
    assert doc["totals"]["key"] == {} and doc["totals"]["label"] == "total"
    for row in [doc["totals"], *doc["rows"]]:
        assert set(row) == {"key", "label", "presence", "changed", "verdict", "metrics"}
        assert sorted(m["metric"] for m in row["metrics"]) == sorted(METRICS)
        for m in row["metrics"]:
            assert set(m) == {"metric", "a", "b", "delta", "rel_change", "changed", "worse"}
    swa = next(r for r in doc["rows"] if r["key"] == {"kind": "sliding_window"})
    assert swa["presence"] == "a_only"
    check = doc["fail_on"][0]
    assert check["expr"] == "blocks_stored{kind=*}:+0" and check["crossed"]
    assert [h["label"] for h in check["hits"]] == ["full_attention"]
    assert set(check["hits"][0]) == {
        "key",
        "label",
        "metric",
        "a",
        "b",
        "delta",
        "rel_change",
        "worse",
    }


def test_issue12_markdown(recs: dict[str, Path]) -> None:
    d = diff_recordings([recs["base"]], [recs["dropped"]])
    buf = io.StringIO()
    render_markdown(d, buf)
    text = buf.getvalue()
    assert "### full_attention: 2 of 46 metrics changed; largest recompute_distance_p90" in text
    assert "| metric | A | B | delta | change |\n|---|---:|---:|---:|---:|\n" in text
    assert "| blocks_removed | 1,314 | 1,290 | -24 | -1.8% |" in text


# -- CLI ----------------------------------------------------------------------------------------


def test_issue12_cli_self_diff_exits_0(recs: dict[str, Path]) -> None:
    base = str(recs["base"])
    result = runner.invoke(app, ["diff", base, base, "--fail-on", "blocks_removed:+0%"])
    assert result.exit_code == 0, result.output
    assert "diff by kind: no change: every metric is equal on both sides" in result.stdout
    assert "fail-on blocks_removed:+0%: ok (1 row within)" in result.stdout
    assert result.stderr == ""


def test_issue12_cli_fail_on_exit_status(recs: dict[str, Path]) -> None:
    base, dropped = str(recs["base"]), str(recs["dropped"])
    ok = runner.invoke(
        app,
        [
            "diff",
            base,
            dropped,
            "--fail-on",
            "blocks_removed:-10%",
            "--fail-on",
            "blocks_stored:+0",
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert (
        "sliding_window: 14 of 46 metrics changed; "
        "largest ambiguous_copy_evictions +80.0% (10 -> 18)" in " ".join(ok.stdout.split())
    )
    bad = runner.invoke(
        app,
        [
            "diff",
            base,
            dropped,
            "--fail-on",
            "blocks_removed:-10%",
            "--fail-on",
            "blocks_removed{kind=sliding_window}:-1%",
        ],
    )
    assert bad.exit_code == 1, bad.output
    assert (
        "fail-on blocks_removed{kind=sliding_window}:-1%: CROSSED by sliding_window "
        "blocks_removed 1,314 -> 1,290 (-1.8%)"
    ) in " ".join(bad.stdout.split())  # the line wraps at 80 columns


def test_issue12_cli_bad_expression_exits_2_with_one_line(recs: dict[str, Path]) -> None:
    base = str(recs["base"])
    result = runner.invoke(app, ["diff", base, base, "--fail-on", "blocks_removed>10%"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("kvtool: --fail-on 'blocks_removed>10%': expected METRIC")
    assert len(result.stderr.splitlines()) == 1


def test_issue12_cli_sets_separated_by_double_dash(recs: dict[str, Path]) -> None:
    base, full = str(recs["base"]), str(recs["full_only"])
    result = runner.invoke(app, ["diff", base, full, "--", full, base, "-f", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["a"]["recordings"] == [base, full] and doc["b"]["recordings"] == [full, base]
    assert doc["changed"] is False
    combined = build_report([base, full]).to_dict()["totals"]
    assert {m["metric"]: m["a"] for m in doc["totals"]["metrics"]} == {
        k: v for k, v in combined.items() if k != "restored_blocks"
    }


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["x.mcap"], "got 1 recording; give two (A B) or two sets separated by --"),
        (["a", "b", "c"], "got 3 recordings"),
        (["a", "--"], "give at least one recording on each side of --"),
        (["--", "b"], "give at least one recording on each side of --"),
    ],
)
def test_issue12_cli_sides_usage(args: list[str], match: str) -> None:
    result = runner.invoke(app, ["diff", *args])
    assert result.exit_code == 2
    assert match in result.stderr and len(result.stderr.splitlines()) == 1


def test_issue12_cli_damaged_input_exits_3(recs: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut.mcap"
    data = recs["base"].read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = runner.invoke(app, ["diff", str(recs["base"]), str(cut), "-f", "json"])
    assert result.exit_code == 3, result.output
    assert json.loads(result.stdout)["b"]["damaged"] is True
    assert "kvtool: finding (B): " in result.stderr
    crossed = runner.invoke(
        app, ["diff", str(recs["base"]), str(cut), "--fail-on", "blocks_stored:-0"]
    )
    assert crossed.exit_code == 1


def test_issue12_help_ends_with_examples() -> None:
    result = runner.invoke(app, ["diff", "--help"])
    assert result.exit_code == 0
    tail = result.stdout.rstrip().splitlines()[-6:]
    assert tail[0].strip() == "Examples:"
    assert [line.strip().split(" ")[0] for line in tail[1:]] == ["kvtool"] * 4 + ["--fail-on"]
    assert "kvtool.diff/1" in result.stdout


def test_issue12_python_dash_m_diff(recs: dict[str, Path]) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtool",
            "diff",
            str(recs["base"]),
            str(recs["dropped"]),
            "--by",
            "window",
            "--fail-on",
            "remove_events{window=64}:-20",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ""
    assert "window 64: 14 of 46 metrics changed" in proc.stdout
    assert "no window: 2 of 46 metrics changed" in proc.stdout
    assert "…" not in proc.stdout


def test_issue12_cli_groups_file_applies_to_both_sides(
    recs: dict[str, Path], tmp_path: Path
) -> None:
    # vLLM ~0.21 sent group_idx without kinds: unannotated until --groups names them.
    legacy = tmp_path / "legacy.mcap"
    write_capture(legacy, "gemma3.legacy-array-group-idx")
    groups = Path(__file__).parent / "data" / "groups" / "gemma3.json"
    args = ["diff", str(legacy), str(recs["base"]), "-f", "json"]
    without = json.loads(runner.invoke(app, args).stdout)
    assert {r["label"]: r["presence"] for r in without["rows"]} == {
        "unannotated": "a_only",
        "full_attention": "b_only",
        "sliding_window": "b_only",
    }
    assert without["totals"]["changed"] is False  # the same events, only labelled apart
    result = runner.invoke(app, [*args, "--groups", str(groups)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["changed"] is False
    assert doc["a"]["group_metadata"] == doc["b"]["group_metadata"] == [str(groups)]


def test_non_finite_values_are_no_value_and_the_json_stays_valid() -> None:
    """A NaN or inf metric (e.g. a lifetime) used to read as "changed" on identical
    sides (NaN != NaN), print ``+nan%`` and write a bare NaN token into the JSON."""
    a, b = _big_report("full_attention", 1), _big_report("full_attention", 1)
    for rep in (a, b):
        rep.totals = rep.totals.with_columns(
            lifetime_p50_s=pl.lit(float("nan")), lifetime_p90_s=pl.lit(float("inf"))
        )
    d = diff_reports(a, b)
    assert not d.totals.changed
    m = {x.metric: x for x in d.totals.metrics}
    assert m["lifetime_p50_s"].a is None and m["lifetime_p90_s"].b is None
    buf = io.StringIO()
    render_json(d, buf)
    assert "NaN" not in buf.getvalue() and "Infinity" not in buf.getvalue()
    json.loads(buf.getvalue(), parse_constant=lambda c: pytest.fail(f"JSON has {c}"))


def test_issue20_diff_compares_the_recompute_metrics(recs: dict[str, Path]) -> None:
    # Dropping remove batches leaves blocks cached that were evicted: their re-stores are
    # stores while live now, fewer recomputes. diff shows both, each way marked by the
    # registry's direction (more stores while live: worse; fewer recomputes: not).
    d = diff_recordings([recs["base"]], [recs["dropped"]])
    tot = {m.metric: m for m in d.totals.metrics}
    assert {"blocks_recomputed", "recompute_share", "recompute_distance_p50"} <= set(tot)
    assert "restored_blocks" not in tot  # the deprecated alias is not a metric of its own
    live, again = tot["stored_while_live"], tot["blocks_recomputed"]
    assert (live.a, live.b, live.worse) == (84, 99, True)
    assert again.delta == -15 and not again.worse
    rule = parse_fail_on("blocks_recomputed:-10")
    got = diff_reports(
        build_report([recs["base"]]), build_report([recs["dropped"]]), fail_on=[rule]
    )
    assert got.failed
