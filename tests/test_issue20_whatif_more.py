"""Issues 20/21: the what-if on workloads it was never tuned on (new seeds, two arrival modes).

Material in tests/data/whatif_more/<shape>_seed<N>[_open]/, made by bench/vllm_driver.py on
vLLM 0.33.0's real KVCacheManager (CPU): the N0 recording (``kvtool record`` of a live replay
of vLLM's own wire bytes), groups.json, params.json and truth.json (reruns of the same
workload at N0 + K, counted from the instrumented BlockPool). ``_open`` folders give every
conversation turn a fixed arrival step; the others let a turn arrive a gap after the previous
one finished (so a larger pool, finishing sooner, also changes the order of arrivals).

Each (folder, kind, K) is one case against the issue's bounds (full attention and sliding
window ±5 %, Mamba hybrids ±15 %). The cases that miss are marked xfail(strict) with the
numbers: they are reported to the lead, not loosened. At N0, ``kvtool report`` equals the
pool's own counts exactly (block 16, hash 16).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.report.whatif import parse_what_if, what_if

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "whatif_more"
BOUND = {"full": 5.0, "gemma3": 5.0, "mamba": 15.0}
FOLDERS = [
    "full_seed11",
    "full_seed23",
    "full_seed23_open",
    "gemma3_seed11",
    "gemma3_seed23",
    "gemma3_seed11_open",
    "gemma3_seed23_open",
    "mamba_seed11",
    "mamba_seed23",
    "mamba_seed11_open",
    "mamba_seed23_open",
]
KINDS = {"full": ["full_attention"], "gemma3": ["full_attention", "sliding_window"]}
KINDS["mamba"] = ["mamba", "full_attention"]
K_BLOCKS = {"full": [20, 50, 100, 200, 600], "gemma3": [60, 150, 300, 600, 1800]}
K_BLOCKS["mamba"] = [30, 75, 150, 300, 900]

_CLOSED = "closed-loop turns: a larger pool finishes turns sooner, so later turns arrive in "
_CLOSED += "another order than the recording's (the prediction assumes the same order)"
# Mamba: bench/whatif_forced_rerun.py mamba SEED Ks [--closed-loop] --by-order (N0's
# admissions, preemptions, finishes and per-step order forced, chunks cut by vLLM's own Mamba
# split) against the free rerun (bench/RESULTS.md, h20m).


def _mamba(forced: int, free: int) -> str:
    """Why a Mamba case misses, from the forced-order rerun's count (``forced``)."""
    if forced == free:
        return f"the forced-order rerun gives {forced} as the free one: the kernel's (not found)"
    return (
        f"closed loop, 27 preemptions at N0: the rerun with N0's order forced gives {forced}, "
        f"the free one {free}: a larger pool's own schedule"
    )


# gemma3: the real manager rerun with the N0 schedule forced gives the same counts as the free
# rerun (bench/whatif_forced_rerun.py), so these are modelling errors (bench/RESULTS.md).
_CAP = "a prompt that fills its last block exactly: vLLM's prompt - 1 cap hits one block less "
_CAP += "(the recording does not say where a prompt ends)"
# (folder, kind, K): predicted vs real, error %, as measured; reported to the lead.
MISSES = {
    ("full_seed23", "full_attention", 600): f"1,494 vs 1,147 (+30.3 %); {_CLOSED}",
    ("gemma3_seed11", "full_attention", 300): f"540 vs 679 (-20.5 %); {_CAP}",
    ("gemma3_seed11", "sliding_window", 300): f"4,010 vs 5,315 (-24.6 %); {_CAP}",
    ("gemma3_seed11_open", "sliding_window", 300): f"4,845 vs 5,392 (-10.1 %); {_CAP}",
    ("mamba_seed11", "mamba", 300): f"139 vs 119 (+16.8 %); {_mamba(130, 119)} (+6.9 % off)",
    ("mamba_seed11", "mamba", 900): f"16 vs 5 (+220.0 %); {_mamba(8, 5)}; 16 vs 8 is the kernel's",
    ("mamba_seed23", "mamba", 300): f"61 vs 45 (+35.6 %); {_mamba(66, 45)} (-7.6 % off)",
    ("mamba_seed23", "mamba", 900): f"14 vs 8 (+75.0 %); {_mamba(16, 8)} (-12.5 % off)",
    ("mamba_seed23", "full_attention", 900): f"575 vs 385 (+49.4 %); {_CLOSED} (forced: 568)",
    ("mamba_seed23_open", "mamba", 900): f"2 vs 4 (-50.0 %): {_mamba(4, 4)}",
}


def _shape(folder: str) -> str:
    return folder.split("_")[0]


@functools.cache
def _predicted(folder: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(kind, K) -> (predicted, real) recomputed blocks for one folder."""
    d = DATA / folder
    truth = json.loads((d / "truth.json").read_text())
    runs = [r for r in truth["runs"] if r["K_blocks"] > 0]
    extras = parse_what_if(",".join(f"+{r['K_blocks']}" for r in runs))
    (mcap,) = d.glob("*.mcap")
    res = what_if([mcap], extras, groups_file=d / "groups.json")
    out = {}
    for entry, run in zip(res.entries, runs, strict=True):
        assert entry["extra_blocks"] == run["K_blocks"]
        real = {r["kind"]: r["restores_after_eviction"] for r in run["by_kind"]}
        for row in entry["by_kind"]:  # type: ignore[attr-defined]
            out[(row["kind"], run["K_blocks"])] = (row["blocks_recomputed"], real[row["kind"]])
    return out


def _cases() -> list[Any]:
    cases = []
    for folder in FOLDERS:
        shape = _shape(folder)
        for kind in KINDS[shape]:
            for k in K_BLOCKS[shape]:
                why = MISSES.get((folder, kind, k))
                marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
                cases.append(pytest.param(folder, kind, k, marks=marks, id=f"{folder}-{kind}-{k}"))
    return cases


@pytest.mark.parametrize(("folder", "kind", "k"), _cases())
def test_issue20_what_if_on_new_workloads(folder: str, kind: str, k: int) -> None:
    predicted, real = _predicted(folder)[(kind, k)]
    err = (predicted - real) / real * 100 if real else float(predicted != 0) * 100
    assert abs(err) <= BOUND[_shape(folder)], (predicted, real, round(err, 1))


@pytest.mark.parametrize("folder", FOLDERS)
def test_issue21_report_at_n0_equals_the_pool(folder: str) -> None:
    """blocks_stored / removed / recomputed and live_blocks_end per kind, exactly."""
    d = DATA / folder
    (mcap,) = d.glob("*.mcap")
    r = runner.invoke(app, ["report", str(mcap), "--format", "json"])
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    truth = {r["kind"]: r for r in json.loads((d / "truth.json").read_text())["runs"][0]["by_kind"]}
    got = {row["kind"]: row for row in rep["by_kind"]}
    assert set(got) == set(truth)
    for kind, t in truth.items():
        g = got[kind]
        assert (
            g["blocks_stored"],
            g["blocks_removed"],
            g["blocks_recomputed"],
            g["live_blocks_end"],
        ) == (
            t["blocks_stored"],
            t["blocks_removed"],
            t["restores_after_eviction"],
            t["live_blocks_end"],
        )


# N0 preemptions (truth.json runs[0].preemptions): full 44/41/37, Mamba 27/27/16 heavy;
# mamba_seed11_open has 2, the gemma3 folders none. About a third of them show on the wire
# (the others found their freed blocks still cached when they resumed).
HEAVY = {"full_seed11", "full_seed23", "full_seed23_open"}
HEAVY |= {"mamba_seed11", "mamba_seed23", "mamba_seed23_open"}


@pytest.mark.parametrize("folder", FOLDERS)
def test_issue20_heavy_preemption_where_the_engine_preempted(folder: str) -> None:
    d = DATA / folder
    (mcap,) = d.glob("*.mcap")
    entry = what_if([mcap], parse_what_if("+10"), groups_file=d / "groups.json").entries[0]
    names = [c["condition"] for c in entry["conditions"]]  # type: ignore[attr-defined]
    preemptions = json.loads((d / "truth.json").read_text())["runs"][0]["preemptions"]
    assert ("heavy_preemption" in names) == (folder in HEAVY), (
        preemptions,
        entry["resumed_requests"],
    )
    assert entry["resumed_requests"] <= preemptions  # type: ignore[operator]
