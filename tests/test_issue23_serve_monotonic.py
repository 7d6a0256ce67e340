"""Issue 23: ``serve``'s counters never go down when a live feed re-attributes early rows.

Live ``serve`` (and ``top --metrics``) learns each group's kind from annotated stores; a
remove that comes before its group's first annotated store is fed again, with the kind,
once it is learned (issue 24), so its ``unannotated`` row shrinks. Two real publishers
(the test peer, 127.0.0.1) share one rank: A's group is learned while B's is not, and the
``unannotated`` row of the rank lost A's removes -- a Prometheus counter that went down
(8 -> 4 blocks removed). ``serve`` now holds back the rows still pending attribution; a
real scrape of /metrics after every snapshot sees every counter only grow, and at the end
each equals ``kvtool report`` on the ``--record`` file.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import capture_messages
from tests.peer import Peer
from tests.test_serve import (
    DEADLINE_S,
    assert_equals_report,
    report_json,
    scrape,
    serve_proc,
    value,
)


@pytest.mark.zmq
def test_issue23_serve_counters_never_decrease_while_kinds_are_learned(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")[16:21]  # a late join: removes before the group's store
    out = tmp_path / "kept.mcap"
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    down: list[tuple[str, dict[str, str], float, float]] = []
    # A publishes at 0, 1, 2 s...; B at 0.5, 1.5 s...: at 1 s A's groups are learned and
    # B's are not yet.
    with (
        Peer(msgs, subscribe_timeout=DEADLINE_S, rate=1.0) as a,
        Peer(msgs, subscribe_timeout=DEADLINE_S, rate=1.0, start_delay=0.5) as b,
    ):
        with serve_proc(
            tmp_path, a.endpoint, b.endpoint, "--record", str(out), "--interval", "50ms"
        ) as (proc, url):
            deadline = time.monotonic() + DEADLINE_S
            while True:
                assert time.monotonic() < deadline, "serve never received every batch"
                samples = scrape(url)
                for name, series in samples.items():
                    if not name.endswith(("_total", "_bucket", "_count", "_sum")):
                        continue
                    for labels, v in series:
                        key = (name, tuple(sorted(labels.items())))
                        if v < seen.get(key, v):
                            down.append((name, labels, seen[key], v))
                        seen[key] = v
                if (value(samples, "kvtool_batches_received_total") or 0) >= 2 * len(msgs):
                    break
                time.sleep(0.02)
        assert proc.returncode == 0, proc.stderr_text  # type: ignore[attr-defined]
    assert not down, down[:4]
    rep = report_json(out)
    assert rep["source"]["batches"] == 2 * len(msgs)
    assert assert_equals_report(samples, rep) >= 6
