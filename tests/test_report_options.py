"""Report and export options of issue 11: the timeline's clock, slices, progress."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingWriter
from kvtool.report import build_report

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
GEMMA = ROOT / "recordings" / "gemma3.mcap"
ENC = msgspec.msgpack.Encoder()


def stored(hashes: list[int], group: int, kind: str = "full_attention") -> list[object]:
    # vLLM 0.33 array layout: tag, block_hashes, parent, token_ids, block_size, lora_id,
    # medium, lora_name, extra_keys, group_idx, kind, window.
    return ["BlockStored", hashes, None, [1] * 16 * len(hashes), 16, None, None, None, None,
            group, kind, None]


def removed(hashes: list[int], group: int) -> list[object]:
    return ["BlockRemoved", hashes, None, group]


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


# -- 11.2: the timeline has a clock ----------------------------------------------------------


def test_issue11_2_readme_timeline_has_rows_on_the_receive_clock() -> None:
    # The shipped recording spans 3.15 s of receive time and 0.063 s of publish ts: the
    # README's `--every 500ms` needs the receive clock (the default) for a real timeline.
    code, out, err = run("report", str(GEMMA), "--every", "500ms", "--format", "json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["source"]["clock"] == "receive"
    assert len({r["time_s"] for r in rep["timeline"]}) >= 2
    assert "warning" not in err


def test_issue11_2_publish_clock_and_one_point_warning() -> None:
    code, out, err = run("report", str(GEMMA), "--every", "500ms", "--format", "json",
                         "--clock", "publish")
    assert code == 0
    rep = json.loads(out)
    assert rep["source"]["clock"] == "publish"
    assert len({r["time_s"] for r in rep["timeline"]}) == 1
    assert "warning: the timeline has 1 point" in err
    assert "--clock receive" in err


def test_issue11_2_both_clocks_sum_to_the_same_counts() -> None:
    a = build_report([GEMMA], every_ns=10_000_000, clock="receive")
    b = build_report([GEMMA], every_ns=10_000_000, clock="publish")
    assert a.totals.equals(b.totals)
    assert a.timeline is not None and b.timeline is not None
    for col in ("stores", "removes"):
        assert a.timeline[col].sum() == b.timeline[col].sum()
    last = {r["kind"]: r["live_blocks"] for r in a.timeline.iter_rows(named=True)}
    assert last == {r["kind"]: r["live_blocks"] for r in b.timeline.iter_rows(named=True)}


def test_issue11_2_receive_clock_buckets_by_log_time(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        # Publish ts all equal; received 1 s apart.
        w.write(ch, 0, ENC.encode([1.7e9, [stored([1], 0)], 0]), log_time=10**18)
        w.write(ch, 1, ENC.encode([1.7e9, [stored([2], 0)], 0]), log_time=10**18 + 10**9)
        w.write(ch, 2, ENC.encode([1.7e9, [removed([1], 0)], 0]), log_time=10**18 + 2 * 10**9)
    rep = build_report([path], every_ns=10**9)
    assert rep.timeline is not None
    assert rep.timeline["live_blocks"].to_list() == [1, 2, 1]
    assert rep.timeline["time_s"].to_list() == [0.0, 1.0, 2.0]
    pub = build_report([path], every_ns=10**9, clock="publish")
    assert pub.timeline is not None and pub.timeline["live_blocks"].to_list() == [1]


def test_issue11_2_bad_clock_is_a_usage_error() -> None:
    code, _out, _err = run("report", str(GEMMA), "--every", "1s", "--clock", "wall")
    assert code == 2
