"""Issue 23: forced gaps against a vLLM-like publisher, the recorder SIGSTOPped (quick run).

One run of ``bench/soak_gaps.py`` (the 20-run soak's figures are in bench/RESULTS.md):
a real capture looped to 3,000 batches at 1,000/s through a copy of vLLM 0.33
``ZmqEventPublisher``'s loop (PUB SNDHWM 200 so a 1 s stop overflows it), ``kvtool
record`` stopped 1 s mid-stream with SIGSTOP (by PID), then every seq checked byte for
byte against the source and the ledger's lost and unconfirmed 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.zmq
@pytest.mark.slow
def test_issue23_recorder_stopped_1s_against_a_vllm_like_publisher_loses_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [
            *(sys.executable, str(ROOT / "bench" / "soak_gaps.py"), "--runs", "1"),
            *("--batches", "3000", "--rate", "1000", "--hwm", "200"),
            *("--stop", "1", "--stop-after", "1", "--grace", "30", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert (run["missing"], run["payload_mismatch"], run["duplicates"]) == (0, 0, 0)
    assert (run["ledger_lost"], run["ledger_unconfirmed"], run["exit"]) == (0, 0, 0)
    assert run["recorded"] == 3000
