"""A stream that gives no kind (SGLang, a stripped vLLM stream) is not "learned from" anything.

``report``'s group-metadata line and ``replay --annotate``'s status line said "learned from
annotated stores" although no store carried a kind; they say what is true, and keep saying
"learned" where stores did carry kinds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.annotate import NO_KIND_SOURCE
from kvtool.cli import app
from kvtool.learner import LEARNED_SOURCE
from tests.conftest import capture_messages
from tests.recutil import write_capture
from tests.replayutil import strip_payload, write_recording

runner = CliRunner()


@pytest.mark.parametrize("name", ["sglang_full", "sglang_swa"])
def test_polish_sglang_source_says_no_kind(tmp_path: Path, name: str) -> None:
    rec = tmp_path / f"{name}.mcap"
    write_capture(rec, name)
    r = runner.invoke(app, ["report", str(rec), "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["source"]["group_metadata"] == [NO_KIND_SOURCE]
    r = runner.invoke(app, ["report", str(rec)], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "learned from" not in r.stdout
    assert NO_KIND_SOURCE in r.stdout.replace("\n", " ")
    r = runner.invoke(app, ["replay", "--annotate", str(rec)])
    assert r.exit_code == 0, r.stderr
    assert f": {NO_KIND_SOURCE}" in r.stderr and "learned from" not in r.stderr


def test_polish_stripped_stream_says_no_kind_and_mixed_says_learned(tmp_path: Path) -> None:
    orig = capture_messages("gemma3")
    stripped = write_recording(
        tmp_path / "stripped.mcap", [(t, s, strip_payload(p)) for t, s, p in orig]
    )
    half = len(orig) // 2
    mixed = write_recording(
        tmp_path / "mixed.mcap", orig[:half] + [(t, s, strip_payload(p)) for t, s, p in orig[half:]]
    )
    for rec, said in ((stripped, NO_KIND_SOURCE), (mixed, LEARNED_SOURCE)):
        r = runner.invoke(app, ["report", str(rec), "--format", "json"])
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["source"]["group_metadata"] == [said]
