"""Issue 21 review (issue 20's alias): ``--fail-on restored_blocks:…`` watches stored_while_live.

JSON keeps ``restored_blocks`` as a deprecated alias of ``stored_while_live``; ``diff
--fail-on`` refused the name. It now takes it, watches the column it repeats, and says on
stderr that the name is deprecated.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.diff import parse_fail_on
from tests.recutil import write_capture

runner = CliRunner()


def test_issue21_fail_on_alias_parses_to_the_column() -> None:
    rule = parse_fail_on("restored_blocks:+10%")
    assert rule.metric == "stored_while_live"
    assert rule.alias == "restored_blocks"
    assert rule.deprecation is not None and "deprecated" in rule.deprecation
    assert parse_fail_on("stored_while_live:+10%").deprecation is None


def test_issue21_fail_on_alias_on_the_command_line(tmp_path: Path) -> None:
    a = tmp_path / "a.mcap"
    b = tmp_path / "b.mcap"
    write_capture(a, "gemma3")
    write_capture(b, "sglang_full")
    result = runner.invoke(
        app,
        ["diff", str(a), str(b), "--fail-on", "restored_blocks:+0", "--format", "json"],
    )
    new = runner.invoke(
        app,
        ["diff", str(a), str(b), "--fail-on", "stored_while_live:+0", "--format", "json"],
    )
    assert result.exit_code == new.exit_code, result.stderr
    assert result.exit_code in (0, 1), result.stderr
    assert "restored_blocks is the deprecated name of stored_while_live" in result.stderr
    assert "deprecated" not in new.stderr
    (check,) = json.loads(result.stdout)["fail_on"]
    (check_new,) = json.loads(new.stdout)["fail_on"]
    assert check["expr"] == "restored_blocks:+0"
    assert {k: v for k, v in check.items() if k != "expr"} == {
        k: v for k, v in check_new.items() if k != "expr"
    }
    assert check["matched_rows"] == 1
