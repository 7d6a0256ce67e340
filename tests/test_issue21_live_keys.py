"""Issue 21: ``live_keys`` counts distinct hash keys, ``live_entries`` (key, block) entries.

A key (channel, rank, group, hash) can sit in two physical blocks (a second copy): vLLM's
truth counts it once in ``cached_hash_keys_end``, twice in ``cached_entries_end``. The
report reads the distinct keys from the state kernel's final state
(kvtool/report/klive.py), so they are the same for any chunking, ``--jobs``, decoder and
units of work. Real MCAP files, written with kvtool's RecordingWriter.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingWriter
from kvtool.render.report import render_json
from kvtool.report import build_report
from tests.test_issue21_ann import BlockRemoved, BlockStored, KVEventBatch

SEMANTICS = Path(__file__).parent / "data" / "semantics"
SCENARIOS = sorted(p.name for p in SEMANTICS.iterdir() if p.is_dir())
GROUPS = [{"group_idx": 0, "kind": "full_attention", "block_size": 16, "sliding_window": None}]
runner = CliRunner()


@functools.cache
def _truth(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((SEMANTICS / name / "truth.json").read_text())
    return out


def _build(name: str, *, jobs: int = 1, chunk_bytes: int = 1 << 24) -> dict[str, Any]:
    d = SEMANTICS / name
    rep = build_report(
        [d / f"{name}.mcap"], groups_file=d / "groups.json", chunk_bytes=chunk_bytes, jobs=jobs
    )
    buf = io.StringIO()
    render_json(rep, buf)
    out: dict[str, Any] = json.loads(buf.getvalue())
    return out


def _ends(rep: dict[str, Any], table: str, key: str) -> dict[Any, tuple[int, int]]:
    return {r[key]: (r["live_keys"], r["live_entries"]) for r in rep[table]}


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize(
    ("jobs", "chunk_bytes", "decoder"),
    [(1, 1 << 24, "numba"), (1, 4096, "numba"), (2, 1 << 24, "numba"), (1, 4096, "msgspec")],
)
def test_issue21_live_keys_equal_the_truth_per_group_and_kind(
    name: str, jobs: int, chunk_bytes: int, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVTOOL_DECODER", decoder)
    rep, t = _build(name, jobs=jobs, chunk_bytes=chunk_bytes), _truth(name)
    by_group, by_kind = _ends(rep, "by_group", "group_idx"), _ends(rep, "by_kind", "kind")
    for g in t["by_group"]:
        e = g["end"]
        want = (e["cached_hash_keys_end"], e["cached_entries_end"])
        assert by_group[g["group_idx"]] == want, (name, g["group_idx"])
    for k in t["by_kind"]:
        e = k["end"]
        want = (e["cached_hash_keys_end"], e["cached_entries_end"])
        assert by_kind[k["kind"]] == want, (name, k["kind"])
    (tot,) = rep["totals"] if isinstance(rep["totals"], list) else [rep["totals"]]
    assert tot["live_keys"] == sum(k for k, _e in by_kind.values())
    assert tot["live_entries"] == sum(e for _k, e in by_kind.values())


def test_issue21_live_keys_the_issue_figures() -> None:
    # c1: 31 entries of 26 keys on 30 blocks; d: 196 / 188 and 291 / 281; b: 32 / 32.
    c1 = _ends(_build("c1_mamba_b576_h64_fi"), "by_kind", "kind")
    assert c1["full_attention"] == (26, 31)
    d = _ends(_build("d_gemma3_report_full"), "by_kind", "kind")
    assert (d["full_attention"], d["sliding_window"]) == ((188, 196), (281, 291))
    b = _ends(_build("b_gemma3_b64_h16"), "by_kind", "kind")
    assert b["full_attention"] == (32, 32)


def _stored(hashes: list[int]) -> BlockStored:
    tokens = list(range(16 * len(hashes)))
    return BlockStored(hashes, None, tokens, 16, None, "GPU", None, group_idx=0, origin="NEW")


def _payloads(batches: list[list[BlockStored | BlockRemoved]], t0: int = 0) -> list[bytes]:
    enc = msgspec.msgpack.Encoder()
    return [enc.encode(KVEventBatch(1.0 + t0 + i, evs, 0)) for i, evs in enumerate(batches)]


def _record(path: Path, payloads: list[bytes], seq0: int = 0) -> Path:
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        w.add_groups(GROUPS, "groups.json")
        for i, payload in enumerate(payloads):
            seq = seq0 + i
            w.write(ch, seq, payload, 1_764_000_000_000_000_000 + seq * 10_000_000)
        w.close()
    return path


def _fa(*paths: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    args = ["report", *map(str, paths), *extra, "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    rep: dict[str, Any] = json.loads(result.stdout)
    (row,) = [r for r in rep["by_group"] if r["group_idx"] == 0]
    return row


@pytest.mark.parametrize("mode", ["auto", "incremental", "full"])
def test_issue21_a_second_copy_is_two_entries_of_one_key(tmp_path: Path, mode: str) -> None:
    path = _record(tmp_path / "copy.mcap", _payloads([[_stored([7])], [_stored([7])]]))
    fa = _fa(path, extra=("--report-mode", mode))
    assert (fa["blocks_stored"], fa["stored_while_live"]) == (2, 1)
    assert (fa["live_blocks_end"], fa["live_entries"], fa["live_keys"]) == (2, 2, 1)


def test_issue21_one_copy_removed_leaves_the_key(tmp_path: Path) -> None:
    batches: list[list[BlockStored | BlockRemoved]] = [
        [_stored([7, 8])],
        [_stored([7])],
        [BlockRemoved([7], "GPU", group_idx=0)],
    ]
    path = _record(tmp_path / "rm.mcap", _payloads(batches))
    fa = _fa(path)
    assert (fa["live_blocks_end"], fa["live_entries"], fa["live_keys"]) == (2, 2, 2)
    batches.append([BlockRemoved([7], "GPU", group_idx=0)])
    fa = _fa(_record(tmp_path / "rm2.mcap", _payloads(batches)))
    assert (fa["live_blocks_end"], fa["live_entries"], fa["live_keys"]) == (1, 1, 1)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_issue21_live_keys_across_files_of_one_rank(tmp_path: Path, jobs: str) -> None:
    # The stream split in two recordings of the same channel: one unit, one key.
    a = _record(tmp_path / "a.mcap", _payloads([[_stored([7])]]))
    b = _record(tmp_path / "b.mcap", _payloads([[_stored([7])]], t0=1), seq0=1)
    fa = _fa(a, b, extra=("--jobs", jobs))
    assert (fa["live_entries"], fa["live_keys"]) == (2, 1)
