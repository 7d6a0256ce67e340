"""report --jobs: decoding on threads (and units of work) gives exactly the single-thread report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.columns import ReadStats, decode_chunk, iter_raw_chunks, iter_tables
from kvtool.recording import RecordingWriter
from kvtool.report import RAY_INSTALL_HINT, build_report
from tests.conftest import CAPTURES, capture_messages
from tests.recutil import write_capture
from tests.test_report import record_capture

runner = CliRunner()


@pytest.mark.parametrize("name", CAPTURES)
def test_jobs_2_equals_jobs_1_on_every_capture(name: str, tmp_path: Path) -> None:
    rec = record_capture(name, tmp_path / "r.mcap")
    # Small chunks: many units of work, so the pool really runs and state crosses chunks.
    one = build_report([rec], chunk_bytes=4000, every_ns=10_000_000).to_dict()
    two = build_report([rec], chunk_bytes=4000, every_ns=10_000_000, jobs=2).to_dict()
    assert two == one
    assert one == build_report([rec], every_ns=10_000_000).to_dict()


def _interleaved(path: Path, name: str, offset_ns: int) -> Path:
    # Same endpoint, topic and rank in both files: one channel's stream split in two.
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for i, (_topic, seq, payload) in enumerate(capture_messages(name)):
            if i % 2 == (offset_ns > 0):
                w.write(ch, seq, payload, log_time=1_000_000_000 + i * 1_000_000)
    return path


def test_jobs_2_equals_jobs_1_when_files_share_a_channel(tmp_path: Path) -> None:
    a = _interleaved(tmp_path / "a.mcap", "gemma3", 0)
    b = _interleaved(tmp_path / "b.mcap", "gemma3", 1)
    one = build_report([a, b], chunk_bytes=3000).to_dict()
    two = build_report([a, b], chunk_bytes=3000, jobs=2).to_dict()
    three = build_report([a, b], chunk_bytes=3000, jobs=3).to_dict()
    assert one == two == three
    assert one["totals"]["blocks_stored"] > 0


def test_decoded_chunks_equal_the_sequential_table(tmp_path: Path) -> None:
    rec = record_capture("gemma3.byteshash", tmp_path / "r.mcap")
    whole = iter_tables([rec], chunk_bytes=2000, labels=False)
    # Decoding each raw chunk on its own (as a worker does) gives the same rows.
    st = ReadStats()
    parts = [decode_chunk(raw) for raw in iter_raw_chunks([rec], stats=st, chunk_bytes=2000)]
    assert len(parts) > 3
    assert sum(p.table.height for p in parts) == sum(t.height for t in whole)


def test_cli_jobs_gives_the_same_json(tmp_path: Path) -> None:
    rec = record_capture("gemma3", tmp_path / "r.mcap")
    got = []
    for jobs in ("1", "2"):
        result = runner.invoke(app, ["report", str(rec), "--format", "json", "--jobs", jobs])
        assert result.exit_code == 0, result.stderr
        got.append(json.loads(result.stdout))
    assert got[0] == got[1]


def test_cli_jobs_must_be_positive(tmp_path: Path) -> None:
    rec = record_capture("gemma3", tmp_path / "r.mcap")
    result = runner.invoke(app, ["report", str(rec), "--jobs", "0"])
    assert result.exit_code == 2


def test_cli_ray_without_ray_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = record_capture("gemma3", tmp_path / "r.mcap")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    result = runner.invoke(app, ["report", str(rec), "--ray", "auto"])
    assert result.exit_code == 2
    assert RAY_INSTALL_HINT in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1


def _group_members(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 of stat: the process group
            out.append(int(entry))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["library", "cli"])
def test_jobs_2_leaves_no_process_behind(how: str, tmp_path: Path) -> None:
    """Nothing of the report outlives it (``--jobs`` are threads now: it starts no
    process; this kept the fork server and its readers from being left behind)."""
    rec = tmp_path / "g.mcap"
    write_capture(rec, "gemma3")
    code = (
        "from kvtool.report import build_report;"
        f"build_report([{str(rec)!r}], chunk_bytes=2000, jobs=2)"
    )
    cli = ["-m", "kvtool", "report", str(rec), "--jobs", "2", "-q", "-f", "json"]
    args = cli if how == "cli" else ["-c", code]
    proc = subprocess.Popen(
        [sys.executable, *args], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_group_gone(proc.pid)


def _assert_group_gone(pgid: int, grace_s: float = 0.5) -> None:
    """No process of the session ``pgid`` is left (after the kernel's own exit bookkeeping)."""
    deadline = time.monotonic() + grace_s
    left = _group_members(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = _group_members(pgid)
    assert left == [], left


def _interrupted_at_first_progress(call: str) -> None:
    """Run ``call`` (a build_report(...) with ``progress=hit``) in a new session, Ctrl-C at
    its first progress report; it must say so and leave no process of its own behind."""
    code = (
        "import _thread\n"
        "import signal\n"
        # A shell that starts its jobs in the background leaves SIGINT ignored, and then
        # interrupt_main() does nothing: the Ctrl-C this test means is Python's default.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from kvtool.report import build_report\n"
        "def hit(done, total, fired=[]):\n"
        "    if not fired:\n"
        "        fired.append(1)\n"
        "        _thread.interrupt_main()  # Ctrl-C, as the first piece of work comes back\n"
        "try:\n"
        f"    {call}\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert out.decode().strip() == "interrupted"
    _assert_group_gone(proc.pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_jobs_2_interrupted_mid_read_ends_every_process(tmp_path: Path) -> None:
    """Ctrl-C while the decoding threads are busy: the report stops at once, nothing left."""
    rec = tmp_path / "g.mcap"
    write_capture(rec, "gemma3")
    _interrupted_at_first_progress(
        f"build_report([{str(rec)!r}], chunk_bytes=500, jobs=2, progress=hit)"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_jobs_2_units_interrupted_end_every_process(tmp_path: Path) -> None:
    """Ctrl-C while a fleet's units run on threads: the report stops, no traceback."""
    a, b = tmp_path / "a.mcap", tmp_path / "b.mcap"
    write_capture(a, "gemma3", dp_rank=0)
    write_capture(b, "gemma3", dp_rank=1, endpoint="tcp://127.0.0.1:5558")
    _interrupted_at_first_progress(
        f"build_report([{str(a)!r}, {str(b)!r}], chunk_bytes=500, jobs=2, progress=hit)"
    )


def test_issue24_payload_rank_finding_survives_units_of_work(tmp_path: Path) -> None:
    """A channel whose payloads name another rank is named once, with --jobs 2 as with 1."""
    import msgspec

    from kvtool.recording import RecordingWriter

    enc = msgspec.msgpack.Encoder()

    def store(h: int) -> dict[str, object]:
        return {
            "type": "BlockStored",
            "block_hashes": [h],
            "parent_block_hash": None,
            "token_ids": list(range(16)),
            "block_size": 16,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "group_idx": 0,
        }

    paths = []
    for r in (0, 1):
        path = tmp_path / f"rank{r}.mcap"
        with RecordingWriter(path) as w:
            ch = w.add_channel(f"tcp://127.0.0.1:{5557 + r}", "", r)
            for s in range(4):
                ts = 1.7e9 + s
                w.write(ch, s, enc.encode([ts, [store(100 * r + s)], 0]), log_time=int(ts * 1e9))
        paths.append(str(path))
    found = []
    for jobs in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", "report", *paths, "--jobs", jobs, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        found.append([ln for ln in proc.stderr.splitlines() if "payload_rank" in ln])
    assert found[0] == found[1] and len(found[0]) == 1
    assert "tcp://127.0.0.1:5558 is data-parallel rank 1" in found[0][0]
