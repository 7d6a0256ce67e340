"""Issue 21 in the engine: ``kvtool report`` itself reports what vLLM physically did.

The truth is tests/data/semantics/*/truth.json (vLLM 0.33's real KVCacheManager with its
block pool instrumented, the stream recorded live by ``kvtool record``); the rules are
docs/SEMANTICS.md's, as tests/semantics_model.py states them. Each figure is the report
kernel's own (kvtool/report/kernel.py), per group and per kind, for any chunking and
``--jobs 2``.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.render.report import render_json
from kvtool.report import build_report, kernel
from tests import semtruth

SEMANTICS = Path(__file__).parent / "data" / "semantics"
runner = CliRunner()

# Partial tail entries (b), partial primary keys, promotions, Mamba re-keys and discards (c1).
PHYSICAL = ("b_gemma3_b64_h16", "c1_mamba_b576_h64_fi")


def _report(name: str, *extra: str) -> dict[str, Any]:
    d = SEMANTICS / name
    args = ["report", str(d / f"{name}.mcap"), "--groups", str(d / "groups.json")]
    result = runner.invoke(app, [*args, *extra, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@functools.cache
def report(name: str, *extra: str) -> dict[str, Any]:
    return _report(name, *extra)


@functools.cache
def truth(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((SEMANTICS / name / "truth.json").read_text())
    return out


TRUTH_COLUMNS = (
    *semtruth.BLOCKS,
    "partial_extra_keys",
    "rekeys",
    "partial_promotions",
    "tokens_stored",
)
"""The truth figures this file checks (tests/semtruth.py reads them)."""


def physical(t: dict[str, Any]) -> dict[str, int]:
    """The truth's figures :data:`TRUTH_COLUMNS` for one group or kind row of truth.json."""
    return semtruth.physical(t, TRUTH_COLUMNS)


def figures(row: dict[str, Any]) -> dict[str, int]:
    return semtruth.columns(row, TRUTH_COLUMNS)


@pytest.mark.parametrize("name", PHYSICAL)
def test_issue21_report_equals_the_physical_truth_per_group(name: str) -> None:
    rep, t = report(name), truth(name)
    by_group = {r["group_idx"]: r for r in rep["by_group"]}
    assert sorted(by_group) == [g["group_idx"] for g in t["by_group"]]
    for g in t["by_group"]:
        row = by_group[g["group_idx"]]
        assert row["kind"] == g["kind"]
        assert figures(row) == physical(g), (name, g["group_idx"])
        assert row["peak_live_blocks"] == g["peak"]["peak_physical_cached_blocks"]
        # every remove that is an eviction: the block's first key plus its further keys
        evicted = row["blocks_removed"] + row["evicted_extra_keys"]
        assert evicted == g["removes"]["physical_evictions"]
        assert row["orphan_removes"] == 0


@pytest.mark.parametrize("name", PHYSICAL)
def test_issue21_report_equals_the_physical_truth_per_kind(name: str) -> None:
    rep, t = report(name), truth(name)
    by_kind = {r["kind"]: r for r in rep["by_kind"]}
    for k in t["by_kind"]:
        assert figures(by_kind[k["kind"]]) == physical(k), (name, k["kind"])


def test_issue21_partial_tail_entries_are_keys_on_one_block() -> None:
    # The issue's table, Gemma-3-like at block 64 / hash 16, full attention: 1,659 stored
    # (not 1,740), 1,591 evicted (not 1,669), 31 live at the end (not 32); the 81 partial
    # keys and the 78 removes of them with their block are their own columns.
    fa = {r["kind"]: r for r in report("b_gemma3_b64_h16")["by_kind"]}["full_attention"]
    assert (fa["blocks_stored"], fa["blocks_removed"], fa["live_blocks_end"]) == (1659, 1591, 31)
    assert (fa["partial_extra_keys"], fa["evicted_extra_keys"], fa["live_keys"]) == (81, 78, 32)
    assert (fa["blocks_cleared"], fa["entries_cleared"]) == (37, 39)
    # what the wire carried: every key is one class or another
    assert fa["blocks_stored"] + fa["partial_extra_keys"] == 1740
    assert fa["blocks_removed"] + fa["evicted_extra_keys"] == 1669


def test_issue21_mamba_rekeys_and_discards_are_not_evictions() -> None:
    # The issue's table, Mamba hybrid at 576 / 64 with prefill checkpoints: Mamba 687
    # stored (not 1,059), 639 evicted (not 1,011); per Mamba group 74 re-keys, 50 discards.
    rep = report("c1_mamba_b576_h64_fi")
    mamba = {r["kind"]: r for r in rep["by_kind"]}["mamba"]
    assert (mamba["blocks_stored"], mamba["blocks_removed"]) == (687, 639)
    assert (mamba["rekeys"], mamba["rekey_removes"], mamba["checkpoints_discarded"]) == (
        222,
        222,
        150,
    )
    assert mamba["blocks_stored"] + mamba["rekeys"] + mamba["checkpoints_discarded"] == 1059
    assert mamba["blocks_removed"] + mamba["rekey_removes"] + mamba["checkpoints_discarded"] == 1011
    for row in rep["by_group"]:
        if row["kind"] == "mamba":
            assert (row["rekey_removes"], row["checkpoints_discarded"]) == (74, 50)
    fa = {r["kind"]: r for r in rep["by_kind"]}["full_attention"]
    # a partial block promoted when it fills: its partial key's remove is no eviction
    assert (fa["partial_promotions"], fa["rekeys"], fa["partial_extra_keys"]) == (3, 3, 3)


@pytest.mark.parametrize("name", PHYSICAL)
@pytest.mark.parametrize(("chunk_bytes", "jobs"), [(4096, 1), (1 << 24, 2)])
def test_issue21_classification_is_the_same_for_any_chunking_and_jobs(
    name: str, chunk_bytes: int, jobs: int
) -> None:
    d = SEMANTICS / name
    rep = build_report(
        [d / f"{name}.mcap"],
        groups_file=d / "groups.json",
        chunk_bytes=chunk_bytes,
        jobs=jobs,
    )
    buf = io.StringIO()
    render_json(rep, buf)
    got = json.loads(buf.getvalue())
    base = report(name)
    for table in ("totals", "by_kind", "by_group"):
        assert got[table] == base[table], (name, chunk_bytes, jobs, table)


@pytest.mark.parametrize("name", PHYSICAL)
def test_issue21_without_metadata_the_block_size_is_learned(name: str) -> None:
    # No groups file: the group's block size is learned from its multi-hash stores, the
    # Mamba group from its stores' kind; the physical counts stay the truth's.
    d = SEMANTICS / name
    result = runner.invoke(app, ["report", str(d / f"{name}.mcap"), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    rep = json.loads(result.stdout)
    by_group = {r["group_idx"]: r for r in rep["by_group"]}
    for g in truth(name)["by_group"]:
        row = by_group[g["group_idx"]]
        assert (row["blocks_stored"], row["blocks_removed"], row["live_blocks_end"]) == (
            physical(g)["blocks_stored"],
            physical(g)["blocks_removed"],
            physical(g)["live_blocks_end"],
        ), (name, g["group_idx"])


@pytest.mark.parametrize("seed", range(40))
def test_issue21_kernel_rules_equal_the_plain_loop_where_every_hash_is_a_block(
    seed: int,
) -> None:
    # Without partial entries and Mamba groups, advance's rules keep every hash one block:
    # the same rows, pairs, drops and survivors as the loop before issue 21
    # (_advance_plain, which step takes there), over several calls.
    rng = np.random.default_rng(seed)
    states = {True: kernel.State(), False: kernel.State()}
    for _call in range(4):
        n = int(rng.integers(1, 300))
        op = rng.choice([kernel.STORE, kernel.REMOVE, kernel.CLEAR], n, p=[0.55, 0.42, 0.03])
        chan = rng.integers(0, 3, n)
        group = rng.integers(0, 3, n)
        no_group = rng.random(n) < 0.1
        group[no_group] = 0
        h = rng.integers(0, 40, n)
        ts = np.sort(rng.random(n)) + _call
        gkey = group + 3 * no_group
        shape = kernel.Shape(
            np.cumsum(rng.random(n) < 0.2) + 1000 * _call,
            np.cumsum(rng.random(n) < 0.5),
            rng.integers(16, 64, n),
            np.ones(n, np.int64),
            np.ones(n, bool),
            np.zeros(n, np.int64),
            np.zeros(n, np.int8),
        )
        outs = {
            plain: kernel.step(
                st, op.astype(np.int8), chan, group, no_group, h, ts, gkey, 4, shape, plain
            )
            for plain, st in states.items()
        }
        for field in kernel.Out._fields:
            assert np.array_equal(getattr(outs[True], field), getattr(outs[False], field)), field
        live = {p: st.live_entries() for p, st in states.items()}
        for a, b in zip(live[True], live[False], strict=True):
            assert np.array_equal(np.sort(a), np.sort(b))
        assert np.array_equal(states[True].live_gkey, states[False].live_gkey)


@pytest.mark.parametrize("name", PHYSICAL)
def test_issue21_timeline_counts_physical_blocks(name: str) -> None:
    # The timeline's stores, removes and cleared are the tables' blocks, and add up to its
    # live blocks: stored - removed - cleared = live at the end, per kind.
    rep = report(name, "--every", "100ms")
    by_kind = {r["kind"]: r for r in rep["by_kind"]}
    for kind, row in by_kind.items():
        points = [p for p in rep["timeline"] if p["kind"] == kind]
        sums = {c: sum(p[c] for p in points) for c in ("stores", "removes", "cleared")}
        assert sums == {
            "stores": row["blocks_stored"],
            "removes": row["blocks_removed"],
            "cleared": row["blocks_cleared"],
        }
        assert points[-1]["live_blocks"] == row["live_blocks_end"]
        assert sums["stores"] - sums["removes"] - sums["cleared"] == row["live_blocks_end"]
