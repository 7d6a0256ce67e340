"""Issue 22: a long-running ``kvtool serve`` keeps bounded state (``--remember-keys``).

The report engine's state remembers every key ever stored (that tells a recompute from a
first store); with ``max_keys`` it forgets the keys gone longest ago, and says so. Every
other count is unchanged: only recomputes of forgotten keys become first stores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtool.report import ReportBuilder
from kvtool.report.snapshot import builder_samples
from kvtool.serve import Exporter
from kvtool.top import RecordingSource, ReportFeed
from tests.replayutil import capture_recording
from tests.test_serve import parse, report_json, sum_by, value

UNCHANGED = (
    "store_events", "blocks_stored", "tokens_stored", "remove_events", "blocks_removed",
    "blocks_cleared", "stored_while_live", "orphan_removes", "live_blocks_end",
    "peak_live_blocks",
)  # fmt: skip


def fed(path: Path, max_keys: int | None) -> tuple[ReportFeed, RecordingSource]:
    """A serve feed of the recording, one batch per call (the state is bounded between
    calls, as a live stream's chunks come)."""
    src = RecordingSource(str(path), speed=0)
    feed = ReportFeed(src.groups, whole_stream=False, max_keys=max_keys)
    for m in src.take(0.0):
        feed.add([m])
    return feed, src


def largest_batch(path: Path) -> int:
    """The most blocks one batch of the recording stores."""
    import msgspec

    from kvtool.recording import open_recording

    most = 0
    with open_recording(path) as r:
        for m in r.messages():
            _ts, events, *_ = msgspec.msgpack.decode(m.data)
            most = max(
                most,
                sum(len(e["block_hashes"]) for e in events if e.get("type") == "BlockStored"),
            )
    return most


@pytest.mark.parametrize("name", ["gemma3", "full_only"])
def test_issue22_bounded_state_forgets_only_recomputes(tmp_path: Path, name: str) -> None:
    path = capture_recording(tmp_path, name)
    exact, _ = fed(path, None)
    bounded, _ = fed(path, 150)
    (eb,) = exact.builders().values()
    (bb,) = bounded.builders().values()
    assert isinstance(bb, ReportBuilder)
    want = eb.tables()["totals"].to_dicts()[0]
    got = bb.tables()["totals"].to_dicts()[0]
    for col in UNCHANGED:
        assert got[col] == want[col], col
    snap = builder_samples(bb)
    assert snap.forgotten > 0
    # Each forgotten key's re-store is a first store instead of a recompute: no more.
    assert want["blocks_recomputed"] - snap.forgotten <= got["blocks_recomputed"]
    assert got["blocks_recomputed"] <= want["blocks_recomputed"]
    # The state holds at most the bound plus one batch's stores (it is bounded between
    # calls), and the exact one more.
    assert snap.keys < builder_samples(eb).keys
    assert snap.keys <= 150 + largest_batch(path)
    assert snap.horizon_s is not None and snap.horizon_s >= 0
    exact_snap = builder_samples(eb)
    assert exact_snap.forgotten == 0
    assert exact_snap.horizon_s == pytest.approx(eb.last_ts - eb.first_ts)


def test_issue22_unbounded_state_is_the_report(tmp_path: Path) -> None:
    """A bound the stream never reaches changes nothing: the report's numbers."""
    path = capture_recording(tmp_path, "gemma3")
    rep = report_json(path)
    feed, _ = fed(path, 1_000_000)
    (b,) = feed.builders().values()
    got = b.tables()["totals"].to_dicts()[0]
    for col in (*UNCHANGED, "blocks_recomputed"):
        assert got[col] == rep["totals"][col], col
    assert builder_samples(b).forgotten == 0


def test_issue22_serve_says_what_it_forgot(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    rep = report_json(path)
    feed, src = fed(path, 150)
    findings: list[str] = []
    exp = Exporter(on_finding=findings.append)
    exp.update(feed, src.health(), src.gap_ledger)
    samples = parse(exp.body().decode())
    forgotten = value(samples, "kvtool_keys_forgotten_total")
    assert forgotten is not None and forgotten > 0
    assert value(samples, "kvtool_state_keys") is not None
    horizon = value(samples, "kvtool_recompute_horizon_seconds")
    assert horizon is not None and horizon >= 0
    assert len(findings) == 1 and "--remember-keys" in findings[0]
    stored = sum_by(samples, "kvtool_blocks_stored_total", "kind")
    assert stored == {r["kind"]: float(r["blocks_stored"]) for r in rep["by_kind"]}
    recomputed = sum(v for _l, v in samples["kvtool_blocks_recomputed_total"])
    assert rep["totals"]["blocks_recomputed"] - forgotten <= recomputed
    assert recomputed <= rep["totals"]["blocks_recomputed"]
    # A second snapshot says it once.
    exp.update(feed, src.health(), src.gap_ledger)
    assert len(findings) == 1


def _one(state: object, op: int, h: int, ts: float) -> int:
    """One row through the kernel (channel 0, group 0, report row 0); what it was."""
    import numpy as np

    from kvtool.report import kernel

    out = kernel.step(
        state,  # type: ignore[arg-type]
        np.array([op], dtype=np.int8),
        np.zeros(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(1, dtype=np.bool_),
        np.array([h], dtype=np.int64),
        np.array([ts]),
        np.zeros(1, dtype=np.int64),
        1,
    )
    return int(out.what[0])


def test_issue22_kernel_forgets_the_keys_gone_longest_ago() -> None:
    from kvtool.report import kernel

    st = kernel.State(max_keys=100)
    for h in range(100):
        assert _one(st, kernel.STORE, h, float(h)) == kernel.FIRST
    for h in range(100):  # key h goes at time 100 + h: 0 is gone longest
        assert _one(st, kernel.REMOVE, h, 100.0 + h) == kernel.EVICTED
    assert _one(st, kernel.STORE, 1000, 300.0) == kernel.FIRST  # past the bound: forget
    assert st.forgotten == 26 and st.keys == 75  # down to three quarters (75 + the new one)
    assert st.forgotten_ts == 125.0  # the newest removal forgotten: key 25's
    assert _one(st, kernel.STORE, 0, 301.0) == kernel.FIRST  # forgotten: a first store
    assert _one(st, kernel.STORE, 99, 302.0) == kernel.RECOMPUTED  # remembered
    assert _one(st, kernel.REMOVE, 5, 303.0) == kernel.ORPHAN  # as without the bound


def test_issue22_kernel_keeps_live_keys_and_rebuilds_a_quarter_at_a_time() -> None:
    from kvtool.report import kernel

    st = kernel.State(max_keys=100)
    for h in range(200):  # all live: nothing can be forgotten
        _one(st, kernel.STORE, h, float(h))
    assert st.keys == 200 and st.forgotten == 0
    for h in range(20):  # 20 gone: fewer than a quarter of the bound, kept
        _one(st, kernel.REMOVE, h, 300.0 + h)
    table = st.table
    _one(st, kernel.STORE, 500, 400.0)
    assert st.table is table and st.forgotten == 0  # no rebuild for a few keys
    for h in range(20, 30):  # the 26th call finds 25 gone: they go, the next 5 stay
        _one(st, kernel.REMOVE, h, 300.0 + h)
    _one(st, kernel.STORE, 501, 401.0)
    assert st.forgotten == 25 and st.keys == 177  # 170 live, 5 gone, the two new ones
    for h in range(30, 200):  # the live ones all still there
        assert _one(st, kernel.STORE, h, 500.0) == kernel.WHILE_LIVE


def test_issue22_serve_gives_big_buffers_back() -> None:
    """serve sets glibc's mmap threshold (fixed, 1 MiB), so the state's rebuilt tables are
    unmapped when freed instead of leaving heap holes that RSS keeps."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    code = "from kvtool.commands._process import give_back_big_buffers as g; print(g())"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout.strip() == "True", proc.stderr
    src = (Path(__file__).parent.parent / "kvtool" / "commands" / "serve.py").read_text()
    # made by the console script's entry for a serve process (issue 19: not in the command)
    assert 'PROCESS_SETTINGS = {"serve": give_back_big_buffers}' in src


@pytest.mark.zmq
def test_issue22_serve_remember_keys_on_a_live_stream(tmp_path: Path) -> None:
    """``serve --remember-keys`` on a real publisher: bounded state, said on stderr and in
    /metrics; every count but recomputes still the report's of the recording."""
    from tests.conftest import capture_messages
    from tests.peer import Peer
    from tests.test_serve import DEADLINE_S, serve_proc, wait_for

    msgs = capture_messages("gemma3")
    out = tmp_path / "kept.mcap"
    with Peer(msgs, subscribe_timeout=DEADLINE_S, rate=100) as peer, serve_proc(
        tmp_path, peer.endpoint, "--replay-endpoint", str(peer.replay_endpoint),
        "--record", str(out), "--interval", "100ms", "--remember-keys", "150",
    ) as (proc, url):  # fmt: skip
        samples = wait_for(url, "kvtool_batches_received_total", len(msgs))
    assert proc.returncode == 0
    err = proc.stderr_text  # type: ignore[attr-defined]
    assert "finding: rank 0: recompute detection keeps a bounded number of keys" in err
    forgotten = value(samples, "kvtool_keys_forgotten_total")
    assert forgotten is not None and forgotten > 0
    rep = report_json(out)
    served = {
        "blocks_stored": "kvtool_blocks_stored_total",
        "blocks_removed": "kvtool_blocks_removed_total",
        "orphan_removes": "kvtool_orphan_removes_total",
        "stored_while_live": "kvtool_blocks_stored_while_live_total",
    }
    for col, name in served.items():
        assert sum(v for _l, v in samples[name]) == rep["totals"][col], col
    recomputed = sum(v for _l, v in samples["kvtool_blocks_recomputed_total"])
    assert rep["totals"]["blocks_recomputed"] - forgotten <= recomputed
    assert recomputed <= rep["totals"]["blocks_recomputed"]
