"""Issue 20 (items 3-4): what-if sizing, checked against real reruns at larger pools.

``tests/data/whatif/{full,gemma3,mamba}`` hold a recording made by ``kvtool record`` from
a live replay of vLLM 0.33's own wire bytes at pool N0, and ``truth.json``: the real
recomputed blocks (``restores_after_eviction``) when the same workload ran on vLLM's
manager at N0 + 10/25/50/100/300 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.errors import UsageError
from kvtool.report.whatif import Extra, WhatIfRefused, parse_what_if, what_if
from tests.test_report import record_batches, removed, stored

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "whatif"
SHAPES = {
    "full": "full_seed7_N200.mcap",
    "gemma3": "gemma3_seed7_N600.mcap",
    "mamba": "mamba_seed7_N300.mcap",
}
# The issue's bounds: full attention and sliding-window hybrids ±5 %, Mamba hybrids ±15 %.
BOUND = {"full": 5.0, "gemma3": 5.0, "mamba": 15.0}


def _errors(shape: str) -> list[tuple[str, int, float]]:
    folder = DATA / shape
    truth = json.loads((folder / "truth.json").read_text())
    runs = truth["runs"][1:]
    extras = parse_what_if(",".join(f"+{r['K_blocks']}" for r in runs))
    res = what_if([folder / SHAPES[shape]], extras, groups_file=folder / "groups.json")
    out = []
    for entry, run in zip(res.entries, runs, strict=True):
        assert entry["extra_blocks"] == run["K_blocks"]
        real = {r["kind"]: r["restores_after_eviction"] for r in run["by_kind"]}
        for row in entry["by_kind"]:  # type: ignore[attr-defined]
            t = real[row["kind"]]
            out.append((row["kind"], run["K_blocks"], (row["blocks_recomputed"] - t) / t * 100))
    return out


@pytest.mark.parametrize("shape", ["full", "mamba"])
def test_issue20_what_if_within_bounds_of_the_reruns(shape: str) -> None:
    errs = _errors(shape)
    assert errs
    bad = [e for e in errs if abs(e[2]) > BOUND[shape]]
    assert not bad, bad


def test_issue20_gemma3_full_attention_within_5_percent() -> None:
    errs = [e for e in _errors("gemma3") if e[0] == "full_attention"]
    assert errs and all(abs(e[2]) <= 5.0 for e in errs), errs


def test_issue20_gemma3_sliding_window_within_5_percent() -> None:
    """Sliding-window groups: within the 5 % target at every K (max 4.2 %, at +150).

    It failed (8.0 % at +300) while a hit at the larger pool left alone the blocks the
    recorded engine hit as well: where the recorded pool held such a window block only
    in a copy the larger pool never made (a longer hit there skipped it), the larger
    pool's older copy stayed at its place in the ghost list and was evicted too early.
    Then (5.7 % at +600) while the larger pool was taken to hit whatever the recorded
    engine hit: where it no longer holds such a block at all (its older copy evicted),
    its hit is shorter, and the blocks between are computed again (kernel._held_hit).
    """
    errs = [e for e in _errors("gemma3") if e[0] == "sliding_window"]
    assert errs and all(abs(e[2]) <= 5.0 for e in errs), errs


def test_issue20_recorded_pool_reproduces_the_recording(tmp_path: Path) -> None:
    """At +0 the prediction is the recording's own recompute count, exactly."""
    folder = DATA / "gemma3"
    truth = json.loads((folder / "truth.json").read_text())["runs"][0]
    res = what_if([folder / SHAPES["gemma3"]], [Extra("+0", blocks=0)])
    rows = {r["kind"]: r for r in res.entries[0]["by_kind"]}  # type: ignore[attr-defined]
    for row in truth["by_kind"]:
        assert rows[row["kind"]]["blocks_recomputed"] == row["restores_after_eviction"]
        assert rows[row["kind"]]["blocks_recomputed_saved"] == 0


def test_issue20_ghost_list_mechanics(tmp_path: Path) -> None:
    """Three evicted blocks come back: K=3 keeps them all, K=2 the two evicted last."""
    fa = {"group": 0, "kind": "full_attention"}
    path = record_batches(
        tmp_path / "g.mcap",
        [
            [stored([1, 2, 3], **fa)],
            [removed([3, 2, 1], 0), stored([4, 5, 6], **fa)],
            [stored([1, 2, 3], **fa)],
        ],
    )
    res = what_if([path], parse_what_if("+2,+3"))
    k2, k3 = res.entries
    assert k2["totals"]["blocks_recomputed_recorded"] == 3  # type: ignore[index]
    assert k2["totals"]["blocks_recomputed"] == 1  # type: ignore[index]
    assert k2["totals"]["hit_tokens_gained"] == 32  # type: ignore[index]
    assert k3["totals"]["blocks_recomputed"] == 0  # type: ignore[index]
    assert k3["totals"]["blocks_recomputed_saved"] == 3  # type: ignore[index]
    assert k3["totals"]["hit_tokens_gained"] == 48  # type: ignore[index]


def test_issue20_json_contract_and_pool_size() -> None:
    folder = DATA / "gemma3"
    r = runner.invoke(
        app,
        [
            "report",
            str(folder / SHAPES["gemma3"]),
            "--what-if",
            "+60,+20%,+150",
            "--pool-blocks",
            "600",
            "--format",
            "json",
        ],
    )
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"source", "totals", "by_kind", "by_window", "by_group", "what_if"} <= set(out)
    entries = out["what_if"]
    assert [e["extra_blocks"] for e in entries] == [60, 120, 150]  # +20 % of 600 is +120
    for e in entries:
        assert e["channel"] == "tcp://127.0.0.1:7150" and e["pool_blocks"] == 600
        assert {"rank", "totals", "by_kind", "by_window", "by_group", "conditions"} <= set(e)
        for row in [e["totals"], *e["by_kind"], *e["by_window"], *e["by_group"]]:
            assert {"blocks_recomputed", "blocks_recomputed_saved", "hit_tokens_gained"} <= set(row)
        assert {r["kind"] for r in e["by_kind"]} == {"full_attention", "sliding_window"}
        assert {r["sliding_window"] for r in e["by_window"]} == {None, 64}
        assert [r["group_idx"] for r in e["by_group"]] == [0, 1, 2, 3, 4, 5]
        saved = e["totals"]["blocks_recomputed_saved"]
        assert saved == sum(r["blocks_recomputed_saved"] for r in e["by_group"]) and saved > 0


def test_issue20_table_lines_fit_80_columns() -> None:
    r = runner.invoke(
        app,
        ["report", str(DATA / "full" / SHAPES["full"]), "--what-if", "+20,+600"],
        env={"COLUMNS": "80"},
    )
    assert r.exit_code == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "recomputed" in ln and " → " in ln]
    assert len(lines) == 2
    assert lines[0].startswith(" +20 blocks  full_attention  recomputed 3,714 → ~")
    assert "(\u2212" in lines[0] and all(len(ln) <= 80 for ln in r.stdout.splitlines())


def test_issue20_pool_size_unknown_refuses_percent() -> None:
    r = runner.invoke(app, ["report", str(DATA / "full" / SHAPES["full"]), "--what-if", "+10%"])
    assert r.exit_code == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "--pool-blocks" in r.stderr


def test_issue20_removes_without_group_idx_in_a_hybrid_pool_are_refused(tmp_path: Path) -> None:
    path = record_batches(
        tmp_path / "old.mcap",
        [
            [
                stored([1, 2], group=0, kind="full_attention"),
                stored([1, 2], group=1, kind="sliding_window", window=64),
            ],
            [removed([1], None)],
        ],
    )
    r = runner.invoke(app, ["report", str(path), "--what-if", "+5"])
    assert r.exit_code == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "group_idx" in r.stderr
    with pytest.raises(WhatIfRefused):
        what_if([path], parse_what_if("+5"))


def test_issue20_conditions_name_mamba_band() -> None:
    folder = DATA / "mamba"
    res = what_if([folder / SHAPES["mamba"]], parse_what_if("+150"))
    entry = res.entries[0]
    names = [c["condition"] for c in entry["conditions"]]  # type: ignore[attr-defined]
    assert "mamba" in names and "same_requests" in names
    for row in entry["by_kind"]:  # type: ignore[attr-defined]
        lo, hi = row["blocks_recomputed_band"]
        assert lo <= row["blocks_recomputed"] <= hi
    assert any("band" in f for f in res.findings)


def test_issue20_jobs_1_and_2_agree() -> None:
    f = str(DATA / "mamba" / SHAPES["mamba"])
    outs = []
    for jobs in ("1", "2"):
        r = runner.invoke(app, ["report", f, "--what-if", "+30,+300", "-f", "json", "-j", jobs])
        assert r.exit_code == 0, r.stderr
        outs.append(json.loads(r.stdout)["what_if"])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("bad", ["60", "+", "+1.5", "+x%", "+60,,"])
def test_issue20_bad_what_if_values(bad: str) -> None:
    if bad == "60":
        assert parse_what_if(bad) == [Extra("60", blocks=60)]
        return
    with pytest.raises(UsageError):
        parse_what_if(bad)


def test_issue20_plot_draws_an_image(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "w.png"
    f = str(DATA / "full" / SHAPES["full"])
    r = runner.invoke(app, ["report", f, "--what-if", "+20,+200", "--plot", str(png), "-q"])
    assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


REC = Path(__file__).resolve().parent.parent / "recordings"


def _entry(path: Path, extra: str = "+20", **kw: object) -> dict[str, object]:
    return what_if([path], parse_what_if(extra), **kw).entries[0]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("variant", "base", "kw"),
    [
        ("gemma3-byteshash", "gemma3", {}),
        ("gemma3-legacy-group-idx", "gemma3", {"groups_file": REC / "gemma3.groups.json"}),
        ("full_only-legacy-initial", "full_only", {}),
    ],
)
def test_issue20_every_layout_predicts_the_same(
    variant: str, base: str, kw: dict[str, object]
) -> None:
    """32-byte hashes, array events, the first layout: the same events, the same prediction.

    (The first layout has neither ``group_idx`` nor kinds: its one group is unannotated.)
    """
    a = _entry(REC / f"{variant}.mcap", **kw)
    b = _entry(REC / f"{base}.mcap")
    assert a["totals"] == b["totals"]
    assert a["totals"]["blocks_recomputed_saved"] > 0  # type: ignore[index]
    strip = [{k: v for k, v in r.items() if k != "kind"} for r in a["by_kind"]]  # type: ignore[attr-defined]
    assert strip == [{k: v for k, v in r.items() if k != "kind"} for r in b["by_kind"]]  # type: ignore[attr-defined]


def test_issue20_rows_turned_into_arrays_piece_by_piece_agree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The extraction bounds memory by flushing rows into arrays; the pieces change nothing."""
    from kvtool.report.whatif import extract

    f = DATA / "mamba" / SHAPES["mamba"]
    whole = what_if([f], parse_what_if("+30,+300")).entries
    monkeypatch.setattr(extract, "_FLUSH", 997)
    assert what_if([f], parse_what_if("+30,+300")).entries == whole


def test_issue20_lost_batches_and_orphans_are_conditions() -> None:
    """A recording whose recorder lost batches: the eviction order is incomplete, said so."""
    r = runner.invoke(
        app, ["report", str(REC / "gemma3-gaps.mcap"), "--what-if", "+10", "-f", "json"]
    )
    assert r.exit_code == 3, r.stderr  # lost batches: exit 3, as every reading command
    entry = json.loads(r.stdout)["what_if"][0]
    names = [c["condition"] for c in entry["conditions"]]
    assert "lost_batches" in names and "orphan_removes" in names
    assert "the eviction order is incomplete" in r.stderr


def test_issue20_pool_blocks_shows_live_and_peak_as_a_share_of_the_pool() -> None:
    """Item 2: --pool-blocks N (num_gpu_blocks; block 0 is vLLM's null block)."""
    f = str(REC / "whatif-gemma3.mcap")
    r = runner.invoke(app, ["report", f, "--pool-blocks", "600", "-f", "json"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["pool"] == {
        "pool_blocks": 600,
        "usable_blocks": 599,
        "live_blocks_end": out["totals"]["live_blocks_end"],
        "live_share": round(out["totals"]["live_blocks_end"] / 599, 4),
        "peak_live_blocks": out["totals"]["peak_live_blocks"],
        "peak_share": round(out["totals"]["peak_live_blocks"] / 599, 4),
        "source": "--pool-blocks 600",
    }
    t = runner.invoke(app, ["report", f, "--pool-blocks", "600"], env={"COLUMNS": "80"})
    assert "pool 600 blocks (599 usable): live at end 593 (99 %), peak 593 (99 %)" in t.stdout
    two = runner.invoke(
        app, ["report", f, str(REC / "gemma3.mcap"), "--pool-blocks", "600", "-f", "json"]
    )
    # One engine's pool size for a fleet of two channels: refused in one line (exit 2),
    # never a report without the shares it was asked for (tests/test_issue20_conditions.py).
    assert two.exit_code == 2 and two.stdout == ""
    assert len(two.stderr.strip().splitlines()) == 1 and "--channel" in two.stderr


def test_issue20_publisher_restart_starts_the_pool_afresh(tmp_path: Path) -> None:
    """A seq going backwards is a new engine: a condition, and the ghost list is emptied."""
    import msgspec

    from kvtool.recording import RecordingWriter

    enc = msgspec.msgpack.Encoder()
    fa = {"group": 0, "kind": "full_attention"}
    batches = [
        (0, [stored([1, 2, 3], **fa)]),
        (1, [removed([3, 2, 1], 0)]),
        (0, [stored([1, 2, 3], **fa)]),  # the engine restarted: its cache is empty
    ]
    path = tmp_path / "restart.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for i, (seq, events) in enumerate(batches):
            w.write(ch, seq, enc.encode([1.0 + i, events, 0]), log_time=1_000_000_000 * (i + 1))
    entry = what_if([path], parse_what_if("+3")).entries[0]
    names = [c["condition"] for c in entry["conditions"]]  # type: ignore[attr-defined]
    assert "publisher_restart" in names
    # The blocks evicted before the restart are gone at any size: nothing is saved.
    assert entry["totals"]["blocks_recomputed_saved"] == 0  # type: ignore[index]


@pytest.mark.parametrize(
    "hashes", [["\u0180\x7f\x7f\x7f", 1], {"a": 1}, [1, "\xc6\xff\xff\xff\xff"]], ids=str
)
def test_issue20_malformed_block_hashes_refuse_the_what_if_in_one_line(
    tmp_path: Path, hashes: object
) -> None:
    """A string or map where hashes belong made the what-if read past its buffer (a
    segfault, exit 139) or count the event as zero hashes; the report skips such an event."""
    import subprocess
    import sys

    import msgspec

    from kvtool.recording import RecordingWriter

    enc = msgspec.msgpack.Encoder()

    def store(h: object, ts: float) -> bytes:
        ev = {
            "type": "BlockStored",
            "block_hashes": h,
            "parent_block_hash": None,
            "token_ids": list(range(32)),
            "block_size": 16,
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
        return enc.encode([ts, [ev], 0])

    path = tmp_path / "bad.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.write(ch, 0, store([11, 12], 1.0), 1_000_000_000)
        w.write(ch, 1, store(hashes, 2.0), 1_001_000_000)
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "report", str(path), "--what-if", "+10"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    # A cold JIT cache adds its one compile notice first; the refusal is one line.
    said = [ln for ln in proc.stderr.splitlines() if "compiling its numba kernels" not in ln]
    assert len(said) == 1 and "block_hashes" in said[0], proc.stderr


def test_issue20_pool_blocks_smaller_than_the_peak_is_a_finding() -> None:
    import subprocess
    import sys

    rec = Path(__file__).parent.parent / "recordings" / "whatif-gemma3.mcap"
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "report", str(rec), "--pool-blocks", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "kvtool: finding: --pool-blocks 5: the stream had 593 keys cached at once" in (
        proc.stderr
    )


def test_issue20_columns_past_32_bits_stay_64_bit(tmp_path: Path) -> None:
    """The what-if keeps its event rows in 32 bits where they fit; a group_idx past 2**31
    keeps its column 64-bit and predicts what group 1 predicts (the ghost-list example)."""
    out = []
    for group in (1, 2**33):
        fa = {"group": group, "kind": "full_attention"}
        path = record_batches(
            tmp_path / f"g{group}.mcap",
            [
                [stored([1, 2, 3], **fa)],
                [removed([3, 2, 1], group), stored([4, 5, 6], **fa)],
                [stored([1, 2, 3], **fa)],
            ],
        )
        entry = what_if([path], parse_what_if("+2"))
        out.append(entry.entries[0]["totals"])
    assert out[0] == out[1]
    assert out[0]["blocks_recomputed"] == 1  # type: ignore[index]


def test_issue20_wide_columns_predict_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input too large for 32-bit columns keeps them 64-bit: the same prediction."""
    from kvtool.report.whatif import extract

    f = DATA / "gemma3" / SHAPES["gemma3"]
    narrow = what_if([f], parse_what_if("+60,+600")).entries
    monkeypatch.setattr(extract, "_NARROW_LIMIT", 0)
    assert what_if([f], parse_what_if("+60,+600")).entries == narrow


@pytest.mark.parametrize("shape", ["full", "gemma3", "mamba"])
def test_issue20_recorded_counts_are_the_replay_at_plus_0(shape: str) -> None:
    """The recorded size's counts come from a cheap pass; they are the replay's at +0."""
    import numpy as np

    from kvtool.report.whatif import _simulate
    from kvtool.report.whatif.extract import extract_pools
    from kvtool.report.whatif.kernel import recorded

    folder = DATA / shape
    (pool,) = extract_pools([folder / SHAPES[shape]], groups_file=folder / "groups.json")
    a = pool.arrays
    rc, orphans = recorded(a["op_kind"], a["op_a"], a["op_group"], pool.n_keys, len(a["gkind"]))
    rc0, _hit, orphans0 = _simulate(pool, 0, True)
    assert np.array_equal(rc, rc0) and orphans == orphans0
    assert rc.sum() > 0
