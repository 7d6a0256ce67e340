"""Generic command-line behaviour: help, version, ``python -m kvtool``, usage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

import kvtool
from kvtool.cli import app
from tests.recutil import write_capture

runner = CliRunner()
COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_issue_command_is_registered() -> None:
    assert {"info", "record", "replay", "report"} <= set(COMMANDS)


def test_root_help_lists_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert result.stderr == ""
    for name in COMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name: str) -> None:
    result = runner.invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ") or "Usage:" in result.stdout
    assert f"kvtool {name}" in result.stdout or f" {name} " in result.stdout
    assert "Traceback" not in result.output
    # A real description, not just the usage line.
    assert len(result.stdout.strip().splitlines()) > 3


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"kvtool {kvtool.__version__}\n"


def test_python_dash_m(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"kvtool {kvtool.__version__}\n"


def test_python_dash_m_info_on_truncated_file(tmp_path: Path) -> None:
    # Exit status 3 and exactly one stderr line from a real process: no traceback.
    path = tmp_path / "cut.mcap"
    write_capture(path, "gemma3", chunk_size=2048)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "truncated" in lines[0]
    assert "Batches:" in proc.stdout


def test_no_arguments_shows_help_and_usage_status() -> None:
    result = runner.invoke(app, [])
    assert result.exit_code == 2
    assert "Usage:" in result.output


def test_unknown_command_is_usage_error() -> None:
    result = runner.invoke(app, ["frobnicate"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "No such command 'frobnicate'" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_unknown_flag_is_usage_error(name: str) -> None:
    result = runner.invoke(app, [name, "--no-such-flag"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "No such option: --no-such-flag" in result.stderr
    assert "Traceback" not in result.output


def test_bad_choice_is_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, limit=2)
    result = runner.invoke(app, ["info", "--format", "yaml", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "'yaml' is not one of 'table', 'json'" in result.stderr


def test_missing_argument_is_usage_error() -> None:
    result = runner.invoke(app, ["info"])
    assert result.exit_code == 2
    assert "Missing argument" in result.stderr


def test_traceback_flag_reraises(tmp_path: Path) -> None:
    path = tmp_path / "x.mcap"
    path.write_text("not mcap")
    plain = runner.invoke(app, ["info", str(path)])
    assert plain.exit_code == 1 and plain.exception is not None  # SystemExit only
    assert isinstance(plain.exception, SystemExit)
    loud = runner.invoke(app, ["--traceback", "info", str(path)])
    assert loud.exit_code == 1
    assert type(loud.exception).__name__ == "RecordingError"


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["replay", "--no-such-flag", "x.mcap"], "kvtool replay: No such option: --no-such-flag"),
        (["report"], "kvtool report: Missing argument"),
        (["record", "--dp-size", "0", "-o", "x.mcap", "5557"], "kvtool record: Invalid value"),
        (["nosuch"], "kvtool: No such command 'nosuch'"),
    ],
)
def test_console_script_usage_errors_are_one_line(args: list[str], expect: str) -> None:
    """Click's usage errors reach a user of the real entry point as one line, exit 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(expect)
