"""Issue 23: every command that reads a recording says an unconfirmed tail once and exits 3.

A real recording from ``kvtool record`` against the test peer's replay socket, which
stops before its end marker (as in ``test_issue23_info.py``); then ``report``, ``replay``,
``export`` and ``diff`` on that file. Before: each exited 0 and said nothing, while
``info``, ``record`` and ``top`` exited 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app

runner = CliRunner()

_SAID = "never confirmed what followed"


def _said_once(stderr: str, endpoint: str, n: int) -> None:
    assert stderr.count(_SAID) == 1, stderr
    assert f"{_SAID} {endpoint} after seq {n - 8}" in stderr


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_issue23_report_says_the_unconfirmed_tail(
    unconfirmed_recording: tuple[Path, int, str], fmt: str
) -> None:
    """`report` exits 3, says the tail once on stderr, and JSON has it as a finding."""
    path, n, endpoint = unconfirmed_recording
    res = runner.invoke(app, ["report", str(path), "--format", fmt])
    assert res.exit_code == 3, res.output
    _said_once(res.stderr, endpoint, n)
    if fmt == "json":
        findings = json.loads(res.stdout)["source"]["findings"]
        assert sum(_SAID in f for f in findings) == 1


def test_issue23_replay_says_the_unconfirmed_tail(
    unconfirmed_recording: tuple[Path, int, str],
) -> None:
    """`replay --format jsonl` writes every batch recorded, says the tail once and exits 3."""
    path, n, endpoint = unconfirmed_recording
    res = runner.invoke(app, ["replay", str(path), "--format", "jsonl"])
    assert res.exit_code == 3, res.output
    seqs = {json.loads(line)["seq"] for line in res.stdout.splitlines()}
    assert seqs == set(range(n - 7))
    _said_once(res.stderr, endpoint, n)


def test_issue23_export_says_the_unconfirmed_tail(
    unconfirmed_recording: tuple[Path, int, str], tmp_path: Path
) -> None:
    """`export` writes the table, says the tail once and exits 3."""
    path, n, endpoint = unconfirmed_recording
    out = tmp_path / "events.csv"
    res = runner.invoke(app, ["export", str(path), "-o", str(out)])
    assert res.exit_code == 3, res.output
    assert out.exists()
    _said_once(res.stderr, endpoint, n)


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_issue23_diff_says_the_unconfirmed_tail(
    unconfirmed_recording: tuple[Path, int, str], fmt: str
) -> None:
    """`diff A A` on that recording: the tail is said once (per side given) and exit 3."""
    path, n, endpoint = unconfirmed_recording
    clean = Path(__file__).parent / "data" / "recordings"
    other = sorted(clean.glob("*.mcap"))[0]
    res = runner.invoke(app, ["diff", str(other), str(path), "--format", fmt])
    assert res.exit_code == 3, res.output
    _said_once(res.stderr, endpoint, n)


def test_issue23_serve_file_says_the_unconfirmed_tail(
    unconfirmed_recording: tuple[Path, int, str],
) -> None:
    """`serve FILE --exit-at-end` plays it, says the tail once and exits 3 (was 0)."""
    path, n, endpoint = unconfirmed_recording
    res = runner.invoke(
        app,
        ["serve", str(path), "--speed", "0", "--exit-at-end", "--metrics", "127.0.0.1:0"],
    )
    assert res.exit_code == 3, res.output
    _said_once(res.stderr, endpoint, n)
