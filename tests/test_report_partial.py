"""Partial reports (a unit of recordings → a partial report) merge into the one-pass report."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from kvtool.recording import RecordingWriter
from kvtool.report import build_report
from kvtool.report.partial import NotMergeable, Unit, plan_units
from tests.conftest import capture_messages
from tests.test_annotation_core import removed, stored

ENC = msgspec.msgpack.Encoder()
T0 = 1_764_000_000_000_000_000


def _fleet(tmp_path: Path, names: list[str], *, step_ns: int = 1_000_000) -> list[Path]:
    """One recording per data-parallel rank (port offset by the rank), batches interleaved."""
    paths = []
    for rank, name in enumerate(names):
        p = tmp_path / f"rank{rank}.mcap"
        with RecordingWriter(p) as w:
            ch = w.add_channel(f"tcp://127.0.0.1:{5557 + rank}", "", rank)
            for i, (_topic, seq, payload) in enumerate(capture_messages(name)):
                w.write(ch, seq, payload, log_time=T0 + i * step_ns + rank * 333)
        paths.append(p)
    return paths


def _same(a: dict, b: dict) -> None:
    # The findings are the same lines; every table, count and percentile is identical.
    fa, fb = a.pop("findings", None), b.pop("findings", None)
    assert a == b
    assert sorted(fa or []) == sorted(fb or [])


def test_issue10_partial_fleet_equals_one_pass(tmp_path: Path) -> None:
    paths = _fleet(tmp_path, ["gemma3", "gemma3.byteshash", "full_only"])
    assert plan_units(paths) == [Unit((0,)), Unit((1,)), Unit((2,))]
    for every in (None, 5_000_000):
        one = build_report(paths, every_ns=every).to_dict()
        merged = build_report(paths, every_ns=every, jobs=2).to_dict()
        assert merged["totals"]["blocks_stored"] > 0
        _same(merged, one)


def test_issue10_partial_files_sharing_a_stream_are_one_unit(tmp_path: Path) -> None:
    a, b = _fleet(tmp_path, ["gemma3", "full_only"])
    c = tmp_path / "rank0-again.mcap"
    with RecordingWriter(c) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.write(ch, 10_000, capture_messages("gemma3")[0][2], log_time=T0 + 10**12)
    assert plan_units([a, b, c]) == [Unit((0, 2)), Unit((1,))]
    _same(build_report([a, b, c], jobs=2).to_dict(), build_report([a, b, c]).to_dict())


def _stored(hashes: list[int], group: int) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": group,
        "kv_cache_spec_kind": "full_attention" if group == 0 else "sliding_window",
        "kv_cache_spec_sliding_window": None if group == 0 else 1024,
    }


def _removed(hashes: list[int], group: int) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": group}


def _random_rank(path: Path, rank: int, rng: random.Random, times: list[int]) -> None:
    """A rank's stream of random stores, removes (often of live blocks) and a clear."""
    live: list[tuple[int, int]] = []
    with RecordingWriter(path) as w:
        ch = w.add_channel(f"tcp://127.0.0.1:{6000 + rank}", "", rank)
        for seq, t in enumerate(times):
            events = []
            for _ in range(rng.randint(1, 6)):
                r = rng.random()
                if r < 0.45 or not live:
                    g = rng.randint(0, 1)
                    hs = [rng.randint(-(1 << 63), (1 << 63) - 1) for _ in range(rng.randint(1, 4))]
                    if live and rng.random() < 0.2:
                        hs.append(rng.choice(live)[1])  # a restore
                    events.append(_stored(hs, g))
                    live += [(g, h) for h in hs]
                elif r < 0.97:
                    g, h = live.pop(rng.randrange(len(live)))
                    events.append(_removed([h], g))
                    if rng.random() < 0.1:
                        events.append(_removed([h], g))  # an orphan
                else:
                    events.append({"type": "AllBlocksCleared"})
                    live = []
            w.write(ch, seq, ENC.encode([t / 1e9, events, rank]), log_time=t)


@pytest.mark.parametrize("seed", range(6))
def test_issue10_partial_random_fleets_merge_exactly(tmp_path: Path, seed: int) -> None:
    # Peaks across ranks depend on how the ranks interleave: random interleavings,
    # equal times on different ranks, random chunk sizes.
    rng = random.Random(seed)
    paths = []
    for rank in range(rng.randint(2, 4)):
        times = sorted(
            T0 + rng.randrange(0, 2_000_000_000, 1000) for _ in range(rng.randint(5, 60))
        )
        p = tmp_path / f"r{rank}.mcap"
        _random_rank(p, rank, rng, times)
        paths.append(p)
    chunk = rng.choice([500, 4000, 1 << 20])
    one = build_report(paths, chunk_bytes=chunk, every_ns=100_000_000).to_dict()
    merged = build_report(paths, chunk_bytes=chunk, every_ns=100_000_000, jobs=2).to_dict()
    _same(merged, one)


def test_issue10_partial_out_of_order_recording_is_read_in_one_pass(tmp_path: Path) -> None:
    # A rank whose receive times step backwards: its order is not THE merge order's key,
    # so the units are not merged (NotMergeable inside) and the one-pass report is given.
    rng = random.Random(7)
    a, b = tmp_path / "a.mcap", tmp_path / "b.mcap"
    _random_rank(a, 0, rng, [T0 + i * 1000 for i in range(30)])
    _random_rank(b, 1, rng, [T0 + (30 - i) * 1000 + 500 for i in range(30)])
    _same(build_report([a, b], jobs=2).to_dict(), build_report([a, b]).to_dict())


def _merged(paths: list[Path], split: int = 1, **kw: object) -> dict:
    """The merge itself (no fallback to one pass): report_units over the planned units."""
    from kvtool.columns import make_annotator
    from kvtool.report.api import report_units

    units = plan_units(paths, split=split)
    assert len(units) > 1
    return report_units(
        paths,
        units,
        make_annotator(paths),
        every_ns=kw.get("every_ns"),  # type: ignore[arg-type]
        chunk_bytes=kw.get("chunk_bytes", 1 << 20),  # type: ignore[arg-type]
        clock="receive",
        jobs=2,
        ray_address=None,
    ).to_dict()


def test_issue10_partial_merge_itself_is_exact(tmp_path: Path) -> None:
    paths = _fleet(tmp_path, ["gemma3", "gemma3.byteshash", "full_only"])
    _same(_merged(paths, every_ns=5_000_000), build_report(paths, every_ns=5_000_000).to_dict())
    rng = random.Random(11)
    fleet = []
    for rank in range(3):
        times = sorted(T0 + rng.randrange(0, 10**9, 1000) for _ in range(80))
        _random_rank(tmp_path / f"x{rank}.mcap", rank, rng, times)
        fleet.append(tmp_path / f"x{rank}.mcap")
    _same(_merged(fleet, chunk_bytes=700), build_report(fleet, chunk_bytes=700).to_dict())


def test_issue10_partial_merge_declines_an_out_of_order_unit(tmp_path: Path) -> None:
    rng = random.Random(7)
    a, b = tmp_path / "a.mcap", tmp_path / "b.mcap"
    _random_rank(a, 0, rng, [T0 + i * 1000 for i in range(30)])
    _random_rank(b, 1, rng, [T0 + (30 - i) * 1000 + 500 for i in range(30)])
    with pytest.raises(NotMergeable):
        _merged([a, b])


def _one_file_fleet(path: Path, rng: random.Random, ranks: int, backwards: bool = False) -> Path:
    """One recorder's file of several ranks' streams (one channel each), interleaved."""
    live: dict[int, list[tuple[int, int]]] = {r: [] for r in range(ranks)}
    with RecordingWriter(path) as w:
        chans = [w.add_channel(f"tcp://127.0.0.1:{7000 + r}", "", r) for r in range(ranks)]
        t = T0
        for n in range(200):
            r = rng.randrange(ranks)
            t += rng.choice([1, 2, 1000]) if not (backwards and n == 150) else -5000
            events = []
            for _ in range(rng.randint(1, 5)):
                if rng.random() < 0.5 or not live[r]:
                    hs = [rng.randint(0, 50) for _ in range(rng.randint(1, 3))]
                    events.append(_stored(hs, rng.randint(0, 1)))
                    live[r] += [(events[-1]["group_idx"], h) for h in hs]
                else:
                    g, h = live[r].pop(rng.randrange(len(live[r])))
                    events.append(_removed([h], g))
            w.write(chans[r], n, ENC.encode([t / 1e9, events, r]), log_time=t)
    return path


def test_issue10_partial_one_recording_of_many_ranks_splits_by_stream(tmp_path: Path) -> None:
    rng = random.Random(3)
    p = _one_file_fleet(tmp_path / "all.mcap", rng, 3)
    units = plan_units([p], split=2)
    assert [u.inputs for u in units] == [(0,), (0,)]
    assert len(units[0].streams or ()) + len(units[1].streams or ()) == 3
    one = build_report([p], every_ns=1_000_000).to_dict()
    _same(_merged([p], split=2, every_ns=1_000_000), one)
    _same(build_report([p], every_ns=1_000_000, jobs=2).to_dict(), one)
    _same(_merged([p], split=8, chunk_bytes=300), build_report([p], chunk_bytes=300).to_dict())


def test_issue10_partial_stream_split_declines_an_unordered_recording(tmp_path: Path) -> None:
    p = _one_file_fleet(tmp_path / "all.mcap", random.Random(4), 2, backwards=True)
    with pytest.raises(NotMergeable):
        _merged([p], split=2)
    _same(build_report([p], jobs=2).to_dict(), build_report([p]).to_dict())


def test_issue10_partial_lifetime_histograms_merge_as_one_process_bins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past EXACT_LIFETIMES one process bins every lifetime; units below the limit each
    # (exact) and above it (histogram) merge into the same bins. Run in this process, so
    # a small limit applies to the units too.
    import kvtool.report.lifetimes as lifetimes_mod
    from kvtool.columns import TableAnnotator, make_annotator
    from kvtool.report.builder import ReportBuilder
    from kvtool.report.partial import UnitTask
    from kvtool.report.run import finish_report, report_unit

    rng = random.Random(5)
    paths = []
    for rank in range(3):
        times = sorted(T0 + rng.randrange(0, 10**9, 1000) for _ in range(40 + 40 * rank))
        _random_rank(tmp_path / f"h{rank}.mcap", rank, rng, times)
        paths.append(tmp_path / f"h{rank}.mcap")
    ann = make_annotator(paths)
    for limit in (10**9, 60, 5):
        monkeypatch.setattr(lifetimes_mod, "EXACT_LIFETIMES", limit)
        one = build_report(paths).to_dict()
        units = plan_units(paths)
        parts = [
            report_unit(
                UnitTask(
                    [str(paths[i]) for i in u.inputs],
                    [str(paths[i]) for i in u.inputs],
                    list(u.inputs),
                    u.streams,
                    ann.annotation,
                    None,
                    "receive",
                    1 << 20,
                )
            )
            for u in units
        ]
        builder, stats = ReportBuilder.from_partials(parts, None, None, "receive")
        annotator = TableAnnotator(ann.annotation)
        annotator.adopt(stats, [p.out_of_range for p in parts])
        merged = finish_report(builder, annotator, stats).to_dict()
        assert ("histogram" in str(merged["source"]["lifetimes"])) == (limit < 200)
        _same(merged, one)


def test_issue10_default_jobs_is_one_process_for_a_small_fleet(tmp_path: Path) -> None:
    from kvtool.report.procs import default_jobs

    paths = _fleet(tmp_path, ["gemma3", "full_only"])
    assert len(plan_units(paths, split=2)) == 2  # two units exist...
    assert default_jobs(paths) == 1  # ...but a pool's start-up costs more than they save


# -- one pass and units agree on what a report shows besides its numbers --------------------

MS = 1_000_000


def _one_rank(path: Path, endpoint: str, rank: int, msgs: list[tuple[int, bytes]]) -> str:
    with RecordingWriter(path) as w:
        ch = w.add_channel(endpoint, "", rank)
        for seq, (t, payload) in enumerate(msgs):
            w.write(ch, seq, payload, log_time=t)
    return str(path)


def _batch(t: int, events: list[dict]) -> bytes:
    return ENC.encode([t / 1e9, events, None])


def test_units_number_channels_and_name_the_first_problem_as_one_pass(tmp_path: Path) -> None:
    # a.mcap's first batch is empty (no rows) and b.mcap's bad payload was received before
    # a.mcap's: the merge numbered channels by their first batch with rows, and named the
    # first unit's problem as the first.
    a = _one_rank(
        tmp_path / "a.mcap",
        "tcp://127.0.0.1:5557",
        0,
        [
            (T0, _batch(T0, [])),
            (T0 + 10 * MS, b"\xc1bad-a"),
            (T0 + 20 * MS, _batch(T0 + 20 * MS, [stored([1], 0, "full_attention")])),
        ],
    )
    b = _one_rank(
        tmp_path / "b.mcap",
        "tcp://127.0.0.1:6557",
        1,
        [
            (T0 + 5 * MS, b"\xc1bad-b"),
            (T0 + 15 * MS, _batch(T0 + 15 * MS, [stored([2], 0, "full_attention")])),
        ],
    )
    one = build_report([a, b])
    two = build_report([a, b], jobs=2)
    assert [c.channel for c in two.source.channels] == [
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:6557",
    ]
    assert two.source.channels == one.source.channels
    first = [f for f in one.findings if f.startswith("skipped 2 malformed")]
    assert len(first) == 1 and "b.mcap" in first[0] and "seq 0" in first[0]
    assert two.findings == one.findings


@pytest.mark.parametrize("chunk_bytes", [1, 64, 2000])
def test_orphan_remove_without_group_is_unattributed_in_the_timeline_too(
    tmp_path: Path, chunk_bytes: int
) -> None:
    # Rank 1 removes a hash it never stored, without group_idx, before its first store
    # with one: the totals called it unattributed, the timeline 'unannotated' when the
    # two batches fell in different chunks (and so in one process, not in units).
    p = tmp_path / "r.mcap"
    with RecordingWriter(p) as w:
        a = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        b = w.add_channel("tcp://127.0.0.1:5558", "", 1)
        w.write(a, 0, _batch(T0, [stored([1], 0, "full_attention")]), log_time=T0)
        w.write(b, 0, _batch(T0, [removed([5], None)]), log_time=T0 + 1)
        w.write(b, 1, _batch(T0, [stored([6], 1, "sliding_window")]), log_time=T0 + 2)
    reports = [
        build_report([str(p)], chunk_bytes=chunk_bytes, jobs=jobs, every_ns=3 * MS).to_dict()
        for jobs in (1, 2)
    ]
    assert reports[0] == reports[1]
    removes = {r["kind"]: r["removes"] for r in reports[0]["timeline"] if r["removes"]}
    assert removes == {"unattributed": 1}
    assert "unannotated" not in {r["kind"] for r in reports[0]["timeline"]}
