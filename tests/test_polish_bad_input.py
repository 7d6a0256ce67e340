"""Bad input never crashes: every reading command on a truncated, byte-flipped or foreign
file, and a bad flag, says one line on stderr and exits non-zero, with no traceback.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app

SAMPLE = Path(__file__).resolve().parents[1] / "recordings" / "gemma3.mcap"
runner = CliRunner()


def _corrupt(tmp_path: Path) -> list[Path]:
    data = SAMPLE.read_bytes()
    out = []
    for cut in (0, 1, 20, 100, len(data) // 2, len(data) - 1):
        p = tmp_path / f"cut{cut}.mcap"
        p.write_bytes(data[:cut])
        out.append(p)
    for seed in (0, 3):
        r, b = random.Random(seed), bytearray(data)
        for _ in range(8):
            b[r.randrange(len(b))] ^= 0xFF
        p = tmp_path / f"flip{seed}.mcap"
        p.write_bytes(bytes(b))
        out.append(p)
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(b"not an mcap at all\n" * 10)
    return [*out, junk]


COMMANDS = [
    ["info"],
    ["report"],
    ["report", "--format", "json", "--jobs", "2"],
    ["replay"],
    ["replay", "--annotate", "--check"],
    ["top", "--once"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c))
def test_polish_corrupt_file_one_line_no_traceback(tmp_path: Path, cmd: list[str]) -> None:
    for path in _corrupt(tmp_path):
        r = runner.invoke(app, [*cmd, str(path)], env={"COLUMNS": "80"})
        where = f"{' '.join(cmd)} {path.name}"
        assert r.exception is None or isinstance(r.exception, SystemExit), where
        assert r.exit_code in (1, 3), where
        assert "Traceback" not in r.stderr, where
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith(f"kvtool: {path}")]
        assert len(lines) == 1, (where, r.stderr)  # status lines (replay --check) aside


@pytest.mark.parametrize(
    "args",
    [
        ["report", "--by", "nope"],
        ["report", "--every", "0s"],
        ["report", "--columns", "nope"],
        ["report", "--what-if", "+60,+60"],
        ["report", "--what-if", "+x"],
        ["info", "--format", "xml"],
        ["replay", "--since", "yesterday"],
        ["top", "--interval", "0"],
    ],
    ids=lambda a: " ".join(a),
)
def test_polish_bad_flag_one_line_exit_2(args: list[str]) -> None:
    # The console script's entry point: click's own usage errors become one line there.
    env = {**os.environ, "COLUMNS": "80"}
    cmd = [sys.executable, "-m", "kvtool", *args, str(SAMPLE)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
