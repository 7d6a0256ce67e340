"""Issue 20 item 2: the pool size (num_gpu_blocks) in record, a groups file, info and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import open_recording
from tests.conftest import capture_messages, capture_truth
from tests.peer import Peer

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "whatif" / "gemma3"
GEMMA3 = DATA / "gemma3_seed7_N600.mcap"


def _record(tmp_path: Path, *extra: str) -> tuple[Path, str]:
    msgs = capture_messages("full_only")
    out = tmp_path / "run.mcap"
    with Peer(msgs) as peer:
        res = runner.invoke(
            app, ["record", peer.endpoint, "-o", str(out), "-n", str(len(msgs)), *extra]
        )
    assert res.exit_code == 0, res.stderr
    return out, res.stderr


def _groups_object(tmp_path: Path, **pool: object) -> Path:
    path = tmp_path / "groups.json"
    path.write_text(json.dumps({"groups": capture_truth("full_only")["group_metadata"], **pool}))
    return path


def _report_json(*args: str) -> tuple[dict[str, object], str]:
    r = runner.invoke(app, ["report", *args, "-f", "json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout), r.stderr


@pytest.mark.zmq
def test_record_pool_blocks_is_stored_shown_by_info_and_used_by_report(tmp_path: Path) -> None:
    out, _ = _record(tmp_path, "--pool-blocks", "600")
    with open_recording(out) as r:
        assert r.context["pool_blocks"] == 600
    info = runner.invoke(app, ["info", str(out), "-f", "json"])
    assert info.exit_code == 0 and json.loads(info.stdout)["pool_blocks"] == 600
    table = runner.invoke(app, ["info", str(out)], env={"COLUMNS": "100"})
    assert "Pool:" in table.stdout and "600 blocks (num_gpu_blocks; 599 usable)" in table.stdout
    rep, err = _report_json(str(out))
    pool = rep["pool"]
    assert isinstance(pool, dict)
    assert pool["pool_blocks"] == 600 and pool["usable_blocks"] == 599
    assert pool["source"] == f"{out} (recording metadata)" and "finding" not in err
    # The flag wins; the disagreement is a finding.
    rep, err = _report_json(str(out), "--pool-blocks", "800")
    assert rep["pool"]["pool_blocks"] == 800  # type: ignore[index]
    assert "finding: pool size:" in err and "says 600 blocks" in err and "using 800" in err


@pytest.mark.zmq
def test_a_groups_file_may_carry_num_gpu_blocks(tmp_path: Path) -> None:
    groups = _groups_object(tmp_path, num_gpu_blocks=300)
    out, err = _record(tmp_path, "--groups", str(groups))
    assert "finding" not in err
    with open_recording(out) as r:
        assert r.context["pool_blocks"] == 300
        assert r.groups == capture_truth("full_only")["group_metadata"]
    # record: the flag wins over the file, and says so.
    (tmp_path / "b").mkdir()
    out2, err2 = _record(tmp_path / "b", "--groups", str(groups), "--pool-blocks", "400")
    assert "says 300 blocks" in err2
    with open_recording(out2) as r:
        assert r.context["pool_blocks"] == 400


def test_report_takes_the_pool_size_from_a_groups_file(tmp_path: Path) -> None:
    groups = tmp_path / "g.json"
    meta = json.loads((DATA / "groups.json").read_text())
    groups.write_text(json.dumps({"groups": meta, "pool_blocks": 600}))
    rep, _err = _report_json(str(GEMMA3), "--groups", str(groups), "--what-if", "+10%")
    assert rep["pool"]["pool_blocks"] == 600  # type: ignore[index]
    entries = rep["what_if"]
    assert isinstance(entries, list) and entries[0]["extra_blocks"] == 60
    assert entries[0]["pool_blocks"] == 600


@pytest.mark.parametrize("bad", ['"600"', "1", "true", "-5"])
def test_a_bad_pool_size_in_a_groups_file_is_one_line_exit_2(tmp_path: Path, bad: str) -> None:
    groups = tmp_path / "g.json"
    meta = (DATA / "groups.json").read_text()
    groups.write_text(f'{{"groups": {meta}, "num_gpu_blocks": {bad}}}')
    r = runner.invoke(app, ["report", str(GEMMA3), "--groups", str(groups)])
    assert r.exit_code == 2 and r.stdout == ""
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "num_gpu_blocks" in line and str(groups) in line


@pytest.mark.parametrize("n", [str(2**40 + 1), "99999999999999999999999"])
@pytest.mark.parametrize(
    "command",
    [
        ["report", str(GEMMA3)],
        ["record", "tcp://127.0.0.1:1", "-o", "never.mcap"],
        ["serve", "tcp://127.0.0.1:1"],
    ],
    ids=["report", "record", "serve"],
)
def test_pool_blocks_past_the_recordings_bound_is_refused(command: list[str], n: str) -> None:
    """--pool-blocks stops where the recording's context record does (2**40), for all three."""
    r = runner.invoke(app, [*command, "--pool-blocks", n])
    assert r.exit_code == 2 and r.stdout == ""
    assert f"'--pool-blocks': Input should be less than or equal to {2**40}" in r.stderr
    assert not Path("never.mcap").exists()


def test_what_if_percent_obeys_the_cap_on_blocks() -> None:
    """+P% of a large pool is capped as +K blocks is: one line, exit 2, not an overflow."""
    r = runner.invoke(
        app, ["report", str(GEMMA3), "--pool-blocks", str(2**40), "--what-if", "+10%"]
    )
    assert r.exit_code == 2 and r.stdout == "", r.stderr
    assert r.stderr == (
        f"kvtool: --what-if +10%: more than +2,147,483,647 blocks for a pool of {2**40:,} "
        "(a pool is far smaller)\n"
    )
    huge = "+" + "9" * 400 + "%"
    r = runner.invoke(app, ["report", str(GEMMA3), "--pool-blocks", "600", "--what-if", huge])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1, r.stderr
