"""One endpoints module for record and publish: parsing, normalising and vLLM's DP-rank offset."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtool.endpoints import (
    Source,
    expand_endpoints,
    normalize_endpoint,
    offset_endpoint,
    parse_endpoint,
)
from kvtool.errors import EndpointError
from kvtool.publish import Publisher


@pytest.mark.parametrize(
    ("text", "bind", "want"),
    [
        ("5557", False, "tcp://127.0.0.1:5557"),
        (":5557", False, "tcp://127.0.0.1:5557"),
        ("localhost:6000", False, "tcp://localhost:6000"),
        ("tcp://gpu-7:5557", False, "tcp://gpu-7:5557"),
        ("tcp://[::1]:5557", False, "tcp://[::1]:5557"),
        ("tcp://127.0.0.1:05557", False, "tcp://127.0.0.1:5557"),
        ("tcp://*:5557", True, "tcp://*:5557"),
        ("tcp://127.0.0.1:*", True, "tcp://127.0.0.1:*"),
        (" ipc:///tmp/kv.sock ", False, "ipc:///tmp/kv.sock"),
        ("inproc://kv", False, "inproc://kv"),
    ],
)
def test_parse_endpoint(text: str, bind: bool, want: str) -> None:
    assert parse_endpoint(text, bind=bind) == want
    assert normalize_endpoint(text, bind=bind) == want


@pytest.mark.parametrize(
    ("text", "bind", "match"),
    [
        ("tcp://127.0.0.1", True, "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1:70000", True, "port 70000 is not in 1-65535"),
        ("0", True, "port 0 is not in 1-65535"),
        ("tcp://*:5557", False, "cannot connect to '\\*'"),
        ("tcp://127.0.0.1:*", False, "cannot connect to port '\\*'"),
        ("http://x:1", True, "not a ZeroMQ endpoint"),
        ("nonsense", True, "expected a port"),
        ("ipc://", True, "needs a name"),
        ("", True, "not a ZeroMQ endpoint"),
    ],
)
def test_parse_endpoint_rejects(text: str, bind: bool, match: str) -> None:
    with pytest.raises(EndpointError, match=match):
        parse_endpoint(text, bind=bind)


def test_parse_endpoint_error_escapes_control_characters() -> None:
    with pytest.raises(EndpointError, match="contains control characters") as info:
        parse_endpoint("ipc:///tmp/\x1b[2Jkv")
    assert "\x1b" not in str(info.value)
    assert "ipc:///tmp/\\x1b[2Jkv" in str(info.value)


def test_issue9_4_offset_follows_vllm_offset_endpoint_port() -> None:
    """vLLM: rank 0 unchanged; tcp port + rank; inproc gets _dp{rank}; ipc refused past 0."""
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 3) == "tcp://127.0.0.1:5560"
    assert offset_endpoint("tcp://*:5557", 1) == "tcp://*:5558"
    assert offset_endpoint("inproc://kv", 0) == "inproc://kv"
    assert offset_endpoint("inproc://kv", 1) == "inproc://kv_dp1"
    # Rank 0 of an ipc path is the path itself (capture used to say ipc:///tmp/kv_dp0).
    assert offset_endpoint("ipc:///tmp/kv", 0) == "ipc:///tmp/kv"
    with pytest.raises(EndpointError, match="no ipc endpoint"):
        offset_endpoint("ipc:///tmp/kv", 1)
    with pytest.raises(EndpointError, match="exceeds 65535"):
        offset_endpoint("tcp://h:65535", 1)


def _publisher_endpoints(base: str, n: int) -> list[str]:
    """Where ``replay --publish base`` puts the first ``n`` channels (connecting: no peer)."""
    with Publisher(base, connect=not base.startswith("inproc://")) as pub:
        return [pub.channel(i).stats.endpoint for i in range(n)]


@pytest.mark.zmq
@pytest.mark.parametrize("base", ["tcp://127.0.0.1:5557", "inproc://kv", "ipc:///tmp/kvtool-ep"])
def test_issue9_4_record_and_publish_agree_on_every_rank(base: str) -> None:
    """`record --dp-size` and `replay --publish` give rank n the same endpoint."""
    ranks = 1 if base.startswith("ipc://") else 3
    recorded = [s.endpoint for s in expand_endpoints([base], dp_size=ranks)]
    assert recorded == _publisher_endpoints(base, ranks)
    assert recorded[0] == base


@pytest.mark.zmq
def test_issue9_4_ipc_second_rank_refused_by_both(tmp_path: Path) -> None:
    base = f"ipc://{tmp_path}/kv"
    with pytest.raises(EndpointError, match="no ipc endpoint"):
        expand_endpoints([base], dp_size=2)
    with Publisher(base) as pub:
        pub.channel(0)
        with pytest.raises(EndpointError, match="vLLM gives ipc endpoints no rank offset"):
            pub.channel(1)


def test_expand_endpoints_dp_size() -> None:
    got = expand_endpoints(["5557"], replay=["5600"], dp_size=3)
    assert got == [
        Source("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5600", 0),
        Source("tcp://127.0.0.1:5558", "tcp://127.0.0.1:5601", 1),
        Source("tcp://127.0.0.1:5559", "tcp://127.0.0.1:5602", 2),
    ]
    with pytest.raises(EndpointError, match="one --replay per endpoint"):
        expand_endpoints(["5557", "5558"], replay=["5600"])
    with pytest.raises(EndpointError, match="given twice"):
        expand_endpoints(["5557", "tcp://127.0.0.1:5557"])
    with pytest.raises(EndpointError, match="given twice"):
        expand_endpoints(["5557", "5558"], dp_size=2)
    with pytest.raises(EndpointError, match="no endpoint given"):
        expand_endpoints([])


ARABIC_5557 = "\u0665\u0665\u0665\u0667"
FULLWIDTH_5557 = "\uff15\uff15\uff15\uff17"


@pytest.mark.parametrize(
    "text",
    [
        ARABIC_5557,
        FULLWIDTH_5557,
        f"tcp://127.0.0.1:{FULLWIDTH_5557}",
        f"h:{ARABIC_5557}",
        "[\u0127]:5557",
    ],
)
def test_endpoint_digits_and_names_are_ascii(text: str) -> None:
    """Other scripts' digits used to become port 5557 silently (Python's \\d is Unicode)."""
    with pytest.raises(EndpointError):
        parse_endpoint(text, bind=False)


def test_replay_endpoint_that_is_a_publisher_endpoint_is_refused() -> None:
    """--dp-size 2 --replay at port + 1: rank 1 publishes where rank 0 replays. Accepted
    before, the recorder subscribed to a ROUTER and sent replay requests to a PUB."""
    with pytest.raises(EndpointError, match=r"tcp://127.0.0.1:5558 \(rank 0\) is also a publisher"):
        expand_endpoints(["5557"], replay=["5558"], dp_size=2)
    with pytest.raises(EndpointError, match="is also a publisher endpoint"):
        expand_endpoints(["5557", "5558"], replay=["5558", "5600"])
    with pytest.raises(EndpointError, match=r"replay endpoint tcp://127\.0\.0\.1:5600 given twice"):
        expand_endpoints(["5557", "5558"], replay=["5600", "5600"])
    assert len(expand_endpoints(["5557"], replay=["5560"], dp_size=2)) == 2


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("tcp://127.0.0.1", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1:70000", "port 70000 is not in 1-65535"),
        ("tcp://*:5557", "cannot connect to '\\*'"),
        ("http://x:1", "not a ZeroMQ endpoint"),
        ("ipc://", "needs a name"),
        ("", "not a ZeroMQ endpoint"),
    ],
)
def test_normalize_endpoint_rejects(text: str, match: str) -> None:
    with pytest.raises(EndpointError, match=match):
        normalize_endpoint(text)
