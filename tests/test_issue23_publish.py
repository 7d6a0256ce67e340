"""Issue 23: `replay --publish` keeps bounded buffers and answers every honest replay peer.

Real ZeroMQ sockets (inproc and 127.0.0.1), a real `kvtool replay --publish` process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from kvtool.publish import (
    MIN_SNDHWM,
    PUB_QUEUE_BYTES,
    REPLAY_BUFFER_BYTES,
    ChannelPublisher,
    Publisher,
    sndhwm_for,
)
from kvtool.recording import RecordingWriter
from tests.test_live_faults import ROOT, _vm_hwm_kib, free_port

END = (-1).to_bytes(8, "big", signed=True)


def test_issue23_no_replay_endpoint_no_replay_buffer() -> None:
    """Without --replay-endpoint nothing is kept for replay. Before: 10,000 payloads kept
    with no byte limit (3.5 GB in 6 s with 1 MB batches)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ChannelPublisher(ctx, "inproc://issue23-nobuf")
    try:
        for seq in range(100):
            pub.send(b"", seq, b"x" * 1000)
        assert len(pub.buffer) == 0 and pub.buffer_bytes == 0
        assert pub.stats.sent == 100
    finally:
        pub.close()
        ctx.term()


def test_issue23_replay_buffer_has_a_byte_limit() -> None:
    """The replay buffer keeps at most REPLAY_BUFFER_BYTES of payloads, oldest out first."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ChannelPublisher(ctx, "inproc://issue23-buf", "inproc://issue23-buf-replay")
    mib = b"y" * (1024 * 1024)
    try:
        n = REPLAY_BUFFER_BYTES // len(mib) + 50
        for seq in range(n):
            pub.send(b"", seq, mib)
        assert pub.buffer_bytes <= REPLAY_BUFFER_BYTES
        assert [s for s, _, _ in pub.buffer] == list(range(50, n))
    finally:
        pub.close()
        ctx.term()


def test_issue23_queue_bounds_scale_with_the_batch_size() -> None:
    """The PUB SNDHWM bounds a never-reading subscriber's queue in bytes, not messages."""
    assert sndhwm_for(1024 * 1024) == PUB_QUEUE_BYTES // (1024 * 1024)
    assert sndhwm_for(15_000) == PUB_QUEUE_BYTES // 15_000
    assert sndhwm_for(100) == 100_000  # small batches: vLLM's own bound
    assert sndhwm_for(10**9) == MIN_SNDHWM


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], ep: str, rcvhwm: int) -> zmq.Socket[bytes]:
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVHWM, rcvhwm)
    d.connect(ep)
    return d


def test_issue23_peers_that_never_read_cannot_starve_an_honest_one() -> None:
    """64 peers ask for the whole buffer and never read, filling every peer slot; an
    honest peer still gets its whole answer and the end marker: the peer stalled longest
    is evicted. Before: refused, no answer at all, not even the end marker."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ep = "inproc://issue23-fair"
    pub = ChannelPublisher(ctx, "inproc://issue23-fair-pub", ep, replay_sndhwm=4)
    peers = []
    try:
        for seq in range(100):
            pub.send(b"", seq, b"p%d" % seq)
        for _ in range(64):
            d = _dealer(ctx, ep, 1)
            d.send_multipart((b"", (0).to_bytes(8, "big")))
            peers.append(d)
        deadline = time.monotonic() + 30
        while pub.stats.replay_requests < 64:
            assert time.monotonic() < deadline
            pub.service(10)
        for _ in range(20):
            pub.service(5)  # every stalled peer's queue is full now
        honest = _dealer(ctx, ep, 1000)
        honest.send_multipart((b"", (0).to_bytes(8, "big")))
        got: list[int] = []
        while True:
            assert time.monotonic() < deadline, (got, pub.stats)
            pub.service(5)
            try:
                frames = honest.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            if frames[2] == END:
                break
            got.append(int.from_bytes(frames[2], "big"))
        assert got == list(range(100))
        assert pub.stats.replay_evicted >= 1
    finally:
        for d in [*peers]:
            d.close(linger=0)
        if "honest" in locals():
            honest.close(linger=0)
        pub.close()
        ctx.term()


def test_issue23_every_slot_busy_still_answers_with_the_end_marker() -> None:
    """With every peer slot busy and nobody stalled, one more request gets the end marker
    (an empty answer) instead of nothing."""
    import kvtool.publish as publish_mod

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ep = "inproc://issue23-full"
    pub = ChannelPublisher(ctx, "inproc://issue23-full-pub", ep, replay_sndhwm=1000)
    peers = []
    was = publish_mod.MAX_REPLAY_PEERS
    publish_mod.MAX_REPLAY_PEERS = 1
    try:
        for seq in range(10):
            pub.send(b"", seq, b"p")
        busy = _dealer(ctx, ep, 1000)
        peers.append(busy)
        busy.send_multipart((b"", (0).to_bytes(8, "big")))
        deadline = time.monotonic() + 30
        while pub.stats.replay_requests < 1:
            assert time.monotonic() < deadline
            pub._requests()  # read the request, answer nothing yet
        extra = _dealer(ctx, ep, 1000)
        peers.append(extra)
        extra.send_multipart((b"", (0).to_bytes(8, "big")))
        while not extra.poll(10):
            assert time.monotonic() < deadline
            pub._requests()
        assert extra.recv_multipart()[2] == END
        assert pub.stats.replay_refused == 1
    finally:
        publish_mod.MAX_REPLAY_PEERS = was
        for d in peers:
            d.close(linger=0)
        pub.close()
        ctx.term()


def _big_recording(path: Path, n: int, size: int) -> None:
    rng = os.urandom
    enc = msgspec.msgpack.Encoder()
    with RecordingWriter(path) as w:
        cid = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for seq in range(n):
            # A valid batch: one store whose token ids carry the bulk (random: no compression).
            blob = rng(size)
            payload = enc.encode([float(seq), [["AllBlocksCleared"]], 0, blob])
            w.write(cid, seq, payload, 1_000_000_000 + seq * 1_000_000)


@pytest.mark.zmq
@pytest.mark.slow
def test_issue23_publish_to_a_subscriber_that_never_reads_stays_bounded(tmp_path: Path) -> None:
    """`replay --publish --replay-endpoint` of 1 MB batches, looped to 1.2 GB, to a SUB
    that never reads: peak RSS under 300 MB. Before: the PUB queue (SNDHWM 100,000
    messages) and the unbounded replay buffer grew past 1 GB."""
    rec = tmp_path / "big.mcap"
    _big_recording(rec, 200, 1024 * 1024)
    ep = f"tcp://127.0.0.1:{free_port()}"
    replay_ep = f"tcp://127.0.0.1:{free_port()}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 65536)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ep)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "kvtool", "replay", str(rec), "--publish", ep),
            *("--replay-endpoint", replay_ep, "--max-speed", "--loop", "6"),
            *("--wait-subscribers", "1", "--wait-timeout", "60"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    try:
        while proc.poll() is None:
            try:
                peak = max(peak, _vm_hwm_kib(proc.pid))
            except (OSError, AssertionError):
                break
            time.sleep(0.05)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        sub.close(linger=0)
        ctx.term()
    assert proc.returncode == 0, err
    print(f"peak RSS {peak / 1024:.0f} MB")
    assert 0 < peak <= 300 * 1024, f"peak RSS {peak / 1024:.0f} MB"


def test_issue23_close_ends_with_a_socket_its_bookkeeping_missed() -> None:
    """A signal between a socket's creation and ``_order.append`` leaves a socket open that
    ``close`` does not know of: closing must still end (``zmq.Context.term`` alone waits
    for every open socket forever; seen once in CI as a SIGTERM'd replay that never ended).
    """
    import threading

    pub = Publisher(f"tcp://127.0.0.1:{free_port()}")
    stray = pub.context.socket(zmq.XPUB)  # what an interrupted ChannelPublisher leaves
    stray.bind("inproc://issue23-stray")
    done = threading.Event()

    def close() -> None:
        pub.close(flush=False)
        done.set()

    t = threading.Thread(target=close, daemon=True)
    t.start()
    assert done.wait(30), "close() waited for a socket it did not know of"
    assert stray.closed and pub.context.closed
