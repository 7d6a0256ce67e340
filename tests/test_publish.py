"""Re-publishing: endpoints, vLLM framing on loopback, wire annotation, the replay ROUTER."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvtool.annotate import groups_from_list, parse_group_flags
from kvtool.cli import app
from kvtool.endpoints import offset_endpoint, parse_endpoint
from kvtool.errors import EndpointError
from kvtool.pacing import Pacing, PublishItem, publish
from kvtool.protocol import decode_batch, event_to_builtins
from kvtool.publish import END_SEQ, Publisher
from kvtool.wire import annotate_payload
from tests.conftest import CAPTURES, capture_messages, capture_truth
from tests.replayutil import capture_recording, strip_payload

ANY_PORT = "tcp://127.0.0.1:*"


# -- endpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("5557", "tcp://127.0.0.1:5557"),
        (":5557", "tcp://127.0.0.1:5557"),
        ("localhost:6000", "tcp://localhost:6000"),
        ("tcp://*:5557", "tcp://*:5557"),
        ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"),
        ("ipc:///tmp/kv.sock", "ipc:///tmp/kv.sock"),
    ],
)
def test_parse_endpoint_bare_port_binds_loopback(text: str, endpoint: str) -> None:
    assert parse_endpoint(text) == endpoint


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0", "not in 1-65535"),
        ("70000", "not in 1-65535"),
        ("tcp://host", "tcp://HOST:PORT"),
        ("nonsense", "expected a port"),
    ],
)
def test_parse_endpoint_rejects(text: str, match: str) -> None:
    with pytest.raises(EndpointError, match=match):
        parse_endpoint(text)


def test_offset_endpoint_like_vllm_ranks() -> None:
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint("ipc:///tmp/kv", 0) == "ipc:///tmp/kv"


# -- wire annotation ----------------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
def test_annotate_payload_restores_vllm_bytes(name: str) -> None:
    """Stripping kind/window and annotating on the wire gives vLLM's own bytes back."""
    table = groups_from_list(capture_truth(name)["group_metadata"], source="truth")
    for _topic, _seq, payload in capture_messages(name):
        again, bad = annotate_payload(strip_payload(payload), table)
        assert bad == []
        if name != "gemma3.legacy-array-group-idx":
            assert again == payload


def test_annotate_payload_group_idx_layout_becomes_last_array_layout() -> None:
    """Array events carrying group_idx but no kinds become vLLM's 12-element layout."""
    table = groups_from_list(capture_truth("gemma3")["group_metadata"], source="truth")
    older = capture_messages("gemma3.legacy-array-group-idx")
    newer = capture_messages("gemma3.legacy-array-spec-kind")
    for (_, _, old), (_, _, new) in zip(older, newer, strict=True):
        assert annotate_payload(old, table)[0] == new


def test_annotate_payload_keeps_map_and_array_layout() -> None:
    table = parse_group_flags(["0=full_attention", "1=sliding_window:32"])
    for name, enc in (("gemma3", "map"), ("gemma3.legacy-array-spec-kind", "array")):
        for _, _, payload in capture_messages(name)[:5]:
            out, bad = annotate_payload(payload, table)
            assert sorted(set(bad)) in ([], [2, 3, 4, 5])
            batch = decode_batch(out)
            assert batch.event_encoding == enc
            for ev in batch.events:
                if type(ev).__name__.endswith("BlockStored") and ev.group_idx == 1:
                    assert ev.kv_cache_spec_sliding_window == 32


def test_annotate_payload_overwrites_and_omits_none_window_in_maps() -> None:
    """A full-attention group overwrites a stale window; maps omit the None window key."""
    ev = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [1, 2],
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "sliding_window",
        "kv_cache_spec_sliding_window": 64,
    }
    payload = msgspec.msgpack.encode([1.0, [ev], 0])
    out, _ = annotate_payload(payload, parse_group_flags(["0=full_attention"]))
    got = msgspec.msgpack.decode(out)[1][0]
    assert got["kv_cache_spec_kind"] == "full_attention"
    assert "kv_cache_spec_sliding_window" not in got
    assert list(got)[-1] == "kv_cache_spec_kind"


def test_annotate_payload_leaves_garbage_alone() -> None:
    table = parse_group_flags(["0=full_attention"])
    assert annotate_payload(b"\xc1garbage", table) == (b"\xc1garbage", [])
    assert annotate_payload(msgspec.msgpack.encode([1.0]), table)[1] == []


# -- sockets ------------------------------------------------------------------------------


def _sub(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def _recv_all(sub: zmq.Socket, n: int, timeout_ms: int = 5000) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    while len(got) < n and sub.poll(timeout_ms):
        got.append(sub.recv_multipart())
    return got


def _items(msgs: list[tuple[bytes, int, bytes]]) -> list[PublishItem]:
    return [PublishItem("ch", t, s, p, 1_000 * i) for i, (t, s, p) in enumerate(msgs)]


@pytest.mark.zmq
@pytest.mark.parametrize("name", ["gemma3", "full_only.legacy-array-initial.signed"])
def test_publish_subscribe_byte_identical(name: str) -> None:
    msgs = capture_messages(name)
    ctx = zmq.Context()
    try:
        with Publisher(ANY_PORT) as pub:
            sub = _sub(ctx, pub.first.stats.endpoint)
            try:
                stats = publish(
                    pub,
                    lambda: _items(msgs),
                    pacing=Pacing(max_speed=True),
                    wait_subscribers=1,
                    wait_timeout_s=5,
                )
                got = _recv_all(sub, len(msgs))
            finally:
                sub.close(linger=0)
    finally:
        ctx.term()
    assert stats.sent == len(msgs)
    assert got == [[t, s.to_bytes(8, "big"), p] for t, s, p in msgs]


@pytest.mark.zmq
def test_publish_renumber_and_loop() -> None:
    msgs = capture_messages("full_only")[:5]
    msgs = [(t, s + 100, p) for t, s, p in msgs]
    ctx = zmq.Context()
    try:
        with Publisher(ANY_PORT) as pub:
            sub = _sub(ctx, pub.first.stats.endpoint)
            try:
                stats = publish(
                    pub,
                    lambda: _items(msgs),
                    pacing=Pacing(max_speed=True),
                    loops=2,
                    renumber=True,
                    wait_subscribers=1,
                    wait_timeout_s=5,
                )
                got = _recv_all(sub, 10)
            finally:
                sub.close(linger=0)
    finally:
        ctx.term()
    assert stats.loops == 2
    assert [int.from_bytes(f[1], "big") for f in got] == list(range(10))
    assert [f[2] for f in got] == [p for _, _, p in msgs] * 2


@pytest.mark.zmq
def test_publish_paces_by_rate() -> None:
    msgs = capture_messages("full_only")[:6]
    with Publisher(ANY_PORT) as pub:
        t = time.monotonic()
        stats = publish(pub, lambda: _items(msgs), pacing=Pacing(rate=50))
        took = time.monotonic() - t
    assert stats.sent == 6
    assert took >= 5 / 50 * 0.9


def _replay_request(endpoint: str, start: int, legacy: bool) -> list[list[bytes]]:
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replies = []
        while dealer.poll(5000):
            frames = dealer.recv_multipart()
            replies.append(frames)
            seq_frame = frames[1] if legacy else frames[2]
            if seq_frame == END_SEQ:
                break
        return replies
    finally:
        dealer.close(linger=0)
        ctx.term()


@pytest.mark.zmq
@pytest.mark.parametrize("legacy", [False, True], ids=["since-0.26", "legacy"])
def test_replay_router_answers_both_layouts(legacy: bool) -> None:
    msgs = capture_messages("gemma3")[:20]
    with Publisher(ANY_PORT, "tcp://127.0.0.1:*", legacy_replay=legacy, buffer_steps=8) as pub:
        publish(pub, lambda: _items(msgs), pacing=Pacing(max_speed=True))
        endpoint = pub.first.stats.replay_endpoint
        assert endpoint is not None
        result: list[list[list[bytes]]] = []
        client = threading.Thread(
            target=lambda: result.append(_replay_request(endpoint, 15, legacy))
        )
        client.start()
        deadline = time.monotonic() + 5
        while client.is_alive() and time.monotonic() < deadline:
            pub.service(50)
        client.join(5)
    replies = result[0]
    want = msgs[15:]
    if legacy:
        assert replies[:-1] == [[b"", s.to_bytes(8, "big"), p] for _, s, p in want]
        assert replies[-1] == [b"", END_SEQ, b""]
    else:
        assert replies[:-1] == [[b"", t, s.to_bytes(8, "big"), p] for t, s, p in want]
        assert replies[-1] == [b"", b"", END_SEQ, b""]
    # Older than the buffer (8 batches kept of 20): only what is kept comes back.
    assert [int.from_bytes(r[-2], "big") for r in replies[:-1]] == [15, 16, 17, 18, 19]


@pytest.mark.zmq
def test_wait_subscribers_times_out_with_a_clear_message() -> None:
    with Publisher(ANY_PORT) as pub, pytest.raises(EndpointError, match="0 of 1 subscriber"):
        publish(
            pub, lambda: [], pacing=Pacing(max_speed=True), wait_subscribers=1, wait_timeout_s=0.2
        )


@pytest.mark.zmq
def test_bind_conflict_is_an_endpoint_error() -> None:
    with Publisher(ANY_PORT) as pub:
        taken = pub.first.stats.endpoint
        with pytest.raises(EndpointError, match="cannot bind"):
            Publisher(taken)


# -- the command ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli_publish(rec: Path, port: int, n: int, *extra: str) -> tuple[object, list[list[bytes]]]:
    """Run ``kvtool replay REC [extra] --publish PORT --max-speed`` into a test SUB."""
    args = [
        "replay",
        str(rec),
        *extra,
        "--publish",
        str(port),
        "--max-speed",
        "--wait-subscribers",
        "1",
        "--wait-timeout",
        "10",
        "--hold",
        "0",
    ]
    ctx = zmq.Context()
    sub = _sub(ctx, f"tcp://127.0.0.1:{port}")
    got: list[list[bytes]] = []
    t = threading.Thread(target=lambda: got.extend(_recv_all(sub, n, 10000)))
    t.start()
    try:
        result = CliRunner().invoke(app, args)
    finally:
        t.join(15)
        sub.close(linger=0)
        ctx.term()
    return result, got


@pytest.mark.zmq
def test_cli_publish_unchanged_bytes(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")
    msgs = capture_messages("gemma3")
    port = _free_port()
    result, got = _cli_publish(rec, port, len(msgs))
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    assert result.stdout == ""  # type: ignore[attr-defined]
    assert f"publishing on tcp://127.0.0.1:{port}" in result.stderr  # type: ignore[attr-defined]
    assert got == [[t, s.to_bytes(8, "big"), p] for t, s, p in msgs]


@pytest.mark.zmq
def test_cli_publish_annotated_keeps_layout(tmp_path: Path) -> None:
    """--annotate --publish of a stripped recording sends vLLM's annotated bytes."""
    name = "gemma3.legacy-array-spec-kind"
    rec = capture_recording(tmp_path, name, strip=True)
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps(capture_truth(name)["group_metadata"]))
    msgs = capture_messages(name)
    port = _free_port()
    result, got = _cli_publish(rec, port, len(msgs), "--annotate", "--groups", str(groups))
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    assert [f[2] for f in got] == [p for _, _, p in msgs]
    events = [event_to_builtins(e) for f in got for e in decode_batch(f[2]).events]
    assert all(e["kv_cache_spec_kind"] for e in events if e["type"] == "BlockStored")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--replay-endpoint", "5558"], "--replay-endpoint needs --publish"),
        (["--publish", "5557", "--speed", "2", "--rate", "5"], "only one of"),
        (["--publish", "5557", "--speed", "fast"], "--speed 'fast': expected a number"),
        (["--publish", "5557", "--loop", "0"], "--loop '0': must be > 0"),
        (["--publish", "99999"], "not in 1-65535"),
    ],
)
def test_cli_publish_bad_flags_one_line_exit_2(tmp_path: Path, args: list[str], match: str) -> None:
    rec = capture_recording(tmp_path, "full_only")
    result = CliRunner().invoke(app, ["replay", str(rec), *args])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert match in result.stderr


# -- round trip: kvtool replay --publish -> kvtool record ------------------------------------


@pytest.mark.zmq
@pytest.mark.parametrize("legacy", [False, True], ids=["since-0.26", "legacy"])
def test_replay_publish_into_record_is_byte_identical(tmp_path: Path, legacy: bool) -> None:
    """replay --publish --replay-endpoint into the recorder gives the same payloads back,
    including batches the recorder had to fetch from the replay socket (--drop)."""
    from kvtool.capture import Recorder, Source
    from kvtool.recording import open_recording

    name = "gemma3"
    rec = capture_recording(tmp_path, name)
    msgs = capture_messages(name)
    port, rport = _free_port(), _free_port()
    out = tmp_path / "again.mcap"
    recorder = Recorder(
        out,
        [Source(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}")],
        max_batches=len(msgs),
        duration_ns=20_000_000_000,
    )
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(recorder.run(handle_signals=False)))
    thread.start()
    try:
        args = [
            "replay",
            str(rec),
            "--publish",
            str(port),
            "--replay-endpoint",
            str(rport),
            "--speed",
            "20",
            "--wait-subscribers",
            "1",
            "--wait-timeout",
            "10",
            "--drop",
            "5,9,30:32",
            "--hold",
            "1",
        ]
        if legacy:
            args.append("--legacy-replay")
        result = CliRunner().invoke(app, args)
    finally:
        recorder.stop()
        thread.join(20)
    assert result.exit_code == 0, result.stderr
    assert "replay requests" in result.stderr
    with open_recording(out) as r:
        got = [(m.seq, m.data) for m in r.messages()]
        ledger = r.ledger
    assert got == [(s, p) for _, s, p in msgs]
    assert ledger is not None
    assert ledger["recovered"] == 5 and ledger["lost"] == 0


@pytest.mark.zmq
def test_ctrl_c_stops_publishing_cleanly(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    rec = capture_recording(tmp_path, "full_only")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtool",
            "replay",
            str(rec),
            "--publish",
            "tcp://127.0.0.1:*",
            "--loop",
            "forever",
            "--rate",
            "200",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("kvtool: publishing on tcp://127.0.0.1:")
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    assert out == ""
    assert err.startswith("kvtool: interrupted after ")
    assert "Traceback" not in err


def test_annotate_payload_map_encoded_batch() -> None:
    """The development revision with a map-encoded batch stays a map."""
    ev = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "group_idx": 1}
    payload = msgspec.msgpack.encode({"ts": 1.0, "events": [ev], "data_parallel_rank": None})
    out, bad = annotate_payload(payload, parse_group_flags(["0=full_attention", "1=mamba"]))
    assert bad == []
    got = msgspec.msgpack.decode(out)
    assert isinstance(got, dict) and got["ts"] == 1.0
    assert got["events"][0]["kv_cache_spec_kind"] == "mamba"
    assert decode_batch(out).batch_encoding == "map"


_FUZZ_TABLE = parse_group_flags(["0=full_attention", "1=sliding_window:64", "2=mamba"])
_REAL = [p for _, _, p in capture_messages("gemma3")[:8]] + [
    p for _, _, p in capture_messages("gemma3.legacy-array-group-idx")[:8]
]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_annotate_payload_never_raises_on_garbage(data: bytes) -> None:
    out, bad = annotate_payload(data, _FUZZ_TABLE)
    assert isinstance(out, bytes) and isinstance(bad, list)


@settings(max_examples=200, deadline=None)
@given(
    which=st.integers(0, len(_REAL) - 1),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_annotate_payload_never_raises_on_flipped_real_payloads(
    which: int, flips: list[tuple[int, int]]
) -> None:
    buf = bytearray(_REAL[which])
    for pos, val in flips:
        buf[pos % len(buf)] = val
    out, _ = annotate_payload(bytes(buf), _FUZZ_TABLE)
    assert isinstance(out, bytes)


def test_annotate_payload_deep_nesting() -> None:
    deep = b"\x93\xcb" + b"\x00" * 8 + b"\x91" * 100_000 + b"\xc0" + b"\x00"
    assert annotate_payload(deep, _FUZZ_TABLE)[0] == deep


def _free_port_pair() -> int:
    """A port p with p and p + 1 free on loopback (rank 0 and rank 1)."""
    for _ in range(50):
        p = _free_port()
        if p >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two consecutive free ports")


@pytest.mark.zmq
def test_several_channels_publish_on_offset_endpoints() -> None:
    """Two recorded engines go out on port and port + 1, as vLLM offsets ranks."""
    port = _free_port_pair()
    base = f"tcp://127.0.0.1:{port}"
    a = capture_messages("full_only")[:3]
    b = capture_messages("gemma3")[:3]
    items = [PublishItem("a", t, s, p, i) for i, (t, s, p) in enumerate(a)] + [
        PublishItem("b", t, s, p, 10 + i) for i, (t, s, p) in enumerate(b)
    ]
    ctx = zmq.Context()
    try:
        with Publisher(base) as pub:
            sa = _sub(ctx, base)
            sb = _sub(ctx, offset_endpoint(base, 1))
            try:
                pub.wait_subscribers(pub.channel("a"), 1, 5)
                pub.wait_subscribers(pub.channel("b"), 1, 5)
                publish(pub, lambda: items, pacing=Pacing(max_speed=True))
                got_a = _recv_all(sa, 3)
                got_b = _recv_all(sb, 3)
            finally:
                sa.close(linger=0)
                sb.close(linger=0)
            assert [c.endpoint for c in pub.stats] == [base, f"tcp://127.0.0.1:{port + 1}"]
    finally:
        ctx.term()
    assert [f[2] for f in got_a] == [p for _, _, p in a]
    assert [f[2] for f in got_b] == [p for _, _, p in b]


@pytest.mark.zmq
def test_issue9_4_second_channel_on_ipc_is_refused_as_vllm_refuses_it(tmp_path: Path) -> None:
    """vLLM gives no ipc endpoint to rank 1; neither does the publisher (one clear line)."""
    base = f"ipc://{tmp_path}/kv"
    with Publisher(base) as pub:
        assert pub.channel("a").stats.endpoint == base
        with pytest.raises(EndpointError, match="select one channel with --channel"):
            pub.channel("b")


@pytest.mark.zmq
def test_cli_publish_connect_to_a_binding_subscriber(tmp_path: Path) -> None:
    """--connect feeds a subscriber that binds (as a KV-cache indexer does)."""
    rec = capture_recording(tmp_path, "full_only")
    msgs = capture_messages("full_only")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    got: list[list[bytes]] = []
    t = threading.Thread(target=lambda: got.extend(_recv_all(sub, len(msgs), 10000)))
    t.start()
    try:
        result = CliRunner().invoke(
            app,
            [
                "replay",
                str(rec),
                "--publish",
                f"tcp://127.0.0.1:{port}",
                "--connect",
                "--max-speed",
                "--wait-subscribers",
                "1",
                "--wait-timeout",
                "10",
            ],
        )
    finally:
        t.join(15)
        sub.close(linger=0)
        ctx.term()
    assert result.exit_code == 0, result.stderr
    assert f"publishing to tcp://127.0.0.1:{port}" in result.stderr
    assert got == [[tp, s.to_bytes(8, "big"), p] for tp, s, p in msgs]


# -- bounded replay (issue 8.12) -------------------------------------------------------------


@pytest.mark.zmq
def test_issue8_12_replay_peer_that_asks_and_never_reads_stays_bounded() -> None:
    """A DEALER spamming replay requests without reading gets a bounded queue, not GBs.

    Each request asks for 200 batches of 64 KiB (12.5 MiB); the old ROUTER (SNDHWM 0)
    queued every reply in full. Now the peer has at most MAX_REPLAY_REQUESTS_PER_PEER
    requests accepted, the rest are refused, and less than one reply is handed to ZeroMQ.
    """
    from kvtool.publish import MAX_REPLAY_REQUESTS_PER_PEER

    payload = b"x" * 65_536
    spam = 50
    with Publisher(ANY_PORT, "tcp://127.0.0.1:*", buffer_steps=200, replay_sndhwm=8) as pub:
        for seq in range(200):
            pub.first.send(b"", seq, payload)
        ch = pub.first
        assert ch.stats.replay_endpoint is not None
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, 1)
            dealer.setsockopt(zmq.RCVBUF, 4096)  # a small kernel window: the peer never reads
            dealer.connect(ch.stats.replay_endpoint)
            for _ in range(spam):
                dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            deadline = time.monotonic() + 10  # a guard against hanging, not an assertion
            while ch.stats.replay_requests + ch.stats.replay_refused < spam:
                assert time.monotonic() < deadline, ch.stats
                pub.service(20)
            for _ in range(5):
                pub.service(0)
        finally:
            dealer.close(linger=0)
            ctx.term()
        assert ch.stats.replay_requests == MAX_REPLAY_REQUESTS_PER_PEER
        assert ch.stats.replay_refused == spam - MAX_REPLAY_REQUESTS_PER_PEER
        assert ch.stats.replayed < 200  # not even one full reply is queued
        assert ch.replies_pending == MAX_REPLAY_REQUESTS_PER_PEER


@pytest.mark.zmq
def test_issue8_12_bounded_router_still_streams_whole_replies_to_a_reader() -> None:
    """A send queue of 2 messages still delivers a 50-batch reply, in order, then the end."""
    msgs = capture_messages("gemma3")[:50]
    with Publisher(ANY_PORT, "tcp://127.0.0.1:*", buffer_steps=100, replay_sndhwm=2) as pub:
        publish(pub, lambda: _items(msgs), pacing=Pacing(max_speed=True))
        endpoint = pub.first.stats.replay_endpoint
        assert endpoint is not None
        result: list[list[list[bytes]]] = []
        client = threading.Thread(target=lambda: result.append(_replay_request(endpoint, 0, False)))
        client.start()
        deadline = time.monotonic() + 10
        while client.is_alive() and time.monotonic() < deadline:
            pub.service(20)
        client.join(5)
        assert pub.first.replies_pending == 0
    replies = result[0]
    assert replies[:-1] == [[b"", t, s.to_bytes(8, "big"), p] for t, s, p in msgs]
    assert replies[-1] == [b"", b"", END_SEQ, b""]


# -- publishing a recording as a library call (issue 9.7) ----------------------------------


@pytest.mark.zmq
def test_issue9_7_publish_recording_library_call(tmp_path: Path) -> None:
    from kvtool.pacing import publish_recording
    from kvtool.replay import Replay

    rec = capture_recording(tmp_path, "gemma3")
    msgs = capture_messages("gemma3")
    port = _free_port()
    ctx = zmq.Context()
    sub = _sub(ctx, f"tcp://127.0.0.1:{port}")
    got: list[list[bytes]] = []
    seen: list[int] = []
    t = threading.Thread(target=lambda: got.extend(_recv_all(sub, len(msgs), 10000)))
    t.start()
    try:
        with Replay([rec]) as rp:
            result = publish_recording(
                rp,
                f"tcp://127.0.0.1:{port}",
                pacing=Pacing(max_speed=True),
                wait_subscribers=1,
                wait_timeout_s=10,
                on_batch=lambda item, loop: seen.append(loop),
            )
    finally:
        t.join(15)
        sub.close(linger=0)
        ctx.term()
    assert got == [[t, s.to_bytes(8, "big"), p] for t, s, p in msgs]
    assert result.stats.sent == len(msgs) and seen == [0] * len(msgs)
    assert result.endpoint == f"tcp://127.0.0.1:{port}"
    assert result.max_subscribers == 1 and not result.unheard
    assert [c.sent for c in result.channels] == [len(msgs)]


# -- publishing to nobody (issue 11.9) ----------------------------------------------------


@pytest.mark.zmq
def test_issue11_9_publish_to_nobody_warns(tmp_path: Path) -> None:
    from kvtool.pacing import publish_recording
    from kvtool.replay import Replay

    rec = capture_recording(tmp_path, "full_only")
    with Replay([rec]) as rp:
        result = publish_recording(rp, ANY_PORT, pacing=Pacing(max_speed=True))
    assert result.stats.sent > 0 and result.unheard
    res = CliRunner().invoke(
        app, ["replay", str(rec), "--publish", str(_free_port()), "--max-speed"]
    )
    assert res.exit_code == 0, res.stderr
    warning = res.stderr.strip().splitlines()[-1]
    assert warning.startswith("kvtool: warning: no subscriber was connected to tcp://127.0.0.1:")
    assert "--wait-subscribers 1" in warning


@pytest.mark.zmq
def test_issue11_9_no_warning_when_a_subscriber_listened(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "full_only")
    port = _free_port()
    result, got = _cli_publish(rec, port, len(capture_messages("full_only")))
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    assert got
    assert "no subscriber" not in result.stderr  # type: ignore[attr-defined]
