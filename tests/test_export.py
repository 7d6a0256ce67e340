"""kvtool export: the flat table as Parquet (file or hive directory) and CSV, read back."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.columns import TABLE_SCHEMA
from kvtool.export import DERIVED_COLUMNS, TIME_AND_HASH_COLUMNS
from kvtool.recording import RecordedMessage
from tests.conftest import capture_truth
from tests.test_report import record_capture

runner = CliRunner()


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    return record_capture("gemma3", tmp_path / "g.mcap")


def test_parquet_roundtrip(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    result = runner.invoke(app, ["export", str(rec), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "exported 3,419 rows" in result.stderr
    df = pl.read_parquet(out)
    truth = capture_truth("gemma3")
    assert list(df.columns) == [*TABLE_SCHEMA, *TIME_AND_HASH_COLUMNS, *DERIVED_COLUMNS]
    assert (
        df.height
        == truth["block_stored"]["total"]["blocks"]
        + truth["block_removed"]["total"]["blocks"]
        + truth["all_blocks_cleared"]
    )
    stores = df.filter(pl.col("type") == "BlockStored")
    assert stores["tokens"].sum() == truth["block_stored"]["total"]["tokens"]
    by_kind = dict(stores.group_by("kind").agg(pl.len()).iter_rows())
    assert by_kind == {"full_attention": 315, "sliding_window": 1575}
    # Removes carry the kind of their group (learned from the annotated stores).
    removes = df.filter(pl.col("type") == "BlockRemoved")
    assert dict(removes.group_by("kind").agg(pl.len()).iter_rows()) == {
        "full_attention": 214,
        "sliding_window": 1314,
    }


def test_export_with_groups_annotates_old_layout(tmp_path: Path) -> None:
    name = "gemma3.legacy-array-group-idx"
    r = record_capture(name, tmp_path / "r.mcap")
    groups = tmp_path / "g.json"
    groups.write_text(json.dumps(capture_truth(name)["group_metadata"]))
    out = tmp_path / "t.parquet"
    result = runner.invoke(app, ["export", str(r), "-o", str(out), "--groups", str(groups)])
    assert result.exit_code == 0, result.stderr
    df = pl.read_parquet(out)
    assert set(df.filter(pl.col("type") != "AllBlocksCleared")["kind"]) == {
        "full_attention",
        "sliding_window",
    }


def test_csv_roundtrip(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    result = runner.invoke(app, ["export", str(rec), "-o", str(out), "-q"])
    assert result.exit_code == 0
    assert result.stderr == ""
    df = pl.read_csv(out)
    assert df.height == 3419
    assert df.columns == [*TABLE_SCHEMA, *TIME_AND_HASH_COLUMNS, *DERIVED_COLUMNS]


def test_directory_is_hive_partitioned(tmp_path: Path) -> None:
    a = record_capture("gemma3", tmp_path / "a.mcap", endpoint="tcp://h:5557", dp_rank=0)
    # The first layout names no rank in its batches: the channel's rank applies.
    b = record_capture(
        "full_only.legacy-array-initial.signed",
        tmp_path / "b.mcap",
        endpoint="tcp://h:5558",
        dp_rank=1,
    )
    out = tmp_path / "fleet"
    result = runner.invoke(app, ["export", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    parts = sorted(p.relative_to(out).parts[:2] for p in out.rglob("*.parquet"))
    assert ("channel=tcp%3A%2F%2Fh%3A5557", "dp_rank=0") in parts
    assert ("channel=tcp%3A%2F%2Fh%3A5558", "dp_rank=1") in parts
    df = pl.scan_parquet(out, hive_partitioning=True).collect()
    assert df.height == 3419 + 782
    counts = dict(df.group_by("channel").agg(pl.len()).iter_rows())
    assert counts == {"tcp://h:5557": 3419, "tcp://h:5558": 782}
    # The README's query: blocks stored and evicted per kind.
    q = (
        pl.scan_parquet(out, hive_partitioning=True)
        .group_by("kind", "type")
        .agg(blocks=pl.col("hash").count())
        .sort("kind", "type")
        .collect()
    )
    assert q.filter(pl.col("type") == "BlockStored")["blocks"].sum() == 1890 + 436


def test_refuses_to_overwrite(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    out.write_bytes(b"x")
    result = runner.invoke(app, ["export", str(rec), "-o", str(out)])
    assert result.exit_code == 2
    assert "--force" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # With --force a regular file is replaced, whatever it holds (issue 24: nothing is
    # decided from a file's contents).
    for _ in range(2):
        result = runner.invoke(app, ["export", str(rec), "-o", str(out), "--force"])
        assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(out).height == 3419


def test_unknown_suffix(rec: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(rec), "-o", str(tmp_path / "t.xlsx")])
    assert result.exit_code == 2
    assert "use .parquet, .csv or a directory" in result.stderr


# -- issue 8.1: --force replaces only what kvtool wrote (run only in tmp_path) ------------------


def _export(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["export", *args])
    return result.exit_code, result.stderr


def test_issue8_1_force_never_deletes_a_directory_with_the_input(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    rec = record_capture("gemma3", work / "run.mcap")
    notes = work / "notes.txt"
    notes.write_text("precious")
    code, err = _export(str(rec), "-o", str(work), "--force")
    assert code == 2
    assert "holds the input" in err and len(err.strip().splitlines()) == 1
    assert rec.is_file() and notes.read_text() == "precious"


def test_issue24_force_never_deletes_a_directory_kvtool_did_not_create(
    rec: Path, tmp_path: Path
) -> None:
    """A directory without kvtool's mark is refused, even when it holds nothing but what
    looks like kvtool's export: a copy of one (issue 24: never decided from contents)."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "data.parquet").write_bytes(b"user data")
    (out / "keep.txt").write_text("keep")
    code, err = _export(str(rec), "-o", str(out), "--force")
    assert code == 2 and "a directory kvtool did not create (no .kvtool-export in it)" in err
    assert (out / "keep.txt").read_text() == "keep"
    assert (out / "sub" / "data.parquet").read_bytes() == b"user data"
    made = tmp_path / "made"
    assert _export(str(rec), "-o", str(made))[0] == 0
    copy = tmp_path / "copy"
    shutil.copytree(made, copy)
    (copy / ".kvtool-export").rmdir()  # the parts, each with kvtool's Parquet key: no mark
    before = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    code, err = _export(str(rec), "-o", str(copy), "--force")
    assert code == 2 and "did not create" in err
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == before


def test_issue24_force_replaces_a_directory_kvtool_created(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    assert _export(str(rec), "-o", str(out))[0] == 0
    assert (out / ".kvtool-export").is_dir() and not any((out / ".kvtool-export").iterdir())
    first = sorted(p.relative_to(out) for p in out.rglob("*.parquet"))
    assert first
    code, err = _export(str(rec), "-o", str(out))
    assert code == 2 and "--force" in err
    # What is inside does not matter: the mark says kvtool made the directory.
    (out / first[0].parent / "extra.txt").write_text("x")
    code, err = _export(str(rec), "-o", str(out), "--force")
    assert code == 0, err
    assert sorted(p.relative_to(out) for p in out.rglob("*.parquet")) == first
    assert not list(out.rglob("extra.txt"))
    assert pl.scan_parquet(out, hive_partitioning=True).collect().height == 3419
    assert pl.read_parquet(out).height == 3419  # the mark trips no directory scan
    assert not list(tmp_path.glob(".fleet*"))  # no temporary or old directory left


def test_issue24_csv_force_replaces_any_regular_file(rec: Path, tmp_path: Path) -> None:
    """Issue 24: --force refused a user's regular file ('not a kvtool text file')."""
    out = tmp_path / "t.csv"
    for old in (rec.read_bytes(), b"a,b\n1,2\n"):
        out.write_bytes(old)
        code, err = _export(str(rec), "-o", str(out))
        assert code == 2 and "pass --force" in err
        assert out.read_bytes() == old
        code, err = _export(str(rec), "-o", str(out), "--force")
        assert code == 0, err
        assert out.read_text().startswith("log_time,ts,seq,recording,channel,")


def test_issue8_1_output_is_the_input(rec: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.csv"
    link.symlink_to(rec)
    before = rec.read_bytes()
    code, err = _export(str(rec), "-o", str(link), "--force")
    assert code == 2 and "is also an input" in err
    assert rec.read_bytes() == before


def test_issue8_1_failed_export_leaves_old_output(tmp_path: Path, rec: Path) -> None:
    from kvtool.errors import RecordingError
    from kvtool.export import export_table

    for out in (tmp_path / "t.parquet", tmp_path / "d"):
        export_table([rec], out)
        before = sorted(
            (p.relative_to(out), p.read_bytes()) for p in [out, *out.rglob("*")] if p.is_file()
        )
        code, err = _export(str(rec), str(tmp_path / "missing.mcap"), "-o", str(out), "--force")
        assert code != 0 and "missing.mcap" in err
        after = sorted(
            (p.relative_to(out), p.read_bytes()) for p in [out, *out.rglob("*")] if p.is_file()
        )
        assert after == before
        with pytest.raises(RecordingError):
            export_table([rec, tmp_path / "missing.mcap"], out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "g.mcap", "t.parquet"]


# -- issue 9.7: export and copy as library calls ---------------------------------------------


def test_issue9_7_export_table_library(rec: Path, tmp_path: Path) -> None:
    from kvtool.columns import ReadStats
    from kvtool.export import ExportLayout, export_table
    from kvtool.outputs import PARQUET_KEY

    stats = ReadStats()
    res = export_table([rec], tmp_path / "t.parquet", stats=stats)
    assert (res.layout, res.rows, stats.messages) == (ExportLayout.PARQUET, 3419, stats.messages)
    assert PARQUET_KEY in pl.read_parquet_metadata(tmp_path / "t.parquet")
    res = export_table([rec], tmp_path / "d")
    assert res.layout is ExportLayout.DIRECTORY and res.rows == 3419
    assert all((tmp_path / "d" / f).is_file() for f in res.files)
    res = export_table([rec], tmp_path / "t.csv")
    assert res.layout is ExportLayout.CSV
    assert pl.read_csv(tmp_path / "t.csv").height == 3419


def test_issue9_7_copy_batches_library(rec: Path, tmp_path: Path) -> None:
    from kvtool.export import copy_batches
    from kvtool.recording import RecordingPathError, open_recording

    out = tmp_path / "copy.mcap"
    with open_recording(rec) as src:
        msgs = list(src.messages())
        n = copy_batches(msgs[:10], out, [src])
        with pytest.raises(RecordingPathError, match="file exists"):
            copy_batches(msgs, out, [src])
        with pytest.raises(RecordingPathError, match="is also an input"):
            copy_batches(msgs, rec, [src], force=True)
    assert n == 10
    with open_recording(out) as r:
        got = list(r.messages())
    assert [(m.seq, m.data, m.log_time) for m in got] == [
        (m.seq, m.data, m.log_time) for m in msgs[:10]
    ]


def test_issue9_7_failed_copy_leaves_target(rec: Path, tmp_path: Path) -> None:
    from kvtool.export import copy_batches
    from kvtool.recording import open_recording

    out = tmp_path / "copy.mcap"
    with open_recording(rec) as src:
        msgs = list(src.messages())
        copy_batches(msgs[:3], out, [src])
        before = out.read_bytes()

        def boom() -> Iterator[RecordedMessage]:
            yield from msgs[:5]
            raise RuntimeError("disk on fire")

        with pytest.raises(RuntimeError):
            copy_batches(boom(), out, [src], force=True)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.mcap", "g.mcap"]


def test_issue8_1_directory_swapped_after_the_last_check_is_never_removed(
    rec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory of the user's put at the path just after kvtool's re-check (the race
    between check and rename) stays at its path, whole.

    The race is made deterministic by swapping the directory at the moment kvtool moves it
    aside: the check that counts runs on the directory once moved, and finds no mark.
    """
    out = tmp_path / "fleet"
    assert _export(str(rec), "-o", str(out))[0] == 0
    real_rename = os.rename
    kvtools = tmp_path / "kvtools"

    def racing_rename(src: object, dst: object) -> None:
        if Path(str(src)) == out.resolve() and not kvtools.exists():
            real_rename(out, kvtools)
            out.mkdir()
            (out / "late.txt").write_text("written by the user meanwhile")
        real_rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", racing_rename)
    code, err = _export(str(rec), "-o", str(out), "--force")
    monkeypatch.undo()
    assert code == 2 and "did not create" in err
    assert [p.name for p in out.iterdir()] == ["late.txt"]
    assert (out / "late.txt").read_text() == "written by the user meanwhile"
    assert not list(tmp_path.glob(".fleet*"))  # no hidden directory holds anything


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ""])
def test_long_output_name_is_written(rec: Path, tmp_path: Path, suffix: str) -> None:
    """A 245-character name is valid (the limit is 255) but the temporary name beside it
    was the whole name plus ~20 characters: 'File name too long' on the old code."""
    out = tmp_path / ("x" * 245 + suffix)
    code, err = _export(str(rec), "-o", str(out))
    assert code == 0, err
    assert out.exists()
    code, err = _export(str(rec), "-o", str(out), "--force")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([rec.name, out.name])


def test_recording_to_an_unbuffered_stream_is_complete_at_close(tmp_path: Path) -> None:
    """``replay -o -`` under PYTHONUNBUFFERED=1 gets stdout as a raw FileIO. mcap's Writer
    then buffered it privately and nobody flushed that buffer: at close the stream held
    only the first bytes (the rest came at exit, or never, and errors were not seen)."""
    import io

    from kvtool.recording import RecordingWriter, open_recording

    path = tmp_path / "raw.mcap"
    with io.FileIO(path, "wb") as raw:
        w = RecordingWriter("-", stream=raw)
        w.write(w.add_channel("tcp://h:1"), 0, b"\x93\xcb" + b"\x00" * 8 + b"\x90\xc0", 1)
        w.close()
        assert not raw.closed  # the caller's stream (stdout) stays open
        with open_recording(path) as r:
            assert len(list(r.messages())) == 1
            assert not r.recovery.damaged


def test_recording_to_a_full_unbuffered_stdout_fails(tmp_path: Path) -> None:
    """Old code: ``replay -o - > /dev/full`` with PYTHONUNBUFFERED=1 said 'wrote N
    batches to stdout' and exited 0 while nothing was written (a small recording fit in
    the buffer nobody flushed)."""
    import subprocess
    import sys

    from kvtool.recording import RecordingWriter

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    rec = tmp_path / "small.mcap"
    with RecordingWriter(rec) as w:
        w.write(w.add_channel("tcp://h:1"), 0, b"\x93\xcb" + b"\x00" * 8 + b"\x90\xc0", 1)
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", "replay", str(rec), "-o", "-"],
            stdout=full,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            timeout=120,
            check=False,
        )
    assert proc.returncode != 0
    assert b"No space left on device" in proc.stderr and b"wrote" not in proc.stderr


@pytest.mark.parametrize("name", ["gemma3", "gemma3.byteshash"])
def test_issue11_11_times_are_timestamps_and_hash_hex_joins_replay_jsonl(
    name: str, tmp_path: Path
) -> None:
    from tests.recutil import write_capture

    rec = tmp_path / "r.mcap"
    write_capture(rec, name)
    out = tmp_path / "e.parquet"
    res = CliRunner().invoke(app, ["export", str(rec), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.stderr
    df = pl.read_parquet(out)
    assert df.schema["receive_time"] == pl.Datetime("ns", "UTC")
    assert df.schema["publish_time"] == pl.Datetime("ns", "UTC")
    assert (df["receive_time"].dt.epoch("ns") == df["log_time"]).all()
    res = CliRunner().invoke(app, ["replay", str(rec), "--format", "jsonl", "--hash-format", "hex"])
    assert res.exit_code == 0, res.stderr
    jsonl = [
        h for line in res.stdout.splitlines() for h in json.loads(line).get("block_hashes") or []
    ]
    exported = df.filter(pl.col("hash").is_not_null())["hash_hex"].to_list()
    # Every replayed hash is the export's hex form (bytes hashes too: their last 8 bytes).
    assert jsonl == exported


def test_an_existing_directory_keeps_its_permissions(rec: Path, tmp_path: Path) -> None:
    # Before: the user's empty `chmod 700` directory came back 755 (a new one swapped in).
    out = tmp_path / "private"
    out.mkdir()
    out.chmod(0o700)
    for extra in ([], ["--force"]):
        code, err = _export(str(rec), "-o", str(out), *extra)
        assert code == 0, err
        assert out.stat().st_mode & 0o777 == 0o700


def test_issue24_hash_hex_keeps_every_digit_and_joins_replay_hex(tmp_path: Path) -> None:
    """Issue 24: numpy's S8 view dropped trailing NUL bytes (0 -> "", 2**63 -> "80"), and a
    32-byte hash showed as its first 16 hex digits in replay but its last 16 in hash_hex."""
    from tests.test_render import _record, _stored

    ints = [0, 2**63, 0x0102030405060700, 2**64 - 1, 1]
    tail = bytes(range(24)) + b"\x11\x22\x33\x44\x55\x66\x77\x00"
    rec = _record(
        tmp_path / "h.mcap",
        [
            [_stored(ints, 0, "full_attention")],
            [_stored([tail, b"\xff" * 24 + b"\x00" * 8], 0, "full_attention")],
        ],
    )
    out = tmp_path / "e.parquet"
    res = runner.invoke(app, ["export", str(rec), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.stderr
    exported = pl.read_parquet(out)["hash_hex"].to_list()
    assert exported == [
        "0000000000000000",
        "8000000000000000",
        "0102030405060700",
        "ffffffffffffffff",
        "0000000000000001",
        "1122334455667700",
        "0000000000000000",
    ]
    res = runner.invoke(app, ["replay", str(rec), "-f", "jsonl", "--hash-format", "hex"])
    assert res.exit_code == 0, res.stderr
    replayed = [h for line in res.stdout.splitlines() for h in json.loads(line)["block_hashes"]]
    assert replayed == exported  # one rule: they join on equality


def test_issue24_a_kind_spelled_like_kvtools_labels_stays_distinct(tmp_path: Path) -> None:
    """Issue 24: a wire kind spelled 'unannotated' or 'unattributed' merged with kvtool's
    own labels (stores without a kind, removes no store explains)."""
    from kvtool.annotate import StatusKinds, kind_label
    from tests.test_render import _record, _stored

    wire = [None, "unannotated", "unattributed", "kind:unannotated", "", "full_attention"]
    rec = _record(tmp_path / "k.mcap", [[_stored([i + 1], i, k)] for i, k in enumerate(wire)])
    shown = [
        "unannotated",
        "kind:unannotated",
        "kind:unattributed",
        "kind:kind:unannotated",
        "kind:",
        "full_attention",
    ]
    assert [kind_label(k) for k in wire] == shown
    assert len(set(shown)) == len(shown)
    out = tmp_path / "e.parquet"
    res = runner.invoke(app, ["export", str(rec), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.stderr
    assert pl.read_parquet(out)["kind"].to_list() == shown
    status = StatusKinds()
    assert [status.store("c", i, k) for i, k in enumerate(wire)] == shown
    res = runner.invoke(app, ["replay", str(rec), "-f", "pretty"])
    assert res.exit_code == 0, res.stderr
    assert [
        ln.split()[ln.split().index(f"g{i}") + 1] for i, ln in enumerate(res.stdout.splitlines())
    ] == shown
