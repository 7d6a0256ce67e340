"""Issue 21 on scenarios kvtool was not tuned on: ``kvtool report`` against vLLM's physical truth.

tests/data/semantics_more/*: vLLM 0.33's real ``KVCacheManager`` driven by
bench/vllm_semantics.py (the truth from its live ``BlockPool``, wrapped), each stream
recorded live by ``kvtool record`` from a loopback replay (bench/record_semantics.sh):

- ``e_gemma3_b32_h16``: 1 full + 3 sliding-window (w 128) groups, block 32, hash 16;
- ``f_full2_b48_h16``: two full-attention groups, block 48, hash 16;
- ``g_mamba2_b544_h16``: 2 Mamba + 1 full-attention group, block 544, hash 16 (partial hash
  hits: partial primary keys, promotions, copy-on-write);
- ``h_mamba_b544_h32_ckpt``: 1 Mamba (prefill checkpoint blocks, alignment 32) + 2 full
  groups, block 544, hash 32;
- ``k_mamba2_b544_h32_ckpt``: 2 Mamba (prefill checkpoints, alignment 32) + 1 full group,
  block 544, hash 32, token budget 2048 (re-keys and discarded checkpoints);
- ``i_gemma3_b32_h16_half_full``: block 32 / hash 16, 1/2 of the requests in report mode full;
- ``j_gemma3_b16_all_full``: block 16, every request in report mode full.

Per group and per kind, stores, evictions, clears, live and peak physical blocks, live keys
and entries equal the truth; hits equal it within 2 % where every request announces; the
announcement bounds contain the truth.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from tests import semtruth

MORE = Path(__file__).parent / "data" / "semantics_more"
NAMES = (
    "e_gemma3_b32_h16",
    "f_full2_b48_h16",
    "g_mamba2_b544_h16",
    "h_mamba_b544_h32_ckpt",
    "k_mamba2_b544_h32_ckpt",
    "i_gemma3_b32_h16_half_full",
    "j_gemma3_b16_all_full",
)
ANNOUNCING = ("i_gemma3_b32_h16_half_full", "j_gemma3_b16_all_full")
runner = CliRunner()


@functools.cache
def report(name: str) -> dict[str, Any]:
    d = MORE / name
    args = ["report", str(d / f"{name}.mcap"), "--groups", str(d / "groups.json")]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@functools.cache
def truth(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((MORE / name / "truth.json").read_text())
    return out


TRUTH_COLUMNS = (
    *semtruth.BLOCKS,
    "peak_live_blocks",
    "stored_while_live",
    "blocks_recomputed",
    "partial_extra_keys",
    "rekeys",
    "hit_announced_blocks",
    "tokens_stored",
    "tokens_announced",
)
"""The truth figures this file checks (tests/semtruth.py reads them)."""


def physical(t: dict[str, Any]) -> dict[str, int]:
    """The truth's figures :data:`TRUTH_COLUMNS` for one group or kind row of truth.json."""
    return semtruth.physical(t, TRUTH_COLUMNS)


def hits(t: dict[str, Any]) -> tuple[int, int]:
    """Announced hit blocks and tokens of requests then admitted (a repeated lookup once)."""
    h = t["hits"]
    return h["hit_blocks_admitted_report_mode_full"], h["hit_tokens_admitted_report_mode_full"]


def _rows(name: str, table: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    key = "group_idx" if table == "by_group" else "kind"
    rows = {r[key]: r for r in report(name)[table]}
    assert sorted(rows, key=str) == sorted((t[key] for t in truth(name)[table]), key=str)
    return [(rows[t[key]], t) for t in truth(name)[table]]


@pytest.mark.parametrize("table", ["by_group", "by_kind"])
@pytest.mark.parametrize("name", NAMES)
def test_issue21_more_physical_counts_equal_the_truth(name: str, table: str) -> None:
    for row, t in _rows(name, table):
        want = physical(t)
        discarded = t["removes"]["physical_blocks_discarded"]
        if discarded:
            # The truth classes every newly cached block by its key's history, a Mamba
            # checkpoint discarded in its step too; kvtool's blocks_stored leaves those
            # out (R5), so its recomputes lie within the discarded blocks below the truth's
            # (k: 31 per Mamba group, truth 35, 5 discarded).
            recomputed = want.pop("blocks_recomputed")
            assert recomputed - discarded <= row["blocks_recomputed"] <= recomputed
        assert {k: row[k] for k in want} == want, (name, table, t.get("group_idx", t["kind"]))
        assert row["orphan_removes"] == 0
        if table == "by_group":
            # every eviction's keys: the block's first plus its partial extra keys
            evicted = row["blocks_removed"] + row["evicted_extra_keys"]
            assert evicted == t["removes"]["physical_evictions"]


@pytest.mark.parametrize("table", ["by_group", "by_kind"])
def test_issue21_more_hits_where_every_request_announces(table: str) -> None:
    # j: every request in report mode full, 112 failed lookups (254 blocks announced
    # again per group): hits per group and kind equal the truth (the target: within 2 %).
    for row, t in _rows("j_gemma3_b16_all_full", table):
        blocks, tokens = hits(t)
        assert abs(row["hit_blocks"] - blocks) <= 0.02 * blocks
        assert abs(row["hit_tokens"] - tokens) <= 0.02 * tokens
        assert (row["hit_blocks"], row["hit_tokens"]) == (blocks, tokens)


@pytest.mark.xfail(
    strict=True,
    reason="i (half the requests announce, block 32): the truth has 953 hit blocks per group "
    "(30,496 tokens) and no failed lookup; kvtool takes back 3 lookups (39 blocks) as failed: "
    "6 batches end with an admitted request's announcement (its remaining tokens filled no "
    "block, so nothing followed it, as after a failed allocation) and the next batch "
    "announces the same first hash (another request of the same prefix, a longer or "
    "shorter hit). The wire has no step "
    "number or request id to tell them apart; where only some requests announce, hits are "
    "not the 2 % target's case anyway",
)
def test_issue21_more_hits_where_half_the_requests_announce() -> None:
    for row, t in _rows("i_gemma3_b32_h16_half_full", "by_group"):
        assert (row["hit_blocks"], row["hit_tokens"]) == hits(t)


@pytest.mark.parametrize("name", ANNOUNCING)
def test_issue21_more_announcement_bounds_contain_the_truth(name: str) -> None:
    for row, t in _rows(name, "by_group"):
        ann, stored = row["hit_announced_blocks"], row["blocks_stored"]
        taken, left = row["blocks_stored_bound"], row["hit_announced_blocks_bound"]
        want = physical(t)
        assert ann - taken <= want["hit_announced_blocks"] <= ann + left
        assert stored - left <= want["blocks_stored"] <= stored + taken


@pytest.mark.parametrize("name", NAMES)
def test_issue21_more_the_wire_adds_up(name: str) -> None:
    # Every stored and removed key on the wire is one class or another.
    for row, t in _rows(name, "by_group"):
        wire = t["stores"]["blocks_stored_total_on_wire"]
        classes = (
            row["blocks_stored"]
            + row["partial_extra_keys"]
            + row["rekeys"]
            + row["checkpoints_discarded"]
            + row["hit_announced_blocks"]
        )
        assert classes == wire
        removed = (
            row["blocks_removed"]
            + row["evicted_extra_keys"]
            + row["partial_promotions"]
            + row["rekey_removes"]
            + row["checkpoints_discarded"]
        )
        assert removed == t["removes"]["blocks_removed_total_on_wire"]
