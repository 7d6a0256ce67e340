"""Capture library: real ZeroMQ on loopback against tests/peer.py publishing real vLLM bytes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import zmq

from kvtool.capture import (
    CaptureResult,
    Recorder,
    Source,
    capture,
)
from kvtool.errors import EndpointError
from kvtool.protocol import decode_batch, event_type, peek_ts
from kvtool.recording import open_recording
from tests.conftest import CAPTURES, capture_messages, capture_truth
from tests.peer import Peer

SECOND = 1_000_000_000


def record(path: Path, peer: Peer, **kw: object) -> CaptureResult:
    """Record the peer's stream in this thread (the peer runs in its own)."""
    kw.setdefault("duration_ns", 20 * SECOND)
    rec = Recorder(path, [Source(peer.endpoint, peer.replay_endpoint)], **kw)  # type: ignore[arg-type]
    return rec.run(handle_signals=False)


def wait_published(peer: Peer, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(peer.published) < n:
        assert time.monotonic() < deadline, "peer did not publish in time"
        time.sleep(0.005)


def read_back(path: Path) -> list[tuple[int, bytes]]:
    with open_recording(path) as r:
        out = [(m.seq, m.data) for m in r.messages()]
        assert r.recovery.complete
    return out


def file_counts(path: Path) -> dict[str, object]:
    """What `kvtool info` counts, computed from the file with the library."""
    types: Counter[str] = Counter()
    stored = removed = batches = 0
    with open_recording(path) as r:
        for m in r.messages():
            batches += 1
            b = decode_batch(m.data, seq=m.seq)
            for ev in b.events:
                t = event_type(ev)
                types[t] += 1
                if t == "BlockStored":
                    stored += len(ev.block_hashes)  # type: ignore[union-attr]
                elif t == "BlockRemoved":
                    removed += len(ev.block_hashes)  # type: ignore[union-attr]
    return {"batches": batches, "events": dict(types), "stored": stored, "removed": removed}


def assert_truth(path: Path, name: str) -> None:
    truth = capture_truth(name)
    c = file_counts(path)
    assert c["batches"] == truth["num_batches"]
    assert c["events"] == {k: v for k, v in truth["events_by_type"].items() if v}
    assert c["stored"] == truth["block_stored"]["total"]["blocks"]
    assert c["removed"] == truth["block_removed"]["total"]["blocks"]


# -------------------------------------------------------------- recordings


@pytest.mark.zmq
@pytest.mark.parametrize("name", CAPTURES)
def test_records_every_capture_byte_identical(tmp_path: Path, name: str) -> None:
    msgs = capture_messages(name)
    out = tmp_path / "run.mcap"
    with Peer(msgs) as peer:
        res = record(out, peer, max_batches=len(msgs))
    assert res.stop_reason == "max_batches"
    got = read_back(out)
    assert [s for s, _ in got] == [s for _, s, _ in msgs]
    assert [d for _, d in got] == [p for _, _, p in msgs]
    assert_truth(out, name)
    truth = capture_truth(name)
    assert res.stats.events == truth["num_events"]
    assert res.stats.batches == len(msgs)
    assert res.stats.lost == res.stats.gaps == res.stats.undecodable == 0
    with open_recording(out) as r:
        (ch,) = r.channels.values()
        assert ch.endpoint == peer.endpoint
        assert ch.topic == ""
        ledger = r.ledger
        first = next(iter(r.messages()))
        assert first.publish_time == int(peek_ts(first.data) * 1e9)  # type: ignore[operator]
    assert ledger is not None
    assert ledger["lost"] == 0 and ledger["recovered"] == 0
    (lc,) = ledger["channels"]
    assert (lc["batches"], lc["seq_first"], lc["seq_last"]) == (len(msgs), 0, len(msgs) - 1)
    assert lc["endpoint"] == peer.endpoint and lc["gaps"] == [] and lc["restarts"] == []


@pytest.mark.zmq
def test_live_status_counts_per_kind(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")
    seen = []
    with Peer(msgs) as peer:
        res = record(
            tmp_path / "r.mcap",
            peer,
            max_batches=len(msgs),
            status=seen.append,
            status_interval_ns=0,
        )
    truth = capture_truth("gemma3")
    assert seen and seen[-1] is res.stats
    want = Counter()
    for row in truth["block_stored"]["by_kind_window"]:
        want[row["kind"]] += row["events"]
    assert dict(res.stats.stores) == dict(want)
    assert sum(res.stats.removes.values()) == truth["events_by_type"]["BlockRemoved"]
    assert res.stats.cleared == truth["events_by_type"]["AllBlocksCleared"]


@pytest.mark.zmq
def test_removes_attributed_through_groups_metadata(tmp_path: Path) -> None:
    """Array events without kinds: the groups metadata names each group's kind."""
    name = "gemma3.legacy-array-group-idx"
    msgs = capture_messages(name)
    truth = capture_truth(name)
    with Peer(msgs) as peer:
        res = record(
            tmp_path / "r.mcap",
            peer,
            max_batches=len(msgs),
            groups=truth["group_metadata"],
            groups_source="groups.json",
        )
    want = Counter()
    for row in truth["block_removed"]["by_kind_window"]:
        want[row["kind"]] += row["events"]
    assert dict(res.stats.removes) == dict(want)
    with open_recording(tmp_path / "r.mcap") as r:
        assert r.groups == truth["group_metadata"]


@pytest.mark.zmq
def test_dropped_seqs_recovered_from_replay_in_order(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")
    out = tmp_path / "run.mcap"
    with Peer(msgs, drop={5, 9, 30}) as peer:
        res = record(out, peer, max_batches=len(msgs))
    got = read_back(out)
    assert [s for s, _ in got] == list(range(len(msgs)))
    assert [d for _, d in got] == [p for _, _, p in msgs]
    assert (res.stats.recovered, res.stats.lost) == (3, 0)
    assert res.ledger["recovered"] == 3 and res.ledger["lost"] == 0
    gaps = res.ledger["channels"][0]["gaps"]  # type: ignore[index]
    assert [(g["first"], g["last"], g["recovered"]) for g in gaps] == [
        (5, 5, 1),
        (9, 9, 1),
        (30, 30, 1),
    ]
    assert_truth(out, "gemma3")


@pytest.mark.zmq
@pytest.mark.parametrize("layout", ["topic", "legacy"])
def test_both_replay_reply_layouts(tmp_path: Path, layout: str) -> None:
    msgs = capture_messages("gemma3")
    with Peer(msgs, drop=set(range(10, 20)), reply_layout=layout) as peer:
        res = record(tmp_path / "r.mcap", peer, max_batches=len(msgs))
        assert peer.replay_requests and peer.replay_requests[0] == 10
    got = read_back(tmp_path / "r.mcap")
    assert [d for _, d in got] == [p for _, _, p in msgs]
    assert (res.stats.recovered, res.stats.lost) == (10, 0)


@pytest.mark.zmq
def test_lost_tail_fetched_when_channel_goes_quiet(tmp_path: Path) -> None:
    """The last batches never reach the live stream: only the quiet check finds them."""
    msgs = capture_messages("full_only")
    n = len(msgs)
    with Peer(msgs, drop={n - 3, n - 2, n - 1}) as peer:
        res = record(tmp_path / "r.mcap", peer, max_batches=n, quiet_ns=SECOND // 5)
        assert peer.replay_requests[-1] == n - 3
    got = read_back(tmp_path / "r.mcap")
    assert [s for s, _ in got] == list(range(n))
    assert (res.stats.recovered, res.stats.gaps, res.stats.lost) == (3, 1, 0)
    (gap,) = res.ledger["channels"][0]["gaps"]  # type: ignore[index]
    assert gap == {"first": n - 3, "last": n - 1, "recovered": 3, "lost_ranges": []}


@pytest.mark.zmq
def test_lost_tail_fetched_at_stop(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")
    n = len(msgs)
    with Peer(msgs, drop={n - 1}) as peer:
        # Stop before the quiet check would fire: the stop itself asks for the tail.
        res = record(tmp_path / "r.mcap", peer, duration_ns=SECOND, quiet_ns=60 * SECOND)
    got = read_back(tmp_path / "r.mcap")
    assert [s for s, _ in got] == list(range(n))
    assert res.stop_reason == "duration"
    assert (res.stats.recovered, res.stats.lost) == (1, 0)


@pytest.mark.zmq
def test_history_fetches_what_came_before_the_subscription(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")
    with Peer(msgs, publish_before_wait=30) as peer:
        wait_published(peer, 30)
        res = record(tmp_path / "r.mcap", peer, max_batches=len(msgs), history=True)
        assert peer.replay_requests[0] == 0
    got = read_back(tmp_path / "r.mcap")
    assert [d for _, d in got] == [p for _, _, p in msgs]
    assert res.stats.history >= 30
    assert res.stats.gaps == res.stats.lost == 0


@pytest.mark.zmq
def test_without_history_a_late_subscriber_starts_mid_stream(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")
    with Peer(msgs, publish_before_wait=30) as peer:
        wait_published(peer, 30)
        res = record(tmp_path / "r.mcap", peer, max_batches=len(msgs) - 30)
    got = read_back(tmp_path / "r.mcap")
    assert [s for s, _ in got] == list(range(30, len(msgs)))
    assert res.stats.gaps == res.stats.lost == 0  # joining late is not a gap


@pytest.mark.zmq
def test_seq_frame_longer_than_8_bytes(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")
    with Peer(msgs, seq_width=24) as peer:
        res = record(tmp_path / "r.mcap", peer, max_batches=len(msgs))
    assert [s for s, _ in read_back(tmp_path / "r.mcap")] == list(range(len(msgs)))
    assert res.stats.malformed == 0


@pytest.mark.zmq
def test_undecodable_payload_is_written_raw(tmp_path: Path) -> None:
    payloads = [p for _, _, p in capture_messages("full_only")][:10]
    payloads[4] = b"\xc1 not msgpack"
    payloads[6] = b"\x92" * 100_000 + b"\xc0"  # nesting deep enough for RecursionError
    with Peer(payloads) as peer:
        res = record(tmp_path / "r.mcap", peer, max_batches=10)
    assert [d for _, d in read_back(tmp_path / "r.mcap")] == payloads
    assert res.stats.undecodable == 2


@pytest.mark.zmq
def test_topic_filter_and_topic_channel(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")[:20]
    with Peer(msgs, topic=b"kv@rank0") as peer:
        res = record(tmp_path / "r.mcap", peer, max_batches=20, topic="kv")
    with open_recording(tmp_path / "r.mcap") as r:
        (ch,) = r.channels.values()
        assert ch.topic == "kv@rank0"
        assert ch.name == f"{peer.endpoint}#kv@rank0"
        assert len(list(r.messages())) == 20
    assert res.ledger["channels"][0]["topic"] == "kv@rank0"  # type: ignore[index]


@pytest.mark.zmq
def test_malformed_messages_are_counted_not_fatal(tmp_path: Path) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    payloads = [p for _, _, p in capture_messages("full_only")][:5]
    ep = f"tcp://127.0.0.1:{port}"

    def publish() -> None:
        assert pub.poll(10_000)
        pub.recv()  # the subscription
        pub.send_multipart([b"", b"only two frames"])
        pub.send_multipart([b"", b"\x00\x01", b"seq too short"])
        for i, p in enumerate(payloads):
            pub.send_multipart([b"", i.to_bytes(8, "big"), p])

    t = threading.Thread(target=publish)
    t.start()
    try:
        res = Recorder(
            tmp_path / "r.mcap", [Source(ep)], max_batches=5, duration_ns=20 * SECOND
        ).run(handle_signals=False)
    finally:
        t.join()
        pub.close(linger=0)
        ctx.term()
    assert res.stats.malformed == 2
    assert [d for _, d in read_back(tmp_path / "r.mcap")] == payloads


def _consecutive_peers(msgs: list, n: int) -> list[Peer]:
    """Peers on ports P, P+1, … (and replay R, R+1, …), as vLLM's data-parallel ranks."""
    for _ in range(50):
        probe = zmq.Context()
        s = probe.socket(zmq.PUB)
        base = s.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=60000)
        s.close(linger=0)
        probe.term()
        peers: list[Peer] = []
        try:
            for rank in range(n):
                peers.append(
                    Peer(
                        msgs,
                        endpoint=f"tcp://127.0.0.1:{base + rank}",
                        replay=f"tcp://127.0.0.1:{base + 100 + rank}",
                    )
                )
            return peers
        except zmq.ZMQError:
            for p in peers:
                p.close()
    raise RuntimeError("no free consecutive ports")


@pytest.mark.zmq
def test_dp_size_subscribes_to_every_rank(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")
    peers = _consecutive_peers(msgs, 2)
    try:
        for p in peers:
            p.start()
        base = peers[0].endpoint
        res = capture(
            tmp_path / "r.mcap",
            [base],
            replay=[peers[0].replay_endpoint or ""],
            dp_size=2,
            max_batches=2 * len(msgs),
            duration_ns=20 * SECOND,
        )
    finally:
        for p in peers:
            p.close()
    chans = {c["endpoint"]: c for c in res.ledger["channels"]}  # type: ignore[union-attr]
    assert set(chans) == {p.endpoint for p in peers}
    assert sorted(c["dp_rank"] for c in chans.values()) == [0, 1]
    assert all(c["batches"] == len(msgs) for c in chans.values())
    with open_recording(tmp_path / "r.mcap") as r:
        ranks = {ch.endpoint: ch.dp_rank for ch in r.channels.values()}
        per: Counter[str] = Counter(m.channel.endpoint for m in r.messages())
    assert ranks == {peers[0].endpoint: 0, peers[1].endpoint: 1}
    assert set(per.values()) == {len(msgs)}


@pytest.mark.zmq
def test_many_endpoints_one_recording(tmp_path: Path) -> None:
    a_msgs, b_msgs = capture_messages("gemma3"), capture_messages("full_only")
    with Peer(a_msgs) as a, Peer(b_msgs) as b:
        res = Recorder(
            tmp_path / "r.mcap",
            [Source(a.endpoint, a.replay_endpoint), Source(b.endpoint, b.replay_endpoint)],
            max_batches=len(a_msgs) + len(b_msgs),
            duration_ns=20 * SECOND,
        ).run(handle_signals=False)
    assert res.stats.batches == len(a_msgs) + len(b_msgs)
    with open_recording(tmp_path / "r.mcap") as r:
        by: dict[str, list[bytes]] = {}
        for m in r.messages():
            by.setdefault(m.channel.endpoint, []).append(m.data)
    assert by[a.endpoint] == [p for _, _, p in a_msgs]
    assert by[b.endpoint] == [p for _, _, p in b_msgs]


@pytest.mark.zmq
def test_bind_mode_publisher_connects(tmp_path: Path) -> None:
    """--bind: the recorder binds, vLLM's publisher connects (its endpoint has no '*')."""
    ctx = zmq.Context()
    probe = ctx.socket(zmq.SUB)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(linger=0)
    ctx.term()
    ep = f"tcp://127.0.0.1:{port}"
    payloads = [p for _, _, p in capture_messages("full_only")][:20]

    def publish() -> None:
        c = zmq.Context()
        pub = c.socket(zmq.XPUB)
        pub.connect(ep)
        assert pub.poll(10_000)
        pub.recv()
        for i, p in enumerate(payloads):
            pub.send_multipart([b"", i.to_bytes(8, "big"), p])
        pub.close(linger=2000)
        c.term()

    t = threading.Thread(target=publish)
    t.start()
    try:
        res = capture(tmp_path / "r.mcap", [ep], bind=True, max_batches=20, duration_ns=20 * SECOND)
    finally:
        t.join()
    assert res.stats.batches == 20
    assert [d for _, d in read_back(tmp_path / "r.mcap")] == payloads


@pytest.mark.zmq
def test_stop_from_another_thread_closes_the_file(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")
    with Peer(msgs, rate=100) as peer:
        rec = Recorder(tmp_path / "r.mcap", [Source(peer.endpoint, peer.replay_endpoint)])
        threading.Timer(0.3, rec.stop).start()
        res = rec.run(handle_signals=False)
    assert res.stop_reason == "stopped"
    got = read_back(tmp_path / "r.mcap")
    assert 0 < len(got) <= len(msgs)
    assert [s for s, _ in got] == list(range(len(got)))


@pytest.mark.zmq
def test_bind_to_a_busy_port_is_an_endpoint_error(tmp_path: Path) -> None:
    ctx = zmq.Context()
    busy = ctx.socket(zmq.PUB)
    port = busy.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(EndpointError, match=rf"tcp://127.0.0.1:{port}: cannot bind"):
            capture(tmp_path / "r.mcap", [str(port)], bind=True, duration_ns=SECOND)
    finally:
        busy.close(linger=0)
        ctx.term()
    assert not (tmp_path / "r.mcap").exists()


RECORDINGS = Path(__file__).resolve().parent.parent / "recordings"
SAMPLES = {
    "gemma3": ("gemma3", True),
    "gemma3-legacy-group-idx": ("gemma3.legacy-array-group-idx", False),
    "full_only": ("full_only", True),
    "gemma3-byteshash": ("gemma3.byteshash", True),
    "full_only-legacy-initial": ("full_only.legacy-array-initial.signed", False),
}


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_sample_recordings_hold_the_captures(sample: str) -> None:
    name, with_groups = SAMPLES[sample]
    path = RECORDINGS / f"{sample}.mcap"
    assert path.stat().st_size < 1_000_000
    with open_recording(path) as r:
        got = [(m.seq, m.data) for m in r.messages()]
        assert r.recovery.complete
        groups = r.groups
        ledger = r.ledger
    assert got == [(s, p) for _, s, p in capture_messages(name)]
    assert groups == (capture_truth(name)["group_metadata"] if with_groups else None)
    assert ledger is not None and ledger["lost"] == 0
    assert_truth(path, name)


def test_sample_recording_with_gaps() -> None:
    with open_recording(RECORDINGS / "gemma3-gaps.mcap") as r:
        got = [(m.seq, m.data) for m in r.messages()]
        ledger = r.ledger
    assert got == [(s, p) for _, s, p in capture_messages("gemma3") if not 20 <= s <= 22]
    assert ledger is not None
    assert (ledger["recovered"], ledger["lost"], ledger["lost_ranges"]) == (9, 3, [[20, 22]])


@pytest.mark.zmq
def test_lost_tail_longer_than_the_replay_buffer_is_part_lost_part_recovered(
    tmp_path: Path,
) -> None:
    """The tail request asks from a seq the buffer no longer holds (bench finding, issue 5).

    The reply starts past what was asked: the seqs before it are lost (in the ledger),
    the rest are written; nothing is missing silently.
    """
    msgs = capture_messages("full_only")
    n = len(msgs)
    tail = set(range(n - 20, n))
    with Peer(msgs, drop=tail, buffer_steps=8) as peer:
        res = record(
            tmp_path / "r.mcap",
            peer,
            max_batches=n - 12,
            quiet_ns=SECOND // 5,
            duration_ns=5 * SECOND,
        )
    got = [s for s, _ in read_back(tmp_path / "r.mcap")]
    assert got == [*range(n - 20), *range(n - 8, n)]
    # Filed as soon as the quiet check's reply came back, not only at stop.
    assert res.stop_reason == "max_batches"
    assert (res.stats.recovered, res.stats.lost) == (8, 12)
    gaps = res.ledger["channels"][0]["gaps"]  # type: ignore[index]
    assert [r for g in gaps for r in g["lost_ranges"]] == [[n - 20, n - 9]]


@pytest.mark.parametrize("name", CAPTURES)
def test_issue10_5_event_count_from_the_header_matches_decoding(name: str) -> None:
    """The busy recorder counts events from the batch header: the same as decoding."""
    from kvtool.capture.stats import event_count as _event_count

    for _topic, seq, payload in capture_messages(name):
        n = _event_count(payload)
        assert n is None or n == len(decode_batch(payload, seq=seq).events)
