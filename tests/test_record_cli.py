"""`kvtool record` on the command line: exit statuses, one-line errors, summary, overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingWriter, open_recording
from tests.conftest import capture_messages, capture_truth
from tests.peer import Peer
from tests.test_live_faults import free_port

runner = CliRunner()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.zmq
def test_record_summary_and_exit_0(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")
    out = tmp_path / "run.mcap"
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps(capture_truth("gemma3")["group_metadata"]))
    with Peer(msgs, drop={7}) as peer:
        res = runner.invoke(
            app,
            [
                "record",
                peer.endpoint,
                "--replay",
                peer.replay_endpoint or "",
                "-o",
                str(out),
                "--max-batches",
                str(len(msgs)),
                "--duration",
                "20s",
                "--groups",
                str(groups),
            ],
        )
    assert res.exit_code == 0, res.stderr
    assert res.stdout == ""
    line = one_line(res.stderr)
    assert line.startswith(f"{out}: 0 lost, 1 gap (1 recovered); 64 batches, 1,925 events, ")
    assert line.endswith("(max_batches)")
    with open_recording(out) as r:
        assert [m.data for m in r.messages()] == [p for _, _, p in msgs]
        assert r.groups == capture_truth("gemma3")["group_metadata"]
        assert r.context["endpoints"] == [peer.endpoint]


@pytest.mark.zmq
def test_quiet_prints_nothing(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")
    with Peer(msgs) as peer:
        res = runner.invoke(
            app,
            ["record", peer.endpoint, "-o", str(tmp_path / "r.mcap"), "-q", "-n", str(len(msgs))],
        )
    assert (res.exit_code, res.stdout, res.stderr) == (0, "", "")


@pytest.mark.zmq
def test_lost_batches_exit_3(tmp_path: Path) -> None:
    msgs = capture_messages("full_only")
    with Peer(msgs, drop={10, 11}, replay=False) as peer:
        res = runner.invoke(
            app,
            ["record", peer.endpoint, "-o", str(tmp_path / "r.mcap"), "-n", str(len(msgs) - 2)],
        )
    assert res.exit_code == 3, res.stderr
    summary, lost = res.stderr.strip().splitlines()
    assert "2 lost" in summary
    # The words `info` says of the file (issue 19: one wording of "lost while recording").
    out = tmp_path / "r.mcap"
    said = f"{out}: 2 batches were lost while recording (seq 10-11); counts miss their events"
    assert lost == f"kvtool: {said}"


@pytest.mark.zmq
def test_a_stray_batch_is_said_and_exits_3(tmp_path: Path) -> None:
    # Seq 12 again after 30 (a second publisher on the topic, or a peer resending): the
    # recording stays in seq order without it, and the run does not end as a clean one.
    msgs = capture_messages("full_only")
    with Peer(msgs, stray=[(30, 12)]) as peer:
        res = runner.invoke(
            app,
            ["record", peer.endpoint, "-o", str(tmp_path / "r.mcap"), "-n", str(len(msgs))],
        )
    assert res.exit_code == 3, res.stderr
    summary, stray = res.stderr.strip().splitlines()
    assert summary.startswith(f"{tmp_path / 'r.mcap'}: 0 lost, 0 gaps; ")
    assert "1 stray batch dropped" in summary
    assert stray.startswith("kvtool: 1 live batch arrived behind the stream and was dropped")
    with open_recording(tmp_path / "r.mcap") as r:
        assert [m.data for m in r.messages()] == [p for _, _, p in msgs]


@pytest.mark.zmq
def test_publisher_never_comes_up_exit_1(tmp_path: Path) -> None:
    port = free_port()
    res = runner.invoke(
        app,
        ["record", str(port), "-o", str(tmp_path / "r.mcap"), "--connect-timeout", "0.3s"],
    )
    assert res.exit_code == 1
    line = one_line(res.stderr)
    assert line.startswith(
        "kvtool: no connection and no batch within 0.3s: never reached a "
        f"publisher at tcp://127.0.0.1:{port};"
    )
    assert not (tmp_path / "r.mcap").exists()


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    out.write_bytes(b"precious")
    res = runner.invoke(app, ["record", "5557", "-o", str(out)])
    assert res.exit_code == 2
    assert one_line(res.stderr) == f"kvtool: {out}: file exists; pass --force to overwrite it"
    assert out.read_bytes() == b"precious"


@pytest.mark.zmq
def test_force_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    out.write_bytes(b"old")  # any regular file (issue 24: never decided from contents)
    msgs = capture_messages("full_only")[:5]
    with Peer(msgs) as peer:
        res = runner.invoke(
            app, ["record", peer.endpoint, "-o", str(out), "--force", "-q", "-n", "5"]
        )
    assert res.exit_code == 0, res.stderr
    with open_recording(out) as r:
        assert [m.data for m in r.messages()] == [p for _t, _s, p in msgs]
    # The new recording was written beside the old one and moved into place: no
    # temporary is left (test_force_keeps_the_old_recording_until_a_batch_arrives).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.mcap"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tcp://127.0.0.1"], "kvtool: endpoint 'tcp://127.0.0.1': expected tcp://HOST:PORT"),
        (["http://x:1"], "kvtool: endpoint 'http://x:1': not a ZeroMQ endpoint"),
        (["tcp://*:5557"], "kvtool: endpoint 'tcp://*:5557': cannot connect to '*'"),
        (["5557", "5558", "--replay", "5600"], "kvtool: 1 replay endpoints for 2 endpoints"),
        (["5557", "--duration", "soon"], "kvtool: --duration: 'soon' is not a duration"),
        (["5557", "--connect-timeout", "x"], "kvtool: --connect-timeout: 'x' is not a duration"),
    ],
)
def test_usage_errors_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "r.mcap"
    res = runner.invoke(app, ["record", *args, "-o", str(out)])
    assert res.exit_code == 2
    assert one_line(res.stderr).startswith(message)
    assert res.stdout == ""
    assert not out.exists()


def test_unwritable_paths_exit_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["record", "5557", "-o", str(tmp_path / "no" / "such" / "r.mcap")])
    assert res.exit_code == 2
    assert one_line(res.stderr) == (
        f"kvtool: {tmp_path / 'no' / 'such' / 'r.mcap'}: directory "
        f"{tmp_path / 'no' / 'such'} does not exist"
    )
    res = runner.invoke(app, ["record", "5557", "-o", str(tmp_path)])
    assert res.exit_code == 2
    assert "is a directory" in one_line(res.stderr)
    # /sys refuses new files even to root: an unwritable directory on any Linux.
    res = runner.invoke(app, ["record", "5557", "-o", "/sys/kvtool-test.mcap"])
    assert res.exit_code == 2
    assert one_line(res.stderr).startswith(
        "kvtool: /sys/kvtool-test.mcap: cannot create: Permission denied"
    )


def test_bad_groups_file_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "groups.json"
    bad.write_text('[{"group_idx": 0}]')
    res = runner.invoke(
        app, ["record", "5557", "-o", str(tmp_path / "r.mcap"), "--groups", str(bad)]
    )
    assert res.exit_code == 2
    assert one_line(res.stderr).startswith(f"kvtool: {bad}")
    assert not (tmp_path / "r.mcap").exists()
    res = runner.invoke(
        app,
        [
            "record",
            "5557",
            "-o",
            str(tmp_path / "r.mcap"),
            "--groups",
            str(tmp_path / "missing.json"),
        ],
    )
    assert res.exit_code == 2
    assert "cannot read groups file" in one_line(res.stderr)


def test_help_lists_the_options() -> None:
    res = runner.invoke(app, ["record", "--help"])
    assert res.exit_code == 0
    for opt in (
        "--bind",
        "--topic",
        "--dp-size",
        "--replay",
        "--history",
        "--duration",
        "--max-batches",
        "--groups",
        "--force",
        "--quiet",
        "--connect-timeout",
    ):
        assert opt in res.stdout


@pytest.mark.zmq
@pytest.mark.parametrize("name", ["gemma3", "gemma3.legacy-array-group-idx", "full_only"])
def test_record_with_live_drops_then_info_equals_truth(tmp_path: Path, name: str) -> None:
    """Issue 2, done-when: drops recovered over replay; `kvtool info` counts equal the truth."""
    msgs = capture_messages(name)
    truth = capture_truth(name)
    out = tmp_path / "run.mcap"
    with Peer(msgs, drop={0, 1, 17, 40, 41, 42}) as peer:
        res = runner.invoke(
            app,
            [
                "record",
                peer.endpoint,
                "--replay",
                peer.replay_endpoint or "",
                "-o",
                str(out),
                "-n",
                str(len(msgs)),
                "--history",
                "-q",
                "--duration",
                "20s",
            ],
        )
    assert res.exit_code == 0, res.stderr
    with open_recording(out) as r:
        got = [(m.seq, m.data) for m in r.messages()]
    assert got == [(s, p) for _, s, p in msgs]  # every seq, in order, byte for byte
    res = runner.invoke(app, ["info", "--format", "json", str(out)])
    assert res.exit_code == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["batches"] == truth["num_batches"]
    assert info["events"] == {k: truth["events_by_type"].get(k, 0) for k in info["events"]}
    assert info["blocks_stored"] == truth["block_stored"]["total"]["blocks"]
    assert info["blocks_removed"] == truth["block_removed"]["total"]["blocks"]
    assert info["gaps"]["lost"] == 0 and info["gaps"]["lost_ranges"] == []
    assert info["restarts"] == 0 and info["truncated"] is False
    (ch,) = info["channels"]
    assert (ch["endpoint"], ch["seq_first"], ch["seq_last"]) == (peer.endpoint, 0, len(msgs) - 1)


# -- a recording that never received anything (issue 11.6) ---------------------------------


@pytest.mark.zmq
def test_issue11_6_no_publisher_reached_exit_1(tmp_path: Path) -> None:
    """An idle port until --duration: say no publisher was reached, exit 1 (was 0)."""
    port = free_port()
    res = runner.invoke(
        app,
        [
            "record",
            str(port),
            "-o",
            str(tmp_path / "r.mcap"),
            "-d",
            "0.5s",
            "--connect-timeout",
            "0",
        ],
    )
    assert res.exit_code == 1, res.stderr
    reason, written = res.stderr.strip().splitlines()
    assert reason.startswith("kvtool: no batch received in ")
    assert f"no publisher was reached at tcp://127.0.0.1:{port}" in reason
    # Issue 24: no empty recording is left to block the rerun.
    assert written == f"kvtool: nothing recorded, so no file was written at {tmp_path / 'r.mcap'}"
    assert not (tmp_path / "r.mcap").exists()


@pytest.mark.zmq
def test_issue24_duration_shorter_than_the_connect_timeout_leaves_no_file(tmp_path: Path) -> None:
    """A real publisher that is up but silent, -d 0.5s under the 30 s connect timeout: exit 1
    and no file (an empty one blocked the rerun with "file exists"); the rerun records."""
    import zmq

    out = tmp_path / "r.mcap"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        res = runner.invoke(
            app, ["record", f"tcp://127.0.0.1:{port}", "-o", str(out), "-d", "0.5s"]
        )
    finally:
        pub.close(linger=0)
        ctx.term()
    assert res.exit_code == 1, res.stderr
    assert "connected to" in res.stderr and "the publisher sent nothing" in res.stderr
    assert "nothing recorded, so no file was written at" in res.stderr
    assert not out.exists()
    msgs = capture_messages("full_only")[:5]
    with Peer(msgs) as peer:
        res = runner.invoke(app, ["record", peer.endpoint, "-o", str(out), "-n", "5", "-d", "20s"])
    assert res.exit_code == 0, res.stderr
    with open_recording(out) as r:
        assert [m.data for m in r.messages()] == [p for _, _, p in msgs]


def test_issue11_6_connected_but_silent_says_so() -> None:
    from kvtool.capture import CaptureResult, CaptureStats
    from kvtool.render.status import no_batch_line

    st = CaptureStats(elapsed_ns=3_000_000_000, connected={"tcp://127.0.0.1:5557"})
    line = no_batch_line(CaptureResult("r.mcap", st, {}, "duration", 0), ["tcp://127.0.0.1:5557"])
    assert line.startswith("kvtool: no batch received in 3.0s: connected to tcp://127.0.0.1:5557")


def test_issue11_6_live_status_waits_for_publisher_until_the_first_batch() -> None:
    from rich.console import Console

    from kvtool.capture import CaptureStats
    from kvtool.render.status import LiveStatus

    status = LiveStatus(Console(width=80, force_terminal=True), ["tcp://gpu-7:5557"])
    waiting = status.render(CaptureStats(elapsed_ns=2_000_000_000)).plain
    assert waiting == "waiting for publisher  at tcp://gpu-7:5557  (2.0s)"
    started = status.render(CaptureStats(batches=1, events=3, elapsed_ns=2_500_000_000)).plain
    assert started.startswith("recording 2.5s  lost 0  gaps 0  batches 1  events 3")


# -- the live status fits, names its units, logs (issues 11.7, 8.15) -------------------------


def _busy_stats() -> object:
    from collections import Counter

    from kvtool.capture import CaptureStats

    kinds = [
        "sliding_window",
        "full_attention",
        "mla_attention",
        "sliding_window_mla",
        "mamba",
        "chunked_local_attention",
    ]
    return CaptureStats(
        batches=123_456_789,
        events=9_876_543_210,
        gaps=12_345,
        recovered=12_000,
        lost=345,
        restarts=3,
        malformed=7,
        cleared=2,
        elapsed_ns=86_400 * 10**9,
        stores=Counter({k: 10**9 + i for i, k in enumerate(kinds)}),
        removes=Counter({k: 10**8 + i for i, k in enumerate(kinds)}),
    )


@pytest.mark.parametrize("width", [80, 120])
def test_issue11_7_live_status_fits_the_width_loss_first_units_named(width: int) -> None:
    from rich.console import Console

    from kvtool.render.status import LiveStatus

    text = LiveStatus(Console(width=width, force_terminal=True)).render(_busy_stats()).plain  # type: ignore[arg-type]
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    first = lines[0]
    assert first.index("lost 345") < first.index("gaps 12,345") < text.index("batches")
    assert "store events:" in text and "remove events:" in text
    assert "sliding_window 1,000,000,000" in text  # thousands separators, nothing cut
    assert "…" not in text


def test_issue11_7_clean_run_summary_does_not_read_as_trouble() -> None:
    from kvtool.capture import CaptureResult, CaptureStats
    from kvtool.render.status import summary_line

    st = CaptureStats(batches=64, events=1925, gaps=1, recovered=1, replay_retries=2)
    line = summary_line(CaptureResult("run.mcap", st, {}, "duration", 2048))
    assert line == (
        "run.mcap: 0 lost, 1 gap (1 recovered); 64 batches, 1,925 events, "
        "2 replay requests asked again, nothing lost, 2.0 KiB (duration)"
    )


def test_issue11_7_plain_status_line_every_interval() -> None:
    from kvtool.capture import CaptureStats
    from kvtool.render.status import StatusLog

    lines: list[str] = []
    log = StatusLog(lines.append, 10 * 10**9, ["tcp://127.0.0.1:5557"])
    for s, batches in [(0, 0), (5, 0), (10, 3), (12, 4), (25, 9), (29, 9)]:
        log(CaptureStats(batches=batches, events=batches * 10, elapsed_ns=s * 10**9))
    assert lines == [
        "kvtool: recording 10.0s  lost 0  gaps 0  batches 3  events 30 (3/s)",
        "kvtool: recording 25.0s  lost 0  gaps 0  batches 9  events 90 (4/s)",
    ]


def _evil_payload(seq: int) -> bytes:
    import msgspec

    store = [
        "BlockStored",
        [seq + 1],
        None,
        [1, 2, 3],
        16,
        None,
        None,
        None,
        None,
        0,
        "\x1b]0;pwned\x07\x1b[2J",
        None,
    ]
    return msgspec.msgpack.encode([1.7e9 + seq, [store], 0])


@pytest.mark.zmq
def test_issue8_15_escape_sequences_from_the_network_never_reach_stderr(tmp_path: Path) -> None:
    """A publisher on loopback sends a kind and a topic with escape sequences; the status
    lines (stderr is a log here: --status-every) and the summary show them escaped."""
    msgs = [(b"\x1b[31mtopic", i, _evil_payload(i)) for i in range(30)]
    with Peer(msgs, rate=50) as peer:
        res = runner.invoke(
            app,
            [
                "record",
                peer.endpoint,
                "-o",
                str(tmp_path / "r.mcap"),
                "-n",
                "30",
                "--status-every",
                "100ms",
            ],
        )
    assert res.exit_code == 0, res.stderr
    assert "\x1b" not in res.stderr and "\x07" not in res.stderr
    status = [line for line in res.stderr.splitlines() if line.startswith("kvtool: recording")]
    assert status, res.stderr
    assert "store events: \\x1b]0;pwned\\x07\\x1b[2J" in status[-1]


@pytest.mark.zmq
def test_issue8_15_live_status_escapes_a_kind_from_a_real_publisher(tmp_path: Path) -> None:
    from rich.console import Console

    from kvtool.capture import Recorder, Source
    from kvtool.render.status import LiveStatus

    msgs = [(b"", i, _evil_payload(i)) for i in range(5)]
    with Peer(msgs) as peer:
        result = Recorder(tmp_path / "r.mcap", [Source(peer.endpoint)], max_batches=5).run(
            handle_signals=False
        )
    text = (
        LiveStatus(Console(width=80, force_terminal=True), [peer.endpoint])
        .render(result.stats)
        .plain
    )
    assert "\x1b" not in text and "\\x1b]0;pwned" in text


def _old_recording(path: Path) -> bytes:
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557")
        for i, (_t, seq, payload) in enumerate(capture_messages("full_only")[:3]):
            w.write(ch, seq, payload, 1_000 + i)
    return path.read_bytes()


@pytest.mark.zmq
@pytest.mark.parametrize("how", ["connect-timeout", "duration"])
def test_force_keeps_the_old_recording_until_a_batch_arrives(how: str, tmp_path: Path) -> None:
    """--force replaces a recording only with one that holds a batch: a run that reaches
    no publisher leaves the old recording as it was (it used to truncate, then delete it)."""
    out = tmp_path / "r.mcap"
    old = _old_recording(out)
    port = free_port()
    wait = ["--connect-timeout", "0.3s"] if how == "connect-timeout" else ["-d", "0.5s"]
    res = runner.invoke(app, ["record", str(port), "-o", str(out), "--force", *wait])
    assert res.exit_code == 1, res.stderr
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.mcap"]  # no temporary left
    if how == "duration":
        assert res.stderr.strip().splitlines()[-1] == (
            f"kvtool: {out} was left as it was "
            "(--force replaces a recording only once a batch arrives)"
        )
