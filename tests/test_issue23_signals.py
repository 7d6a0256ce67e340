"""Issue 23: SIGTERM, SIGINT and SIGHUP end `record`, `top` and `replay --publish` cleanly.

Real processes and real signals: a closed, complete recording with its ledger (within 3 s:
printed, not asserted), and `top`'s terminal restored (run in a tmux pane of our own).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvtool.recording import open_recording
from tests.conftest import capture_messages
from tests.peer import Peer
from tests.replayutil import capture_recording
from tests.test_live_faults import ROOT, _record_proc, free_port
from tests.tmuxutil import Tmux, needs_tmux


def _wait(pred: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _assert_complete(path: Path) -> list[int]:
    with open_recording(path) as r:
        seqs = [m.seq for m in r.messages()]
        assert r.recovery.complete, r.recovery
        assert r.ledger is not None  # written at close
    assert seqs and seqs == list(range(len(seqs)))
    return seqs


@pytest.mark.zmq
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_issue23_record_process_ends_on_sighup_and_sigterm_with_a_closed_file(
    tmp_path: Path, sig: int
) -> None:
    """`record` on SIGHUP (a closed SSH session) stops like on SIGTERM: exit 0 within 3 s,
    the file closed with its ledger. Before: SIGHUP killed it, the file truncated."""
    msgs = capture_messages("gemma3")
    out = tmp_path / "r.mcap"
    with Peer(msgs, count=100_000, rate=300) as peer:
        proc = _record_proc([peer.endpoint, "--replay", peer.replay_endpoint or "", "-o", str(out)])
        try:
            _wait(lambda: len(peer.published) > 300 or proc.poll() is not None)
            t0 = time.monotonic()
            proc.send_signal(sig)
            proc.wait(10)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    print(f"stopped in {took:.2f} s")  # the README's bound is 3 s (not asserted: no timing)
    assert "Traceback" not in err
    _assert_complete(out)


def _child_pid(pane_pid: int) -> int:
    """The kvtool process the pane's shell runs (by parent pid, from /proc)."""
    for task in Path(f"/proc/{pane_pid}/task").iterdir():
        kids = (task / "children").read_text().split()
        if kids:
            return int(kids[0])
    raise AssertionError("the pane runs no child")


@needs_tmux
@pytest.mark.zmq
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_issue23_top_record_ends_on_sigterm_and_sighup_restoring_the_terminal(
    tmp_path: Path, sig: int
) -> None:
    """`top --record` on SIGTERM or SIGHUP: its --record file closed and complete with its
    ledger, the terminal out of the alternate screen and back in canonical mode, exit 130
    with one line. Before: exit 143/129, a truncated file without ledger, the terminal left
    on the alternate screen."""
    msgs = capture_messages("gemma3")
    out = tmp_path / "top.mcap"
    with Peer(msgs, count=100_000, rate=200) as peer:
        command = (
            f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m kvtool top "
            f"{peer.endpoint} --replay-endpoint {peer.replay_endpoint} --record {out}; "
            "echo EXIT=$?; stty -a | grep -o -- '-\\?icanon' | sed 's/^/STTY=/'; sleep 120"
        )
        tmux = Tmux(command)
        try:
            tmux.wait_for(r"batches [1-9]")
            pane = int(tmux._tmux("display", "-p", "-t", tmux.name, "#{pane_pid}").strip())
            kid = _child_pid(pane)
            t0 = time.monotonic()
            os.kill(kid, sig)
            screen = tmux.wait_for(r"^STTY=")
            took = time.monotonic() - t0
            alt = tmux._tmux("display", "-p", "-t", tmux.name, "#{alternate_on}").strip()
        finally:
            tmux.kill()
    assert "EXIT=130" in screen, screen
    assert "STTY=icanon" in screen and alt == "0"
    assert "Traceback" not in screen
    print(f"stopped in {took:.2f} s")  # the README's bound is 3 s (not asserted: no timing)
    _assert_complete(out)


@pytest.mark.zmq
def test_issue23_replay_publish_ends_on_sighup(tmp_path: Path) -> None:
    """`replay --publish` on SIGHUP: one line, exit 130, no traceback. Before: killed (129)."""
    rec = capture_recording(tmp_path, "gemma3")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "kvtool", "replay", str(rec), "--publish", endpoint),
            *("--wait-subscribers", "1", "--wait-timeout", "60"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)  # imported and waiting for a subscriber
        assert proc.poll() is None
        proc.send_signal(signal.SIGHUP)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
