"""Issue 22: the Grafana dashboard and the Prometheus alert rules in dashboards/ are true.

promtool checks and unit-tests the rules; every metric the dashboard and the rules name is
one ``kvtool serve`` really serves; every dashboard query runs on a real Prometheus that
scrapes ``kvtool serve`` and returns data.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kvtool.report.registry import METRICS
from kvtool.serve import histogram_samples
from tests.replayutil import capture_recording
from tests.test_serve import (
    DEADLINE_S,
    Prometheus,
    exporter_of,
    parse,
    prometheus_binary,
    report_json,
    serve_proc,
)

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
DASHBOARD = DASHBOARDS / "kvtool.json"
RULES = DASHBOARDS / "kvtool.rules.yml"
RULES_TEST = DASHBOARDS / "kvtool.rules.test.yml"
NAME = re.compile(r"\bkvtool_[a-z0-9_]+")
SUFFIXES = ("_total", "_bucket", "_count", "_sum")
VARIABLES = {
    "$kind": "full_attention",
    "$rank": ".*",
    "$medium": ".*",
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$__interval": "1s",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed (apt-get install -y prometheus)")
        pytest.skip("promtool is not on PATH (apt-get install -y prometheus)")
    return path


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            exprs.append(target["expr"])
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def as_query(expr: str) -> str:
    """A dashboard expression with Grafana's variables filled in; a variable's
    ``label_values(METRIC{SEL}, LABEL)`` as the PromQL that gives those values."""
    q = expr
    for var, val in VARIABLES.items():
        q = q.replace(var, val)
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
    if m:
        q = f"count by ({m.group(2)}) ({m.group(1)})"
    return q


def rule_exprs() -> list[str]:
    """The ``expr`` of every rule (one line, or a ``>-`` block of deeper-indented lines)."""
    exprs: list[str] = []
    lines = RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        key, _, rest = line.strip().partition(": ")
        if key != "expr":
            continue
        if rest != ">-":
            exprs.append(rest)
            continue
        indent = len(line) - len(line.lstrip())
        block = []
        for nxt in lines[i + 1 :]:
            if len(nxt) - len(nxt.lstrip()) <= indent:
                break
            block.append(nxt.strip())
        exprs.append(" ".join(block))
    return exprs


def not_computed_yet(rep: dict) -> set[str]:
    """Registry families the engine does not compute yet (no report column, or no samples
    for a histogram): declared, served once the engine has them."""
    out = set()
    for m in METRICS:
        if m.prom == "none":
            continue
        if m.prom == "histogram":
            from kvtool.report import ReportBuilder

            if histogram_samples(ReportBuilder(), m.prom_name) is None:
                out.add(m.prom_name)
        elif not any(n in rep["totals"] for n in (m.name, *m.aliases)):
            out.add(m.prom_name)
    return out


def base(name: str) -> str:
    for s in SUFFIXES:
        if name.endswith(s):
            return name.removesuffix(s)
    return name


def test_issue22_promtool_check_rules() -> None:
    proc = subprocess.run(
        [promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 6 rules found" in proc.stdout


def test_issue22_promtool_test_rules() -> None:
    proc = subprocess.run(
        [promtool(), "test", "rules", RULES_TEST.name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=DASHBOARDS,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    # One unit test per alert.
    alerts = set(re.findall(r"- alert: (\w+)", RULES.read_text()))
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert alerts == tested and len(alerts) == 5


def test_issue22_every_dashboard_and_rule_metric_is_served(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    exp = exporter_of(path, pool_blocks=1000)
    served = set(parse(exp.body().decode()))
    pending = not_computed_yet(report_json(path))
    assert pending == set()  # the engine computes every registry family now
    exprs = dashboard_exprs() + rule_exprs()
    named = {n for e in exprs for n in NAME.findall(e)}
    assert len(named) >= 15
    for n in sorted(named):
        assert n in served or base(n) in pending, f"{n} is not served by kvtool serve"
    # Nothing pending is served (the engine computes none of it today), and what the
    # dashboard shows of the health table is all there.
    assert not {base(n) for n in served} & pending
    for n in ("kvtool_batches_lost_total", "kvtool_seconds_since_last_batch", "kvtool_open_gaps"):
        assert n in named


def test_issue22_dashboard_is_importable_with_rank_variable_and_rows_per_kind() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    assert dash.get("id") is None  # importable as is: no id of another Grafana
    names = {v["name"]: v for v in dash["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource"
    assert names["rank"]["includeAll"] and "label_values" in names["rank"]["query"]["query"]
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    assert any(r.get("repeat") == "kind" for r in rows)
    titles = " ".join(p["title"] for p in dash["panels"])
    for word in ("Live and peak", "Recompute share", "lifetime", "Recompute gap", "lost"):
        assert word.lower() in titles.lower(), word
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            for t in p["targets"]:
                used = set(re.findall(r"\$\w+", t["expr"]))
                assert used <= set(VARIABLES), used
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.slow
@pytest.mark.zmq
def test_issue22_every_dashboard_query_runs_on_a_real_prometheus(tmp_path: Path) -> None:
    prometheus_binary()
    path = capture_recording(tmp_path, "gemma3")
    pending = not_computed_yet(report_json(path))
    assert pending == set()  # the engine computes every registry family now
    prom = None
    try:
        with serve_proc(
            tmp_path, str(path), "--speed", "0", "--pool-blocks", "1000", "--interval", "200ms"
        ) as (_proc, url):
            prom = Prometheus(tmp_path, url.removeprefix("http://").removesuffix("/metrics"))
            prom.ready()
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline:
                if (prom.scalar("count_over_time(kvtool_source_done[1m])") or 0) >= 4:
                    break
                time.sleep(0.2)
            empty = []
            for expr in dashboard_exprs() + rule_exprs():
                q = as_query(expr)
                res = prom.query(q)  # a syntax error fails here
                if expr.startswith("label_values("):
                    assert res, expr  # a variable with no values
                    continue
                if not res and not {base(n) for n in NAME.findall(q)} & pending:
                    empty.append(expr)
    finally:
        if prom is not None:
            prom.stop()
    # Alerts that hold now are empty by design (nothing lost, nothing stalled ...).
    alerts = {e for e in empty if re.search(r"[<>]=? ?[0-9.]+$|== 0$", e.strip())}
    assert set(empty) - alerts == set()


def test_issue22_readme_prometheus_config_is_valid_and_scrapes_serve_default() -> None:
    cfg = DASHBOARDS / "prometheus.yml"
    proc = subprocess.run(
        [promtool(), "check", "config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "127.0.0.1:9400" in cfg.read_text()  # serve's default bind
    assert "kvtool.rules.yml" in cfg.read_text()


def test_issue22_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses every panel and variable query (as recording rules): no server."""
    exprs = [as_query(e) for e in dashboard_exprs()]
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text(
        "groups:\n  - name: dashboard\n    rules:\n"
        + "".join(
            f"      - record: kvtool:dashboard_{i}\n        expr: {json.dumps(e)}\n"
            for i, e in enumerate(exprs)
        )
    )
    proc = subprocess.run(
        [promtool(), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


def test_issue22_dashboard_legends_and_variables_name_served_labels() -> None:
    """Every ``{{label}}`` of a legend is one the exporter serves and the query keeps; every
    variable a query uses is the dashboard's (or Grafana's own); the medium variable is
    there and filters every per-row query that the rank variable filters."""
    from kvtool.serve import LABELS

    dash = json.loads(DASHBOARD.read_text())
    defined = {f"${v['name']}" for v in dash["templating"]["list"]}
    assert "$medium" in defined
    builtin = {"$__rate_interval", "$__range", "$__interval"}
    for p in dash["panels"]:
        for t in p.get("targets", []):
            expr, legend = t["expr"], t.get("legendFormat", "")
            assert set(re.findall(r"\$\w+", expr)) <= defined | builtin, expr
            for label in re.findall(r"\{\{(\w+)\}\}", legend):
                assert label in LABELS, (label, expr)
                kept = re.search(r"\bby \(([^)]*)\)", expr)
                assert kept and label in kept.group(1).replace(" ", "").split(","), expr
            per_row = {m.prom_name for m in METRICS if m.prom != "none"}
            if {base(n) for n in NAME.findall(expr)} <= per_row:
                assert 'medium=~"$medium"' in expr, expr  # a per-row family
            else:
                assert "medium" not in expr, expr  # the exporter's own: no medium label
