"""Issue 24: the same number from every command, on recordings built here (never seen before)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec
import polars as pl
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from tests.conftest import capture_messages
from tests.replayutil import write_recording

runner = CliRunner()
_DEC = msgspec.msgpack.Decoder()
_ENC = msgspec.msgpack.Encoder()

ORPHAN = 0x5EED_0000_0000_0001  # never stored


def _legacy_removes(name: str, *, orphan_at: int = 3) -> list[tuple[bytes, int, bytes]]:
    """A capture whose removes lost ``group_idx`` (an older sender's), plus one orphan remove."""
    out = []
    for topic, seq, payload in capture_messages(name):
        batch = _DEC.decode(payload)
        events = batch[1] if isinstance(batch, list) else batch["events"]
        array = False
        for ev in events:
            if isinstance(ev, dict) and ev.get("type") == "BlockRemoved":
                ev.pop("group_idx", None)
            array = array or isinstance(ev, list)
        if seq == orphan_at:
            events.append(
                ["BlockRemoved", [ORPHAN]]
                if array
                else {"type": "BlockRemoved", "block_hashes": [ORPHAN], "medium": "GPU"}
            )
        out.append((topic, seq, _ENC.encode(batch)))
    return out


def _report(*args: str) -> dict:
    result = runner.invoke(app, ["report", *args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _export(rec: Path, out: Path) -> pl.DataFrame:
    result = runner.invoke(app, ["export", str(rec), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    if out.suffix == ".csv":
        return pl.read_csv(out, schema_overrides={"group_idx": pl.Int64})
    return pl.read_parquet(out)


def _removed(df: pl.DataFrame, *key: str) -> Counter[object]:
    removes = df.filter((pl.col("type") == "BlockRemoved") & pl.col("hash").is_not_null())
    return Counter({k[:-1]: k[-1] for k in removes.group_by(key).agg(pl.len()).iter_rows()})


def _report_removed(rep: dict, table: str, *key: str) -> Counter[object]:
    return Counter(
        {tuple(r[k] for k in key): r["blocks_removed"] for r in rep[table] if r["blocks_removed"]}
    )


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        # One group: every remove without group_idx is live in exactly one group.
        ("full_only", {"full_attention", "unattributed"}),
        # Six groups store each hash: live in several, so unattributed, never guessed.
        ("gemma3", {"unattributed"}),
        # The first layout: no group_idx anywhere; the orphan is unattributed.
        ("full_only.legacy-array-initial.signed", {"unannotated", "unattributed"}),
    ],
)
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_issue24_legacy_removes_are_attributed_alike_in_report_and_export(
    tmp_path: Path, name: str, kinds: set[str], suffix: str
) -> None:
    rec = write_recording(tmp_path / "legacy.mcap", _legacy_removes(name))
    rep = _report(str(rec), "--by", "kind,group")
    df = _export(rec, tmp_path / f"t{suffix}")
    by_kind = _removed(df, "kind")
    assert by_kind == _report_removed(rep, "by_kind", "kind")
    assert {k for (k,) in by_kind} == kinds
    # A remove attributed through the hash state is filed under that group, as in report.
    by_group = _removed(df, "group_idx", "kind")
    assert by_group == _report_removed(rep, "by_group", "group_idx", "kind")
