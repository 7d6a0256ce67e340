"""``top --report-mode``: the same counts as ``report`` in each mode (hit announcements).

``top FILE --once --speed 0`` plays ``d_gemma3_report_full`` through report/'s incremental
feed; its last plain block's live, peak and orphan columns per kind equal ``report``'s
``live_blocks_end``, ``peak_live_blocks`` and ``orphan_removes`` in the same mode, and the
modes differ as docs/SEMANTICS.md R6 says (announcements are not live blocks).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.test_top import kvtool
from tests.tmuxutil import Tmux, needs_tmux

REC = (
    Path(__file__).parent
    / "data"
    / "semantics"
    / "d_gemma3_report_full"
    / ("d_gemma3_report_full.mcap")
)


def last_kind_table(
    text: str, hits: dict[str, str] | None = None
) -> dict[str, tuple[int, int, int]]:
    """(live, peak, orphan) per row of the last ``kind`` table of top's plain output (and
    into ``hits`` the hit rate column's cells, shown with --report-mode full only)."""
    lines = text.split("kvtool top")[-1].splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.startswith("kind ")]
    out = {}
    for line in lines[head + 1 :]:
        label, live, peak, _s, _e, _r, orphan, _p50, *hit = line.split()
        out[label] = tuple(int(x.replace(",", "")) for x in (live, peak, orphan))
        if hits is not None and hit:
            (hits[label],) = hit
    return out  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("incremental", {"full_attention": (1505, 1505, 0), "sliding_window": (6836, 6842, 0)}),
        ("full", {"full_attention": (196, 256, 0), "sliding_window": (291, 395, 0)}),
        ("auto", {"full_attention": (196, 256, 0), "sliding_window": (291, 395, 0)}),
    ],
)
def test_top_report_mode_on_a_recording_equals_report(
    mode: str, want: dict[str, tuple[int, int, int]]
) -> None:
    args = ["--report-mode", mode] if mode != "auto" else []
    top = kvtool("top", str(REC), "--once", "--speed", "0", *args)
    assert top.returncode == 0, top.stderr
    rep = kvtool("report", str(REC), "--format", "json", *args)
    assert rep.returncode == 0, rep.stderr
    by_kind = {
        r["kind"]: (r["live_blocks_end"], r["peak_live_blocks"], r["orphan_removes"])
        for r in json.loads(rep.stdout)["by_kind"]
    }
    hits: dict[str, str] = {}
    got = last_kind_table(top.stdout, hits)
    assert got == by_kind
    assert got == want
    # The hit rate column only where every request announces, as report's hit_rate.
    rates = {r["kind"]: r["hit_rate"] for r in json.loads(rep.stdout)["by_kind"]}
    assert hits == ({k: f"{v:.1%}" for k, v in rates.items()} if mode == "full" else {})
    assert ("hit rate" in top.stdout) == (mode == "full")


def test_top_report_mode_unknown_is_a_usage_error() -> None:
    proc = kvtool("top", str(REC), "--once", "--speed", "0", "--report-mode", "sometimes")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--report-mode" in proc.stderr


J = Path(__file__).parent / "data" / "semantics_more" / "j_gemma3_b16_all_full"


@needs_tmux
@pytest.mark.parametrize(("width", "height"), [(80, 24), (60, 20)])
def test_top_report_mode_full_in_tmux(width: int, height: int) -> None:
    """In a real pseudo-terminal, on j (every request in report mode full): the live and
    peak physical blocks of report's by_kind, and at 80 columns the hit rate (33.0 %, as
    report's hit_rate 0.330435); on a narrower terminal the number columns give way, the
    key column and live/peak never."""
    rec = J / f"{J.name}.mcap"
    cmd = (
        f"{shlex.quote(sys.executable)} -m kvtool top {shlex.quote(str(rec))} --speed 0 "
        f"--groups {shlex.quote(str(J / 'groups.json'))} --report-mode full"
    )
    tmux = Tmux(cmd, width, height)
    try:
        pane = tmux.wait_for(r"^sliding_window ", also="ended")
        assert max(len(line) for line in pane.splitlines()) <= width, pane
        assert re.search(r"^full_attention +152 +212 ", pane, re.MULTILINE), pane
        assert re.search(r"^sliding_window +144 +188 ", pane, re.MULTILINE), pane
        hit = r" +33\.0%$" if width >= 80 else r"[^%]*$"
        for key in ("full_attention", "sliding_window"):
            assert re.search(rf"^{key} .*{hit}", pane, re.MULTILINE), pane
        assert ("hit rate" in pane.split("\n\n")[1]) == (width >= 80), pane
    finally:
        tmux.kill()
