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


# -- extreme group and window values ----------------------------------------------------------

B63 = 1 << 63
U64_MAX = (1 << 64) - 1
I64_MIN = -(1 << 63)


def _store(hashes: list[int], group: int, kind: str, window: int | None = None) -> dict:
    ev: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": group,
        "kv_cache_spec_kind": kind,
    }
    if window is not None:
        ev["kv_cache_spec_sliding_window"] = window
    return ev


def _remove(hashes: list[int], group: int) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": group}


def _extreme_recording(path: Path, *, array: bool = False) -> Path:
    """Groups and windows at int64's ends (kept exactly) and past them (uint64, malformed)."""
    batches = [
        [
            _store([1, 2], 0, "full_attention"),
            _store([1, 2], B63 - 1, "sliding_window", B63 - 1),  # int64's largest: exact
            _store([1, 2], I64_MIN, "sliding_window", 64),  # int64's smallest: exact
            _store([1, 2], B63, "sliding_window", 64),  # past int64: malformed
            _store([1, 2], U64_MAX, "sliding_window", 32),
        ],
        [_store([3], 5, "sliding_window", B63), _store([4], 6, "sliding_window", U64_MAX)],
        [_remove([1], B63 - 1), _remove([1], B63), _remove([2], U64_MAX), _remove([1], 0)],
    ]
    if array:  # the last array layout (vLLM <= 0.23): every field in order
        from kvtool.schema import FIELDS

        def as_array(ev: dict) -> list:
            t = ev["type"]
            names = [f.name for f in FIELDS if (f.stored if t == "BlockStored" else f.removed)]
            return [t, *(ev.get(n) for n in names)]

        batches = [[as_array(e) for e in b] for b in batches]
    msgs = [(b"", i, _ENC.encode([1.0 + i, evs, 0])) for i, evs in enumerate(batches)]
    return write_recording(path, msgs)


@pytest.mark.parametrize("decoder", ["numba", "msgspec"])
@pytest.mark.parametrize("array", [False, True])
def test_issue24_groups_and_windows_past_int64_are_never_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str, array: bool
) -> None:
    monkeypatch.setenv("KVTOOL_DECODER", decoder)
    rec = _extreme_recording(tmp_path / "x.mcap", array=array)
    # Before, the six events past int64 decoded with group/window null and merged into
    # one no-group row; now each is a malformed event, skipped and named in every
    # command, and int64's own ends stay exact and distinct.
    result = runner.invoke(app, ["report", str(rec), "--by", "group", "--format", "json"])
    assert result.exit_code == 3, result.stderr
    rep = json.loads(result.stdout)
    assert rep["source"]["skipped_events"] == 6
    assert "malformed BlockStored" in result.stderr
    rows = {(r["group_idx"], r["sliding_window"]): r for r in rep["by_group"]}
    assert set(rows) == {(0, None), (B63 - 1, B63 - 1), (I64_MIN, 64)}
    assert [rows[k]["blocks_stored"] for k in sorted(rows)] == [2, 2, 2]
    assert rows[(B63 - 1, B63 - 1)]["blocks_removed"] == 1

    out = tmp_path / "x.parquet"
    result = runner.invoke(app, ["export", str(rec), "-o", str(out)])
    assert result.exit_code == 3, result.stderr
    df = pl.read_parquet(out).filter(pl.col("type") != "AllBlocksCleared")
    got = Counter(df.select("group_idx", "sliding_window", "type").iter_rows())
    assert got == {
        (0, None, "BlockStored"): 2,
        (B63 - 1, B63 - 1, "BlockStored"): 2,
        (I64_MIN, 64, "BlockStored"): 2,
        (B63 - 1, B63 - 1, "BlockRemoved"): 1,
        (0, None, "BlockRemoved"): 1,
    }

    result = runner.invoke(app, ["info", str(rec), "--format", "json"])
    assert result.exit_code == 3, result.stderr
    info = json.loads(result.stdout)
    assert info["skipped_events"] == 6
    assert info["blocks_stored"] == 6 and info["blocks_removed"] == 2

    result = runner.invoke(app, ["replay", str(rec), "--format", "jsonl"])
    assert result.exit_code == 3, result.stderr
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted((e["type"], e["group_idx"]) for e in shown) == sorted(
        [
            ("BlockStored", 0),
            ("BlockStored", B63 - 1),
            ("BlockStored", I64_MIN),
            ("BlockRemoved", B63 - 1),
            ("BlockRemoved", 0),
        ]
    )


# -- replay --publish: what a real subscriber received ----------------------------------------


@pytest.mark.zmq
def test_issue24_publish_interrupted_counts_what_the_subscriber_had(tmp_path: Path) -> None:
    """A SUB on 127.0.0.1 receives 32 batches at 20/s, then Ctrl-C: the publisher says it
    sent at least those 32 (it said "after 0 batches": its count was kept every 1000)."""
    import signal
    import subprocess
    import sys
    import time

    import zmq

    from tests.test_live_faults import ROOT, free_port

    rec = write_recording(tmp_path / "g.mcap", capture_messages("gemma3"))
    ep = f"tcp://127.0.0.1:{free_port()}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"")
    sub.connect(ep)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "kvtool", "replay", str(rec), "--publish", ep),
            *("--rate", "20", "--loop", "forever", "--renumber", "--wait-subscribers", "1"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    got = 0
    try:
        deadline = time.monotonic() + 60
        while got < 32 and time.monotonic() < deadline:
            if sub.poll(200):
                sub.recv_multipart()
                got += 1
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        sub.close(linger=0)
        ctx.term()
    assert got == 32
    assert proc.returncode == 130, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("kvtool: interrupted after "), err
    assert int(line.split()[3]) >= 32, err


@pytest.mark.zmq
def test_issue24_publish_progress_leaves_waiting_once_sending_starts(tmp_path: Path) -> None:
    """The progress callback gets the live counters when sending starts and while it goes
    on (it came every 1000 batches only: the status stayed on "waiting for 1 subscriber")."""
    import zmq

    from kvtool.pacing import Pacing, PublishStats, publish_recording
    from kvtool.render.status import PublishProgress
    from kvtool.replay import Replay
    from tests.test_live_faults import free_port

    rec = write_recording(tmp_path / "f.mcap", capture_messages("full_only"))
    ep = f"tcp://127.0.0.1:{free_port()}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"")
    sub.connect(ep)
    seen: list[tuple[int, int]] = []
    progress = PublishProgress(_NoTerminal(), enabled=False)  # type: ignore[arg-type]

    def on_sent(stats: PublishStats) -> None:
        progress.update(stats)
        seen.append((id(stats), stats.sent))

    try:
        with Replay([str(rec)]) as rp:
            result = publish_recording(
                rp,
                ep,
                None,
                pacing=Pacing(rate=100.0),  # 74 batches: about 0.7 s
                wait_subscribers=1,
                wait_timeout_s=30,
                on_sent=on_sent,
            )
    finally:
        sub.close(linger=0)
        ctx.term()
    n = result.stats.sent
    assert n == len(capture_messages("full_only"))
    assert seen[0][1] == 0  # at once, before the first batch: no more "waiting"
    assert any(0 < s < n for _, s in seen)  # and while sending, well before 1000
    assert len({i for i, _ in seen}) == 1  # always the live counters
    assert progress.sent == n


class _NoTerminal:
    is_terminal = False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--group-meta", f"{U64_MAX}=full_attention"], f"group {U64_MAX} is past int64"),
        (["--group-meta", f"0=sliding_window:{B63}"], f"window '{B63}' is past int64"),
        (
            ["--groups", "window.json"],
            f'"sliding_window" must be an integer (int64) or null, got {U64_MAX}',
        ),
        (["--groups", "spec.json"], 'needs "sliding_window": a positive integer (tokens, int64)'),
    ],
)
def test_issue24_metadata_past_int64_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    """A window or group past int64 in --group-meta or a groups file: exit 2, one line
    (it was "internal error: OverflowError" or a polars TypeError)."""
    monkeypatch.chdir(tmp_path)
    entry = {"group_idx": 0, "kind": "sliding_window", "block_size": 16}
    Path("window.json").write_text(json.dumps([{**entry, "sliding_window": U64_MAX}]))
    spec = {"spec": "SlidingWindowSpec", "sliding_window": B63, "block_size": 16}
    Path("spec.json").write_text(json.dumps([spec]))
    rec = _extreme_recording(tmp_path / "x.mcap")
    for command in (["report", str(rec)], ["export", str(rec), "-o", "x.parquet"]):
        result = runner.invoke(app, [*command, *args])
        assert result.exit_code == 2, result.stderr
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- channel rank vs payload rank, across every command ----------------------------------------


def _rank_stream(seed: int, n: int) -> list[list[dict]]:
    import random

    r = random.Random(seed)
    live: list[int] = []
    out = []
    for _ in range(n):
        hs = [r.getrandbits(64) for _ in range(r.randint(1, 4))]
        evs = [_store(hs, 0, "full_attention")]
        live += hs
        if len(live) > 6:
            evs.append(_remove([live.pop(0)], 0))
        out.append(evs)
    return out


def test_issue24_channel_rank_is_every_commands_rank(tmp_path: Path) -> None:
    """Rank 0's channel names payload rank 5, rank 1's (port + 1) names 0: every command
    counts each channel under its endpoint's rank."""
    from kvtool.recording import RecordingWriter

    rec = tmp_path / "ranks.mcap"
    streams = {0: _rank_stream(1, 40), 1: _rank_stream(2, 30)}
    with RecordingWriter(rec) as w:
        ids = {r: w.add_channel(f"tcp://127.0.0.1:{6557 + r}", "", r) for r in streams}
        t = 1_765_000_000_000_000_000
        for i in range(40):
            for r, batches in streams.items():
                if i < len(batches):
                    payload = _ENC.encode([1000.0 + i, batches[i], {0: 5, 1: 0}[r]])
                    w.write(ids[r], i, payload, t)
                    t += 7_000_000
    stored = {
        r: sum(len(e["block_hashes"]) for b in bs for e in b if e["type"] == "BlockStored")
        for r, bs in streams.items()
    }
    rep = _report(str(rec), "--by", "rank")
    assert {r["dp_rank"]: r["blocks_stored"] for r in rep["by_rank"]} == stored
    assert sum("payload_rank column" in f for f in rep["source"]["findings"]) == 2
    live = {r["dp_rank"]: r["live_blocks_end"] for r in rep["by_rank"]}
    assert _report(str(rec), "--rank", "1")["totals"]["blocks_stored"] == stored[1]

    result = runner.invoke(app, ["replay", str(rec), "--rank", "1", "--format", "jsonl"])
    assert result.exit_code == 0, result.stderr
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    assert {e["dp_rank"] for e in shown} == {1}
    assert sum(len(e["block_hashes"]) for e in shown if e["type"] == "BlockStored") == stored[1]

    out = tmp_path / "fleet"
    result = runner.invoke(app, ["export", str(rec), "-o", f"{out}/"])
    assert result.exit_code == 0, result.stderr
    df = pl.read_parquet(out, hive_partitioning=True).filter(pl.col("type") == "BlockStored")
    by = df.group_by("dp_rank", "payload_rank").agg(pl.len()).rows()
    assert sorted(by) == [(0, 5, stored[0]), (1, 0, stored[1])]

    result = runner.invoke(app, ["info", str(rec), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    chans = json.loads(result.stdout)["channels"]
    assert [(c["dp_rank"], c["batches"]) for c in chans] == [(0, 40), (1, 30)]

    result = runner.invoke(app, ["top", str(rec), "--view", "rank", "--once", "--speed", "0"])
    assert result.exit_code == 0, result.stderr
    rows = [s.split() for s in result.stdout.splitlines()]
    rows = [r for r in rows if len(r) > 3 and r[0] == "rank" and r[1].isdigit()]
    assert {int(r[1]): int(r[3]) for r in rows} == live


# -- the same rows in report, export and top, on small recordings built here ---------------------

_SHAPES: dict[str, list[list[dict]]] = {
    # stores with group_idx, removes without: one per group, one in two groups, one orphan
    "legacy": [
        [
            _store([11, 12, 13], 0, "full_attention"),
            _store([21, 22], 1, "sliding_window", 32),
            _store([30], 0, "full_attention"),
            _store([30], 1, "sliding_window", 32),
        ],
        [{"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"} for h in (11, 21, 30, 99)],
        [_remove([12], 0), {"type": "BlockRemoved", "block_hashes": [22], "medium": "GPU"}],
    ],
    # one group with two windows, another group with one of them
    "collide": [
        [
            _store([1, 2], 1, "sliding_window", 32),
            _store([3], 1, "sliding_window", 64),
            _store([4, 5, 6], 2, "sliding_window", 32),
        ],
        [_remove([1], 1), _remove([3], 1), _remove([4], 2)],
    ],
    # wire kinds spelled like kvtool's labels
    "labels": [
        [
            _store([1, 2], 0, "unannotated"),
            _store([3], 1, "unattributed"),
            _store([4], 2, "kind:unannotated"),
        ],
        [_remove([1], 0), _remove([3], 1), _remove([4], 2)],
    ],
    # removes before their group's first annotated store
    "early": [
        [
            {**_store([1, 2], 0, "x"), "kv_cache_spec_kind": None},
            _remove([1], 0),
        ],
        [_store([3], 0, "full_attention"), _remove([2], 0)],
    ],
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_issue24_report_export_and_top_show_the_same_rows(tmp_path: Path, shape: str) -> None:
    msgs = [(b"", i, _ENC.encode([1.0 + i, evs, 0])) for i, evs in enumerate(_SHAPES[shape])]
    rec = write_recording(tmp_path / f"{shape}.mcap", msgs)
    rep = _report(str(rec), "--by", "group")
    want = {
        (r["group_idx"], r["kind"], r["sliding_window"]): (r["blocks_stored"], r["blocks_removed"])
        for r in rep["by_group"]
    }
    df = _export(rec, tmp_path / "t.parquet").filter(pl.col("type") != "AllBlocksCleared")
    got: dict[tuple[object, ...], list[int]] = {}
    for g, k, w, t in df.select("group_idx", "kind", "sliding_window", "type").iter_rows():
        got.setdefault((g, k, w), [0, 0])[t == "BlockRemoved"] += 1
    assert {key: tuple(v) for key, v in got.items()} == want

    result = runner.invoke(app, ["top", str(rec), "--view", "group", "--once", "--speed", "0"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    head = next(i for i, s in enumerate(lines) if s.startswith("group "))
    live = {}
    for s in lines[head + 1 :]:
        # The key column, then 7 numbers: live, peak, store/s, evict/s, recomp/s, orphan, p50.
        fields = s.split()
        if len(fields) >= 8:
            live[" ".join(fields[:-7])] = int(fields[-7])
    shown = {
        f"{'-' if g is None else g} {k}" + (f":{w}" if w is not None else ""): r
        for (g, k, w), r in (
            ((r["group_idx"], r["kind"], r["sliding_window"]), r["live_blocks_end"])
            for r in rep["by_group"]
        )
    }
    assert live == shown


@pytest.mark.zmq
def test_issue24_top_record_without_a_batch_says_no_file_was_written(tmp_path: Path) -> None:
    """The recorder leaves no empty file; top said it "recorded 0 batch(es) to" it."""
    from tests.test_live_faults import free_port

    out = tmp_path / "t.mcap"
    ep = f"tcp://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["top", ep, "--record", str(out), "-d", "0.5s", "--once"])
    assert result.exit_code == 0, result.stderr
    assert f"kvtool: top recorded nothing, so no file was written at {out}" in result.stderr
    assert not out.exists()
