"""kvtool report: truth files of every capture, attribution, multiset semantics, chunking, CLI."""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict, deque
from pathlib import Path

import msgspec
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.columns import UNANNOTATED, UNATTRIBUTED
from kvtool.errors import UsageError
from kvtool.protocol import decode_batch, event_type, hash_key
from kvtool.recording import RecordingWriter
from kvtool.report import COLUMNS, COUNT_COLUMNS, build_report
from tests.conftest import CAPTURES, capture_messages, capture_truth

runner = CliRunner()
ENC = msgspec.msgpack.Encoder()


# -- helpers (also used by test_export) --------------------------------------------------------


def record_capture(
    name: str,
    path: Path,
    *,
    groups: list[dict[str, object]] | None = None,
    endpoint: str = "tcp://127.0.0.1:5557",
    dp_rank: int | None = 0,
) -> Path:
    """Write a capture's payloads into a recording, byte for byte."""
    with RecordingWriter(path) as w:
        ch = w.add_channel(endpoint, "", dp_rank)
        for i, (_topic, seq, payload) in enumerate(capture_messages(name)):
            w.write(ch, seq, payload, log_time=1_000_000_000 + i * 1_000_000)
        if groups is not None:
            w.add_groups(groups, "test")
    return path


def stored(hashes, group=None, kind=None, window=None, tokens=None, *, with_group=True):
    ev = {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))) if tokens is None else tokens,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    if with_group:
        ev["group_idx"] = group
        if kind is not None:
            ev["kv_cache_spec_kind"] = kind
            ev["kv_cache_spec_sliding_window"] = window
    return ev


def removed(hashes, group=None, *, with_group=True):
    ev = {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}
    if with_group and group is not None:
        ev["group_idx"] = group
    return ev


CLEAR = {"type": "AllBlocksCleared"}


def record_batches(
    path: Path,
    batches: list[list[dict[str, object]]],
    *,
    groups: list[dict[str, object]] | None = None,
    t0: float = 1_700_000_000.0,
    step: float = 1.0,
) -> Path:
    """Record hand-made batches (vLLM 0.33 layout: array batch, map events), one per second."""
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for seq, events in enumerate(batches):
            ts = t0 + seq * step
            w.write(ch, seq, ENC.encode([ts, events, 0]), log_time=int(ts * 1e9))
        if groups is not None:
            w.add_groups(groups, "test")
    return path


def report_json(*args: str) -> dict:
    result = runner.invoke(app, ["report", *args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# -- an independent reference: a plain dict loop over decoded events ---------------------------


def reference(payloads: list[bytes], table: dict[int, tuple[str, int | None]] | None = None):
    """Per-kind figures computed event by event (the hand loop DESIGN.md describes)."""
    # What annotated stores say, learned from the whole input first (kvtool.annotate's
    # GroupLearner): per group the value most stores say, on a tie the first said.
    said: dict[object, dict[tuple[str, int | None], list[int]]] = defaultdict(dict)
    n_seen = 0
    for raw in payloads:
        for ev in decode_batch(raw).events:
            if (
                event_type(ev) == "BlockStored"
                and ev.kv_cache_spec_kind is not None
                and (ev.group_idx is not None)
            ):
                kw = (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window)
                got = said[ev.group_idx].setdefault(kw, [0, n_seen])
                got[0] += 1
                n_seen += 1
    learned: dict[int | None, tuple[str, int | None]] = {
        g: min(vals.items(), key=lambda kv: (-kv[1][0], kv[1][1]))[0] for g, vals in said.items()
    }
    count: Counter = Counter()
    fifo: dict = defaultdict(deque)
    kind_of_entry: dict = defaultdict(deque)
    live_kind: Counter = Counter()
    out: dict[str, Counter] = defaultdict(Counter)
    peak: Counter = Counter()
    total_live = 0
    total_peak = 0
    distinct: dict[str, set] = defaultdict(set)
    lifetimes: dict[str, list[float]] = defaultdict(list)

    def kind_for(g, wire=None):
        if table is not None and g in table:
            return table[g]
        if wire is not None and wire[0] is not None:
            return wire
        if g in learned:
            return learned[g]
        return (UNANNOTATED, None)

    def bump(k, d):
        nonlocal total_live, total_peak
        live_kind[k] += d
        total_live += d
        peak[k] = max(peak[k], live_kind[k])
        total_peak = max(total_peak, total_live)

    for raw in payloads:
        b = decode_batch(raw)
        ts_us = round(b.ts * 1e6)
        for ev in b.events:
            t = event_type(ev)
            if t == "AllBlocksCleared":
                for key, c in list(count.items()):
                    for _ in range(c):
                        k = kind_of_entry[key].popleft()
                        out[k]["blocks_cleared"] += 1
                        bump(k, -1)
                count.clear()
                fifo.clear()
                kind_of_entry.clear()
                continue
            if t == "BlockStored":
                wire = (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window)
                k = kind_for(ev.group_idx, wire)[0]
                out[k]["store_events"] += 1
                out[k]["tokens_stored"] += len(ev.token_ids)
                for h in ev.block_hashes:
                    key = (ev.group_idx, hash_key(h))
                    out[k]["blocks_stored"] += 1
                    distinct[k].add(hash_key(h))
                    if count[key] > 0:
                        out[k]["stored_while_live"] += 1
                    count[key] += 1
                    fifo[key].append(ts_us)
                    kind_of_entry[key].append(k)
                    bump(k, 1)
                continue
            first = True
            for h in ev.block_hashes:
                hk = hash_key(h)
                g = ev.group_idx
                if g is None:
                    cands = [gg for (gg, hh), c in count.items() if hh == hk and c > 0]
                    if len(cands) == 1:
                        g = cands[0]
                        k = kind_for(g)[0]
                    else:
                        k = UNATTRIBUTED
                        out[k]["blocks_removed"] += 1
                        out[k]["remove_events"] += first
                        out[k]["orphan_removes"] += not cands
                        first = False
                        continue
                else:
                    k = kind_for(g)[0]
                key = (g, hk)
                out[k]["blocks_removed"] += 1
                out[k]["remove_events"] += first
                first = False
                if count[key] == 0:
                    out[k]["orphan_removes"] += 1
                    continue
                count[key] -= 1
                t_store = fifo[key].popleft()
                k_store = kind_of_entry[key].popleft()
                lifetimes[k].append((ts_us - t_store) / 1e6)
                bump(k_store, -1)
            if first:  # a remove with no hashes
                out[kind_for(ev.group_idx)[0]]["remove_events"] += 1
    # A key with two live copies is one key (issue 21: live_keys counts distinct keys).
    live_keys = Counter(kind_of_entry[key][0] for key, c in count.items() if c > 0)
    for k in list(out) + list(live_kind):
        out[k]["live_blocks_end"] = live_kind[k]
        out[k]["live_keys"] = live_keys[k]
        out[k]["peak_live_blocks"] = peak[k]
        out[k]["distinct_hashes"] = len(distinct[k])
    res = {k: dict(v) for k, v in out.items()}
    tot: Counter = Counter()
    for v in out.values():
        tot.update(v)
    tot["peak_live_blocks"] = total_peak
    tot["distinct_hashes"] = len(set().union(*distinct.values())) if distinct else 0
    all_lt = sorted(x for v in lifetimes.values() for x in v)
    return res, dict(tot), {k: sorted(v) for k, v in lifetimes.items()}, all_lt


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def check_against_reference(rep_dict: dict, payloads: list[bytes], table=None) -> None:
    ref, tot, lts, all_lt = reference(payloads, table)
    by_kind = {r["kind"]: r for r in rep_dict["by_kind"]}
    # Recomputes have their own independent count (test_issue20_recompute).
    counts = [
        c for c in COUNT_COLUMNS if c not in ("blocks_recomputed", "ambiguous_copy_evictions")
    ]
    assert set(by_kind) == {k for k, v in ref.items() if any(v.values())} | {
        k for k, v in ref.items() if v.get("store_events") or v.get("remove_events")
    }
    for k, row in by_kind.items():
        exp = dict(ref.get(k, {}))
        # One key per block in these captures (block size = hash block size, issue 21).
        exp["live_entries"] = exp.get("live_blocks_end", 0)
        exp["entries_cleared"] = exp.get("blocks_cleared", 0)
        assert {c: row[c] for c in counts} == {c: exp.get(c, 0) for c in counts}, k
        for q, name in ((0.5, "lifetime_p50_s"), (0.9, "lifetime_p90_s"), (0.99, "lifetime_p99_s")):
            want = _quantile(lts.get(k, []), q)
            if row["ambiguous_copy_evictions"] and want is not None:
                # R8: which copy went is not on the wire; this loop takes the oldest, one of
                # the bound's two extreme rules (docs/SEMANTICS.md).
                low, high = row[f"{name}_bound_low"], row[f"{name}_bound_high"]
                assert low - 1e-6 <= want <= high + 1e-6, (k, name)
                continue
            assert row[name] == (None if want is None else pytest.approx(want, abs=1e-6)), (k, name)
    totals = rep_dict["totals"]
    tot = {**tot, "live_entries": tot.get("live_blocks_end", 0)}
    tot["entries_cleared"] = tot.get("blocks_cleared", 0)
    assert {c: totals[c] for c in counts} == {c: tot.get(c, 0) for c in counts}
    if totals["ambiguous_copy_evictions"] and all_lt:
        want = _quantile(all_lt, 0.9)
        assert totals["lifetime_p90_s_bound_low"] - 1e-6 <= want
        assert want <= totals["lifetime_p90_s_bound_high"] + 1e-6
    else:
        assert totals["lifetime_p90_s"] == (
            None if not all_lt else pytest.approx(_quantile(all_lt, 0.9), abs=1e-6)
        )


# -- truth files ------------------------------------------------------------------------------


def _truth_rows(truth: dict) -> dict[tuple[str, int | None], dict[str, int]]:
    rows: dict[tuple[str, int | None], dict[str, int]] = defaultdict(Counter)
    for r in truth["block_stored"]["by_kind_window"]:
        key = (r["kind"], r["sliding_window"])
        rows[key]["store_events"] += r["events"]
        rows[key]["blocks_stored"] += r["blocks"]
        rows[key]["tokens_stored"] += r["tokens"]
    for r in truth["block_removed"]["by_kind_window"]:
        key = (r["kind"], r["sliding_window"])
        rows[key]["remove_events"] += r["events"]
        rows[key]["blocks_removed"] += r["blocks"]
    return rows


def _cleared_and_live(name: str, meta: list[dict]) -> tuple[Counter, Counter]:
    """Blocks dropped by AllBlocksCleared and live at the end, per kind: a plain dict loop."""
    kind = {g["group_idx"]: g["kind"] for g in meta}
    live: Counter = Counter()
    cleared: Counter = Counter()
    for _t, _s, payload in capture_messages(name):
        for ev in decode_batch(payload).events:
            t = event_type(ev)
            if t == "AllBlocksCleared":
                for (g, _h), c in live.items():
                    cleared[kind.get(g, kind.get(0))] += c
                live.clear()
            elif t == "BlockStored":
                for h in ev.block_hashes:
                    live[(ev.group_idx, hash_key(h))] += 1
            else:
                for h in ev.block_hashes:
                    key = (ev.group_idx, hash_key(h))
                    if live[key] > 0:
                        live[key] -= 1
    end: Counter = Counter()
    for (g, _h), c in live.items():
        end[kind.get(g, kind.get(0))] += c
    return cleared, end


@pytest.mark.parametrize("name", CAPTURES)
def test_report_json_equals_truth(name: str, tmp_path: Path) -> None:
    truth = capture_truth(name)
    meta = truth["group_metadata"]
    rec = record_capture(name, tmp_path / "r.mcap")
    args = [str(rec)]
    if "group-idx" in name:
        gfile = tmp_path / "groups.json"
        gfile.write_text(json.dumps(meta))
        args += ["--groups", str(gfile)]
    rep = report_json(*args, "--by", "kind,window,group", "--lifetime-bounds")
    assert set(rep) == {"source", "totals", "by_kind", "by_window", "by_group"}
    want = _truth_rows(truth)
    cleared, live_end = _cleared_and_live(name, meta)
    legacy_no_group = "initial" in name
    got_kind = {r["kind"]: r for r in rep["by_kind"]}
    for (kind, _window), exp in want.items():
        # The first layout has no group_idx: nothing can name a kind (unannotated).
        row = got_kind[UNANNOTATED if legacy_no_group else kind]
        for col, v in exp.items():
            assert row[col] == v, (kind, col)
        assert row["blocks_cleared"] == cleared[kind]
        assert row["live_blocks_end"] == live_end[kind]
    got_window = {r["sliding_window"]: r for r in rep["by_window"]}
    windows: dict[int | None, Counter] = defaultdict(Counter)
    for (kind, window), exp in want.items():
        windows[window].update(exp)
        windows[window]["blocks_cleared"] += cleared[kind]
        windows[window]["live_blocks_end"] += live_end[kind]
    for window, exp in windows.items():
        for col, v in exp.items():
            assert got_window[window][col] == v, (window, col)
    tot = rep["totals"]
    assert tot["blocks_stored"] == truth["block_stored"]["total"]["blocks"]
    assert tot["tokens_stored"] == truth["block_stored"]["total"]["tokens"]
    assert tot["blocks_removed"] == truth["block_removed"]["total"]["blocks"]
    assert tot["live_blocks_end"] == truth["end_state"]["blocks_stored_at_end"]
    assert tot["distinct_hashes"] == truth["distinct_block_hashes_stored"]
    assert tot["blocks_cleared"] == sum(cleared.values())
    assert tot["orphan_removes"] == truth["end_state"]["removed_hashes_without_prior_store"]
    assert not any(r["kind"] == UNATTRIBUTED for r in rep["by_kind"])
    by_group = {r["group_idx"]: r for r in rep["by_group"]}
    for g in truth["block_stored"]["by_group_idx"]:
        key = None if legacy_no_group else g["group_idx"]
        assert by_group[key]["blocks_stored"] == g["blocks"]
    # The independent per-event loop agrees on every column, lifetimes included.
    table = (
        {g["group_idx"]: (g["kind"], g["sliding_window"]) for g in meta}
        if "group-idx" in name
        else None
    )
    payloads = [p for _t, _s, p in capture_messages(name)]
    check_against_reference(rep, payloads, table)


def test_group_idx_capture_without_metadata_is_unannotated(tmp_path: Path) -> None:
    rec = record_capture("gemma3.legacy-array-group-idx", tmp_path / "r.mcap")
    result = runner.invoke(app, ["report", str(rec), "--format", "json"])
    assert result.exit_code == 0
    rep = json.loads(result.stdout)
    assert [r["kind"] for r in rep["by_kind"]] == [UNANNOTATED]
    assert any("--groups" in f for f in rep["source"]["findings"])
    assert "finding: no store was annotated" in result.stderr


def test_group_idx_capture_with_recording_metadata(tmp_path: Path) -> None:
    name = "gemma3.legacy-array-group-idx"
    meta = capture_truth(name)["group_metadata"]
    rec = record_capture(name, tmp_path / "r.mcap", groups=meta)
    rep = report_json(str(rec))
    kinds = {r["kind"]: r for r in rep["by_kind"]}
    assert set(kinds) == {"full_attention", "sliding_window"}
    assert kinds["sliding_window"]["blocks_removed"] == 1314
    assert "metadata record" in rep["source"]["group_metadata"][0]


def test_group_flags(tmp_path: Path) -> None:
    rec = record_capture("gemma3.legacy-array-group-idx", tmp_path / "r.mcap")
    flags = ["--group-meta", "0=full_attention"]
    for g in range(1, 6):
        flags += ["--group-meta", f"{g}=sliding_window:64"]
    rep = report_json(str(rec), *flags)
    assert {(r["sliding_window"], r["blocks_stored"]) for r in rep["by_window"]} == {
        (None, 315),
        (64, 1575),
    }


def test_several_files_make_one_report(tmp_path: Path) -> None:
    a = record_capture("gemma3", tmp_path / "a.mcap", endpoint="tcp://h:5557", dp_rank=0)
    b = record_capture("gemma3", tmp_path / "b.mcap", endpoint="tcp://h:5558", dp_rank=1)
    one = report_json(str(a))
    both = report_json(str(a), str(b))
    for col in ("blocks_stored", "blocks_removed", "live_blocks_end", "blocks_cleared"):
        assert both["totals"][col] == 2 * one["totals"][col]
    # Same hashes on two ranks are two channels' blocks, not restores.
    assert both["totals"]["restored_blocks"] == 2 * one["totals"]["restored_blocks"]
    assert both["totals"]["distinct_hashes"] == one["totals"]["distinct_hashes"]
    assert len(both["source"]["channels"]) == 2


# -- attribution of removes without group_idx ---------------------------------------------------


def test_remove_without_group_attributed_when_one_group(tmp_path: Path) -> None:
    rec = record_batches(
        tmp_path / "r.mcap",
        [
            [stored([1, 2], 0, "full_attention"), stored([1], 1, "sliding_window", 64)],
            [removed([2], with_group=False)],  # live in group 0 only -> full_attention
            [removed([1], with_group=False)],  # live in groups 0 and 1 -> unattributed
            [removed([9], with_group=False)],  # never stored -> unattributed orphan
        ],
    )
    rep = report_json(str(rec))
    kinds = {r["kind"]: r for r in rep["by_kind"]}
    assert kinds["full_attention"]["blocks_removed"] == 1
    assert kinds["full_attention"]["live_blocks_end"] == 1
    assert kinds["sliding_window"]["blocks_removed"] == 0
    assert kinds["sliding_window"]["live_blocks_end"] == 1
    assert kinds[UNATTRIBUTED]["blocks_removed"] == 2
    assert kinds[UNATTRIBUTED]["orphan_removes"] == 1
    assert rep["totals"]["live_blocks_end"] == 2
    assert any("unattributed" in f for f in rep["source"]["findings"])


def test_remove_without_group_follows_state_not_history(tmp_path: Path) -> None:
    rec = record_batches(
        tmp_path / "r.mcap",
        [
            [stored([7], 0, "full_attention"), stored([7], 1, "sliding_window", 64)],
            [removed([7], 1)],  # group 1 evicts its copy
            [removed([7], with_group=False)],  # now live in group 0 only
        ],
    )
    rep = report_json(str(rec))
    kinds = {r["kind"]: r for r in rep["by_kind"]}
    assert kinds["full_attention"]["blocks_removed"] == 1
    assert kinds["full_attention"]["orphan_removes"] == 0
    assert UNATTRIBUTED not in kinds
    assert rep["totals"]["live_blocks_end"] == 0


def test_old_vllm_removes_follow_their_stores(tmp_path: Path) -> None:
    name = "full_only.legacy-array-initial.signed"
    rec = record_capture(name, tmp_path / "r.mcap")
    rep = report_json(str(rec))
    assert [r["kind"] for r in rep["by_kind"]] == [UNANNOTATED]
    assert rep["by_kind"][0]["blocks_removed"] == 345
    assert rep["by_kind"][0]["orphan_removes"] == 0
    assert rep["by_group"][0]["group_idx"] is None


# -- multiset semantics -----------------------------------------------------------------------


def test_restored_orphan_and_clear(tmp_path: Path) -> None:
    fa = "full_attention"
    rec = record_batches(
        tmp_path / "r.mcap",
        [
            [stored([1, 2], 0, fa)],  # t=0: live {1, 2}
            [stored([1], 0, fa)],  # t=1: 1 again -> restored, live 1 twice
            [removed([1], 0)],  # t=2: lifetime 2 (FIFO: first store of 1)
            [removed([3], 0)],  # t=3: orphan, changes nothing
            [removed([1], 0)],  # t=4: lifetime 3
            [removed([1], 0)],  # t=5: orphan (1 no longer live)
            [stored([4], 0, fa), CLEAR],  # t=6: clear drops {2, 4}
            [removed([4], 0)],  # t=7: orphan after the clear
            [stored([5, 5], 0, fa)],  # t=8: 5 twice in one store: restored once
            [stored([], 0, fa, tokens=[1, 2, 3])],  # a store with zero hashes
        ],
    )
    rep = report_json(str(rec))
    row = rep["by_kind"][0]
    assert row["kind"] == fa
    assert row["store_events"] == 5
    assert row["blocks_stored"] == 6
    assert row["tokens_stored"] == 32 + 16 + 16 + 32 + 3
    assert row["remove_events"] == 5
    assert row["blocks_removed"] == 5
    assert row["orphan_removes"] == 3
    assert row["restored_blocks"] == 2
    assert row["blocks_cleared"] == 2
    assert row["live_blocks_end"] == 2
    assert row["peak_live_blocks"] == 3
    assert row["distinct_hashes"] == 4
    assert row["lifetime_p50_s"] == pytest.approx(2.5)
    assert rep["totals"]["orphan_removes"] == 3


# -- chunking ---------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 50_000])
def test_chunked_equals_one_piece(chunk_bytes: int, tmp_path: Path) -> None:
    rec = record_capture("gemma3", tmp_path / "r.mcap")
    whole = build_report([rec], every_ns=10_000_000).to_dict()
    parts = build_report([rec], every_ns=10_000_000, chunk_bytes=chunk_bytes).to_dict()
    assert parts == whole


_event = st.one_of(
    st.builds(
        lambda hs, g, k: ("S", hs, g, k),
        st.lists(st.integers(0, 5), max_size=3),
        st.sampled_from([0, 1, None]),
        st.booleans(),
    ),
    st.builds(lambda h, g: ("R", [h], g), st.integers(0, 6), st.sampled_from([0, 1, None])),
    st.just(("C",)),
)


def _encode(events) -> list[dict]:
    out = []
    for e in events:
        if e[0] == "S":
            _, hs, g, annotated = e
            kind = ("full_attention", None) if g in (0, None) else ("sliding_window", 8)
            out.append(stored(hs, g, *kind) if annotated and g is not None else stored(hs, g))
        elif e[0] == "R":
            out.append(removed(e[1], e[2]) if e[2] is not None else removed(e[1], with_group=False))
        else:
            out.append(CLEAR)
    return out


@pytest.mark.slow
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(st.lists(_event, max_size=5), min_size=1, max_size=12),
    chunk=st.sampled_from([1, 200, 10_000_000]),
)
@example(batches=[[("S", [0], 0, True), ("S", [0, 0], 0, False)]], chunk=1)
def test_vectorised_equals_event_loop(batches, chunk, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("h") / "r.mcap"
    encoded = [_encode(b) for b in batches]
    record_batches(path, encoded)
    # The event loop is the plain (incremental) reading: auto may take a parentless store
    # of a live prefix for a hit announcement (R6), e.g. [S 0, S 0 0] in one batch.
    rep = build_report(
        [path], chunk_bytes=chunk, lifetime_bounds=True, report_mode="incremental"
    ).to_dict()
    payloads = [ENC.encode([1_700_000_000.0 + i, b, 0]) for i, b in enumerate(encoded)]
    check_against_reference(rep, payloads)
    one = build_report([path], lifetime_bounds=True, report_mode="incremental").to_dict()
    assert rep == one
    # Auto's reading does not depend on where chunks end either.
    auto = build_report([path], chunk_bytes=chunk, lifetime_bounds=True).to_dict()
    assert auto == build_report([path], lifetime_bounds=True).to_dict()


# -- CLI formats ------------------------------------------------------------------------------


@pytest.fixture
def gemma_rec(tmp_path: Path) -> Path:
    return record_capture("gemma3", tmp_path / "g.mcap")


def test_json_contract(gemma_rec: Path) -> None:
    rep = report_json(str(gemma_rec))
    assert list(rep) == ["source", "totals", "by_kind", "by_window", "by_group"]
    # DESIGN.md's columns, then the deprecated alias (issue 20: one release).
    cols = [*COLUMNS, "restored_blocks"]
    assert list(rep["totals"]) == cols
    for row in [rep["totals"], *rep["by_kind"], *rep["by_window"], *rep["by_group"]]:
        assert row["restored_blocks"] == row["stored_while_live"]
    for row in rep["by_kind"]:
        assert list(row) == ["kind", *cols]
    for row in rep["by_window"]:
        assert list(row) == ["sliding_window", *cols]
    for row in rep["by_group"]:
        assert list(row) == ["group_idx", "kind", "sliding_window", *cols]
        assert isinstance(row["blocks_stored"], int)
    assert [r["sliding_window"] for r in rep["by_window"]] == [None, 64]
    assert [r["group_idx"] for r in rep["by_group"]] == [0, 1, 2, 3, 4, 5]


def test_every_adds_timeline(gemma_rec: Path) -> None:
    rep = report_json(str(gemma_rec), "--every", "10ms")
    assert list(rep)[-1] == "timeline"
    tl = rep["timeline"]
    assert set(tl[0]) == {
        "time_s",
        "width_s",
        "kind",
        "stores",
        "removes",
        "cleared",
        "live_blocks",
        "blocks_recomputed",
    }
    by_kind = {r["kind"]: r for r in rep["by_kind"]}
    for kind, row in by_kind.items():
        rows = [r for r in tl if r["kind"] == kind]
        assert sum(r["stores"] for r in rows) == row["blocks_stored"]
        assert sum(r["removes"] for r in rows) == row["blocks_removed"]
        assert sum(r["cleared"] for r in rows) == row["blocks_cleared"]
        assert rows[-1]["live_blocks"] == row["live_blocks_end"]
        assert max(r["live_blocks"] for r in rows) <= row["peak_live_blocks"]


def test_table_format(gemma_rec: Path) -> None:
    result = runner.invoke(app, ["report", str(gemma_rec), "--by", "kind,group"])
    assert result.exit_code == 0
    out = result.stdout
    assert "by kind" in out and "by group" in out and "by sliding window" not in out
    assert "full_attention" in out and "peak_live_blocks" in out and "total" in out
    assert result.stderr == ""


def test_csv_format(gemma_rec: Path) -> None:
    result = runner.invoke(app, ["report", str(gemma_rec), "--format", "csv"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split(",")[:4] == ["table", "kind", "sliding_window", "group_idx"]
    assert lines[0].split(",")[4:] == list(COLUMNS)
    assert lines[1].startswith("by_kind,full_attention,")
    assert lines[3].startswith("by_kind,total,")
    assert any(line.startswith("by_window,,64,") for line in lines)


def test_markdown_format_and_out(gemma_rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    result = runner.invoke(
        app, ["report", str(gemma_rec), "--format", "markdown", "--out", str(out)]
    )
    assert result.exit_code == 0
    assert result.stdout == ""
    text = out.read_text()
    assert "### by kind" in text and "### by sliding window" in text
    assert "| kind | store_events |" in text
    assert "| **total** | **396** |" in text


def test_bad_by_is_usage_error(gemma_rec: Path) -> None:
    result = runner.invoke(app, ["report", str(gemma_rec), "--by", "kind,colour"])
    assert result.exit_code == 2
    assert result.stderr.startswith("kvtool: --by 'kind,colour'")
    assert len(result.stderr.strip().splitlines()) == 1


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path / "nope.mcap")])
    assert result.exit_code == 1
    assert "nope.mcap" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_plot(gemma_rec: Path, tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    result = runner.invoke(
        app, ["report", str(gemma_rec), "--every", "5ms", "--plot", str(png), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "timeline" in json.loads(result.stdout)


def test_plot_without_matplotlib(gemma_rec: Path, tmp_path: Path, monkeypatch) -> None:
    from kvtool.plot import plot_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rep = build_report([gemma_rec], every_ns=10_000_000)
    with pytest.raises(UsageError, match=r"pip install 'kvtool\[plot\]'"):
        plot_report(rep, tmp_path / "p.png")


def test_damaged_recording_reports_and_exits_3(gemma_rec: Path, tmp_path: Path) -> None:
    data = gemma_rec.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = runner.invoke(app, ["report", str(cut), "--format", "json"])
    assert result.exit_code == 3
    rep = json.loads(result.stdout)
    assert rep["source"]["damaged"]
    assert "truncated" in result.stderr


def test_kind_with_stores_but_no_removes_is_a_finding(tmp_path: Path) -> None:
    rec = record_batches(
        tmp_path / "r.mcap",
        [
            [stored([1], 0, "full_attention"), stored([1], 1, "sliding_window", 64)],
            [removed([1], 0)],
        ],
    )
    rep = build_report([rec])
    assert any(
        f.startswith("sliding_window stored 1 blocks but none was evicted") for f in rep.findings
    )


def test_report_frames_are_polars(gemma_rec: Path) -> None:
    rep = build_report([gemma_rec])
    assert isinstance(rep.by_kind, pl.DataFrame)
    assert rep.by_kind.schema["blocks_stored"] == pl.Int64
    assert rep.totals.height == 1


def test_empty_and_clear_only_recordings(tmp_path: Path) -> None:
    empty = record_batches(tmp_path / "e.mcap", [])
    clear = record_batches(tmp_path / "c.mcap", [[CLEAR], []])
    for rec in (empty, clear):
        rep = report_json(str(rec), "--every", "1s")
        assert rep["by_kind"] == [] and rep["by_window"] == [] and rep["by_group"] == []
        assert rep["totals"]["blocks_stored"] == 0
        assert rep["timeline"] == []
        png = tmp_path / "p.png"
        result = runner.invoke(
            app, ["report", str(rec), "--every", "1s", "--plot", str(png), "--force"]
        )
        assert result.exit_code == 0, result.stderr
        assert png.exists()
        assert "total" in result.stdout


def test_non_finite_ts_falls_back_to_receive_time(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.write(
            ch,
            0,
            ENC.encode([float("nan"), [stored([7], 0, "full_attention")], 0]),
            log_time=5 * 10**9,
        )
        w.write(ch, 1, ENC.encode([7.0, [removed([7], 0)], 0]), log_time=7 * 10**9)
        w.write(
            ch,
            2,
            ENC.encode([float("inf"), [stored([8], 0, "full_attention")], 0]),
            log_time=8 * 10**9,
        )
    result = runner.invoke(app, ["report", str(path), "--format", "json", "--every", "1s"])
    assert result.exit_code == 0, result.stderr
    assert "NaN" not in result.stdout and "Infinity" not in result.stdout
    rep = json.loads(result.stdout)
    assert rep["totals"]["lifetime_p50_s"] == pytest.approx(2.0)
    assert rep["timeline"][-1]["live_blocks"] == 1
    assert min(r["live_blocks"] for r in rep["timeline"]) >= 0


def test_far_off_ts_does_not_blow_up_the_timeline(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.write(ch, 0, ENC.encode([1e9, [stored([1], 0, "full_attention")], 0]), log_time=1)
        w.write(ch, 1, ENC.encode([1e10, [removed([1], 0)], 0]), log_time=2)
        w.write(ch, 2, ENC.encode([1e300, [stored([3], 0, "full_attention")], 0]), log_time=3)
    rep = report_json(str(path), "--every", "1ms", "--clock", "publish")
    # 1e300 is no time: that batch is placed at its receive time (3 ns).
    assert [r["live_blocks"] for r in rep["timeline"]] == [1, 2, 1]


def test_out_of_range_ints_are_a_malformed_event(tmp_path: Path) -> None:
    """Issue 24: a group or window past int64 made a null group, merged with others; the
    event is now malformed (skipped, counted, exit 3) and its neighbours are kept."""
    bad = stored([2], 2**64 - 1, "full_attention")
    bad["kv_cache_spec_sliding_window"] = 2**64 - 1
    path = tmp_path / "r.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.write(
            ch, 0, ENC.encode([1.0, [stored([1], 0, "full_attention"), bad], 2**64 - 1]), log_time=1
        )
    result = runner.invoke(app, ["report", str(path), "--by", "group", "--format", "json"])
    assert result.exit_code == 3, result.stderr
    rep = json.loads(result.stdout)
    assert rep["totals"]["store_events"] == 1
    assert rep["source"]["skipped_events"] == 1
    assert {r["group_idx"] for r in rep["by_group"]} == {0}


def test_lost_batches_are_a_finding(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    w = RecordingWriter(path)
    ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
    w.write(ch, 0, ENC.encode([1.0, [stored([1], 0, "full_attention")], 0]), log_time=1)
    w.write(ch, 3, ENC.encode([4.0, [removed([1], 0), removed([2], 0)], 0]), log_time=4)
    w.close(
        ledger={"channels": [], "recovered": 0, "lost": 2, "lost_ranges": [[1, 2]], "restarts": 0}
    )
    rep = build_report([path])
    assert any("2 batches were lost while recording (seq 1-2)" in f for f in rep.findings)
    assert rep.totals["orphan_removes"][0] == 1


# -- issue 8 regressions ------------------------------------------------------------------------


def test_issue8_5_huge_group_indices_are_separate_state_keys(tmp_path: Path) -> None:
    # Group keys were packed as channel * 2**24 + group + 1, with every index past 2**24 - 3
    # folded into one bucket: a remove of group 2**24 + 1 took group 2**24's block.
    big = 2**24
    rec = record_batches(
        tmp_path / "r.mcap",
        [[stored([1], big)], [removed([1], big + 1)], [stored([2], big + 7), removed([2], 5)]],
    )
    rep = build_report([rec])
    tot = rep.totals.to_dicts()[0]
    assert tot["orphan_removes"] == 2
    assert tot["live_blocks_end"] == 2
    groups = {r["group_idx"]: r for r in rep.by_group.to_dicts()}
    assert groups[big]["live_blocks_end"] == 1
    assert groups[big + 1]["orphan_removes"] == 1


def test_issue8_9_clock_going_backwards_gives_no_negative_lifetime(tmp_path: Path) -> None:
    fa = "full_attention"
    rec = record_batches(
        tmp_path / "r.mcap",
        [[stored([1], 0, fa)], [stored([2], 0, fa)], [removed([1, 2], 0)]],
        step=-10.0,  # an NTP step: every batch is 10 s "earlier" than the one before
    )
    rep = build_report([rec])
    tot = rep.totals.to_dicts()[0]
    assert tot["lifetime_p50_s"] == 0.0
    assert all(tot[c] >= 0 for c in ("lifetime_p50_s", "lifetime_p90_s", "lifetime_p99_s"))
    assert any("2 block lifetimes were negative" in f for f in rep.findings)


@pytest.mark.parametrize("bad_ts", [-5.0, -1e9, 0.0, 5.0, 946_684_799.0])
def test_issue8_9_negative_or_pre_2000_ts_is_not_a_time(bad_ts: float, tmp_path: Path) -> None:
    t0 = 1_700_000_000.0
    path = tmp_path / "r.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.write(
            ch, 0, ENC.encode([t0, [stored([1], 0, "full_attention")], 0]), log_time=int(t0 * 1e9)
        )
        w.write(
            ch,
            1,
            ENC.encode([bad_ts, [stored([2], 0, "full_attention")], 0]),
            log_time=int((t0 + 1) * 1e9),
        )
        w.write(ch, 2, ENC.encode([t0 + 2, [removed([1, 2], 0)], 0]), log_time=int((t0 + 2) * 1e9))
    rep = report_json(str(path), "--every", "1s")
    # The bad batch sits at its receive time: the timeline spans 2 s, not decades.
    assert [r["time_s"] for r in rep["timeline"]] == [0.0, 1.0, 2.0]
    assert rep["source"]["duration_s"] == pytest.approx(2.0)
    assert rep["totals"]["lifetime_p50_s"] == pytest.approx(1.5)


def test_issue8_11_fine_every_over_a_long_span_stays_sparse(tmp_path: Path) -> None:
    # 999 s at 1 ms with two kinds: a dense grid of ~2 M cells; only 2 hold events.
    rec = record_batches(
        tmp_path / "r.mcap",
        [[stored([1], 0, "full_attention")], [stored([2], 1, "sliding_window", 8)]],
        step=999.0,
    )
    rep = build_report([rec], every_ns=1_000_000)
    assert rep.timeline is not None
    assert rep.timeline.height == 2
    assert rep.timeline["time_s"].to_list() == [0.0, 999.0]
    assert rep.timeline["live_blocks"].to_list() == [1, 1]
    assert any("only the buckets with events" in f for f in rep.findings)


def test_issue8_11_one_ms_buckets_with_many_kinds_do_not_abort(tmp_path: Path) -> None:
    kinds = [f"kind{i}" for i in range(40)]
    batches = [[stored([i], i, k)] for i, k in enumerate(kinds)]
    rec = record_batches(tmp_path / "r.mcap", batches, step=25.0)  # 1000 s in all
    rep = report_json(str(rec), "--every", "1ms")
    assert len(rep["timeline"]) == len(kinds)
    assert rep["totals"]["blocks_stored"] == len(kinds)


def test_issue24_report_keeps_a_wire_kind_spelled_like_its_labels_apart(tmp_path: Path) -> None:
    """A kind sent as 'unannotated' is 'kind:unannotated' in the report, never merged with
    the stores that carry no kind; its removes without group_idx are attributed to it."""
    rec = record_batches(
        tmp_path / "k.mcap",
        [
            [stored([1, 2], 0, "unannotated"), stored([3], 1, None)],
            [removed([1], with_group=False), removed([3], 1)],
        ],
    )
    rep = report_json(str(rec))
    rows = {r["kind"]: r for r in rep["by_kind"]}
    assert set(rows) == {"kind:unannotated", "unannotated"}
    assert rows["kind:unannotated"]["blocks_stored"] == 2
    assert rows["kind:unannotated"]["blocks_removed"] == 1  # attributed by its hash
    assert rows["kind:unannotated"]["live_blocks_end"] == 1
    assert rows["unannotated"]["blocks_stored"] == 1
    assert rows["unannotated"]["blocks_removed"] == 1
