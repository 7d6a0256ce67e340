"""``--what-if`` asks for each size once: a size given twice is refused (exit 2, one line).

``+60,+60`` and ``+60,+060`` are refused before anything is read. A ``+10%`` that comes to
the blocks of a ``+K`` also given is not a repeat the user could see (in a fleet it may hold
in one pool only): both are answered, each under its own name, from one replay (it used to
be dropped without a word).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.errors import UsageError
from kvtool.report.whatif import parse_what_if

RECORDING = str(Path(__file__).resolve().parents[1] / "recordings" / "whatif-gemma3.mcap")
runner = CliRunner()


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("+60,+60", "+60 is given twice"),
        ("+60,+060", "+060 is +60 again"),
        ("+10%,+10.0%", "+10.0% is +10% again"),
        ("+5, +30,+5", "+5 is given twice"),
    ],
)
def test_polish_what_if_size_given_twice_is_refused(value: str, said: str) -> None:
    with pytest.raises(UsageError, match=re.escape(said)):
        parse_what_if(value)
    r = runner.invoke(app, ["report", RECORDING, "--what-if", value])
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in r.stderr


def test_polish_what_if_percent_that_is_a_given_k_is_answered_under_both_names() -> None:
    args = ["report", RECORDING, "--what-if", "+60,+10%", "--pool-blocks", "600", "-q"]
    r = runner.invoke(app, [*args, "-f", "json"])
    assert r.exit_code == 0, r.stderr
    entries = json.loads(r.stdout)["what_if"]
    assert [(e["extra"], e["extra_blocks"]) for e in entries] == [("+60", 60), ("+10%", 60)]
    assert entries[0]["totals"] == entries[1]["totals"]


def test_polish_what_if_distinct_sizes_still_run() -> None:
    assert [e.text for e in parse_what_if("+60,+10%,+61")] == ["+60", "+10%", "+61"]
    r = runner.invoke(app, ["report", RECORDING, "--what-if", "+60,+20%", "--pool-blocks", "600"])
    assert r.exit_code == 0, r.stderr
