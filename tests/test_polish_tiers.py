"""``report --by medium`` shows rows only for media the stream names, no placeholder row.

A stream with one medium has no tier transition: one line says so (no table whose only
row is ``none … 0``); a stream that names no medium (vLLM before 0.11) says that once
instead of a table whose only row is the ``null`` medium.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
runner = CliRunner()


def _report(name: str, *more: str) -> str:
    r = runner.invoke(
        app, ["report", str(RECORDINGS / name), "--by", "medium", *more], env={"COLUMNS": "80"}
    )
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_polish_one_medium_says_no_transition_in_one_line() -> None:
    out = _report("gemma3.mcap")
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "tier transitions: none (the stream names one medium, GPU)" in lines
    assert not any(line.startswith("none ") for line in lines)
    assert "from_medium" not in out
    (gpu,) = [line for line in lines if line.startswith("GPU ")]
    assert "1,890" in gpu


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_polish_no_medium_is_said_once(fmt: str) -> None:
    out = _report("full_only-legacy-initial.mcap", "--format", fmt)
    flat = " ".join(out.split())
    assert flat.count("by medium: no event names a medium") == 1
    assert "tier transitions" not in out and "from_medium" not in out
    assert not any(line.startswith(("- ", "| - ", "none ")) for line in out.splitlines())
