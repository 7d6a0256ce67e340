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
    return [
        "BlockStored",
        hashes,
        None,
        [1] * 16 * len(hashes),
        16,
        None,
        None,
        None,
        None,
        group,
        kind,
        None,
    ]


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
    code, out, err = run(
        "report", str(GEMMA), "--every", "500ms", "--format", "json", "--clock", "publish"
    )
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


# -- 11.4: slices on report and export -------------------------------------------------------


def two_ranks(path: Path) -> Path:
    """Two data-parallel ranks on their own channels, 1 s apart, one store each."""
    with RecordingWriter(path) as w:
        c0 = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        c1 = w.add_channel("tcp://127.0.0.1:5558", "", 1)
        t0 = 1_800_000_000 * 10**9
        for i in range(4):
            w.write(
                c0, i, ENC.encode([1.8e9 + i, [stored([10 + i], 0)], 0]), log_time=t0 + i * 10**9
            )
            w.write(
                c1,
                i,
                ENC.encode([1.8e9 + i, [stored([20 + i, 30 + i], 0)], 1]),
                log_time=t0 + i * 10**9 + 1,
            )
    return path


def test_issue11_4_report_since_until_equals_report_of_a_replay_slice(tmp_path: Path) -> None:
    sliced = tmp_path / "slice.mcap"
    code, _out, err = run("replay", str(GEMMA), "--since", "1s", "--until", "2s", "-o", str(sliced))
    assert code == 0, err
    code, out, err = run("report", str(GEMMA), "--since", "1s", "--until", "2s", "-f", "json")
    assert code == 0, err
    direct = json.loads(out)
    code, out, err = run("report", str(sliced), "-f", "json")
    assert code == 0, err
    via_slice = json.loads(out)
    for table in ("totals", "by_kind", "by_window", "by_group"):
        assert direct[table] == via_slice[table]
    assert direct["source"]["batches"] == via_slice["source"]["batches"] < 64
    assert direct["source"]["unselected_batches"] == 64 - direct["source"]["batches"]


def test_issue11_4_rank_and_channel_filters(tmp_path: Path) -> None:
    rec = two_ranks(tmp_path / "r.mcap")
    for args, stored_blocks in (
        ((), 12),
        (("--rank", "0"), 4),
        (("--rank", "1"), 8),
        (("--rank", "0,1"), 12),
        (("--channel", "5558"), 8),
        (("--since", "2s"), 6),
        (("--until", "1s"), 4),  # received at 0, 1 ns, 1 s (inclusive); not 1 s + 1 ns
        (("--rank", "1", "--since", "3s"), 2),
    ):
        for jobs in ("1", "2"):
            code, out, err = run("report", str(rec), "-f", "json", "--jobs", jobs, *args)
            assert code == 0, err
            assert json.loads(out)["totals"]["blocks_stored"] == stored_blocks, (args, jobs)


def test_issue11_4_export_filters(tmp_path: Path) -> None:
    import polars as pl

    rec = two_ranks(tmp_path / "r.mcap")
    out = tmp_path / "x.parquet"
    code, _o, err = run("export", str(rec), "-o", str(out), "--rank", "1", "--since", "1s")
    assert code == 0, err
    df = pl.read_parquet(out)
    assert df["dp_rank"].unique().to_list() == [1]
    assert df.height == 6
    assert df["event_index"].to_list() == sorted(df["event_index"])


def test_issue11_4_rank_selection_is_the_same_in_worker_processes(tmp_path: Path) -> None:
    from kvtool.selection import make_selection

    rec = two_ranks(tmp_path / "r.mcap")
    select = make_selection(rank=["1"], since="1s")
    # Tiny chunks: every batch is its own chunk, decoded (and rank-selected) by the pool.
    one = build_report([rec], select=select, chunk_bytes=1, every_ns=10**9)
    two = build_report([rec], select=select, chunk_bytes=1, every_ns=10**9, jobs=2)
    assert one.to_dict() == two.to_dict()
    assert one.totals["blocks_stored"].item() == 6
    assert one.source.batches == 3 and one.source.unselected_batches == 5


def test_issue11_4_empty_selection_says_so_and_bad_window_is_refused(tmp_path: Path) -> None:
    rec = two_ranks(tmp_path / "r.mcap")
    code, out, err = run("report", str(rec), "-f", "json", "--rank", "7")
    assert code == 0
    assert "0 of 8 batches matched --rank 7" in err
    assert json.loads(out)["totals"]["blocks_stored"] == 0
    code, _o, err = run("export", str(rec), "-o", str(tmp_path / "e.csv"), "--since", "9s")
    assert code == 0
    assert "0 of 8 batches matched --since 9s" in err
    code, _o, err = run("report", str(rec), "--since", "2s", "--until", "1s")
    assert code == 2
    assert "window is empty" in err


# -- 11.8: progress ---------------------------------------------------------------------------


def test_issue11_8_build_report_reports_bytes_read() -> None:
    seen: list[tuple[int, int]] = []
    build_report([GEMMA], progress=lambda done, total: seen.append((done, total)))
    size = GEMMA.stat().st_size
    assert seen and all(total == size for _d, total in seen)
    done = [d for d, _t in seen]
    assert done == sorted(done) and done[-1] == size


# -- 11.4: --by rank and --by channel ---------------------------------------------------------


def fleet(path: Path) -> Path:
    """Two ranks on two channels storing the same hashes; rank 1 evicts, rank 0 keeps."""
    with RecordingWriter(path) as w:
        c0 = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        c1 = w.add_channel("tcp://127.0.0.1:5558", "", 1)
        t0 = 1_800_000_000 * 10**9
        w.write(c0, 0, ENC.encode([1.8e9, [stored([1, 2, 3], 0)], 0]), log_time=t0)
        w.write(c1, 0, ENC.encode([1.8e9, [stored([1, 2], 0)], 1]), log_time=t0 + 1)
        w.write(c1, 1, ENC.encode([1.8e9 + 1, [removed([1, 2], 0)], 1]), log_time=t0 + 2)
        w.write(c1, 2, ENC.encode([1.8e9 + 2, [removed([9], 0)], 1]), log_time=t0 + 3)
    return path


def test_issue11_4_by_rank_and_by_channel(tmp_path: Path) -> None:
    rec = fleet(tmp_path / "f.mcap")
    code, out, err = run("report", str(rec), "-f", "json", "--by", "kind,rank,channel")
    assert code == 0, err
    rep = json.loads(out)
    ranks = {r["dp_rank"]: r for r in rep["by_rank"]}
    assert list(ranks) == [0, 1]
    assert ranks[0]["blocks_stored"] == 3 and ranks[0]["live_blocks_end"] == 3
    assert ranks[1]["blocks_stored"] == 2 and ranks[1]["blocks_removed"] == 3
    assert ranks[1]["orphan_removes"] == 1 and ranks[1]["peak_live_blocks"] == 2
    assert ranks[1]["lifetime_p50_s"] == 1.0
    chans = {r["channel"]: r for r in rep["by_channel"]}
    assert set(chans) == {"tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"}
    assert chans["tcp://127.0.0.1:5558"]["blocks_removed"] == 3
    # Additive columns of the split tables add up to the totals.
    for col in ("blocks_stored", "blocks_removed", "live_blocks_end", "orphan_removes"):
        assert sum(r[col] for r in rep["by_rank"]) == rep["totals"][col]
        assert sum(r[col] for r in rep["by_channel"]) == rep["totals"][col]
    # The default JSON contract has no split tables.
    code, out, _ = run("report", str(rec), "-f", "json")
    assert "by_rank" not in json.loads(out)


def test_issue11_4_by_rank_in_table_and_csv(tmp_path: Path) -> None:
    import csv
    import io

    rec = fleet(tmp_path / "f.mcap")
    code, out, err = run("report", str(rec), "--by", "rank")
    assert code == 0, err
    assert "by data-parallel rank" in out
    code, out, err = run("report", str(rec), "--by", "rank,channel", "-f", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["table"] for r in rows} == {"by_rank", "by_channel"}
    assert [r["dp_rank"] for r in rows if r["table"] == "by_rank"] == ["0", "1", ""]


def test_issue11_2_plot_warns_with_one_point_and_draws_on_receive_clock(tmp_path: Path) -> None:
    import pytest

    pytest.importorskip("matplotlib")
    png = tmp_path / "run.png"
    code, _out, err = run("report", str(GEMMA), "--every", "1s", "--plot", str(png))
    assert code == 0, err
    assert png.stat().st_size > 0 and "warning" not in err
    code, _out, err = run(
        "report", str(GEMMA), "--every", "1s", "--plot", str(png), "--force", "--clock", "publish"
    )
    assert code == 0
    assert "warning: the timeline has 1 point" in err
