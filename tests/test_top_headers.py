"""``top``'s column headers come from the metric registry; its screen stays byte for byte.

The headers are the registry's short labels (a rate's with ``/s``); no header string is
spelled in kvtool/render/top.py. The screens below were taken from the code before the
change (the same model rendered at 80x24, 50x12, 120x30 and 30x8, and the plain block):
each must come out byte-identical. In tmux, a real ``kvtool top`` on a recording shows the
same header and legend lines at 80x24 and 50x12.
"""

from __future__ import annotations

import ast
import hashlib
import io
import shlex
import sys
from pathlib import Path

import pytest
from rich.console import Console

import kvtool.render.top as render_top
from kvtool.render.top import COLUMNS, HEADERS, LEGEND, SPARK_HEADER, plain_block, screen
from kvtool.report.registry import BY_NAME, METRICS, SHORT_LABELS, short_label
from kvtool.top import Health, TopModel
from tests.replayutil import capture_recording
from tests.tmuxutil import Tmux, needs_tmux

HEAD_80 = "kind              live    peak store/s evict/s recomp/s  orphan   p50 s 60s"
HEAD_50 = "kind              live    peak store/s evict/s"
LEGEND_80 = (
    "blocks; /s over the last interval; recomp: stored again after eviction (thrash);",
    "orphan: removes of blocks not live; p50 s: median lifetime; 60s: live blocks",
)
SCREEN_80 = """\
kvtool top  tcp://127.0.0.1:5557
t=2.0s  publishers 1/1  batches 448 (256.0/s)  last batch 0.0s ago
gaps: recovered 0  lost 0  restarts 0

kind              live    peak store/s evict/s recomp/s  orphan   p50 s 60s
sliding_window     973   1,050 100,000  83,428   44,064       0      88      ▂▄█
full_attention     336     371  20,000  13,588    5,080       7   0.063      ▂▄█

blocks; /s over the last interval; recomp: stored again after eviction (thrash);
orphan: removes of blocks not live; p50 s: median lifetime; 60s: live blocks
q quit · k kind · w window · g group · r rank · p pause
"""
SCREEN_50 = """\
kvtool top  tcp://127.0.0.1:5557
t=2.0s  publishers 1/1  batches 448 (256.0/s)
last batch 0.0s ago
gaps: recovered 0  lost 0  restarts 0

kind              live    peak store/s evict/s
sliding_window     973   1,050 100,000  83,428
full_attention     336     371  20,000  13,588

q quit · k kind · w window · g group · r rank · p
pause
"""
# sha256 of each exact rendering (trailing blanks included) before the change.
SHA256 = {
    "80x24": "b2917b445724eceed9898dcd6c93bbbe0d96cc8375ba3af2d7571a16aa3ed8aa",
    "50x12": "3c46c64af919033a1bb3739515f8c907d353eb26956db408551daec88420bcbf",
    "120x30": "3f1049c314eaaf19d3dd88bcfaa4a74285d7bed4b51291ef309326c15520c70c",
    "30x8": "fe46c3baacfc5bb504eef5ef61911aaded2af8900782560b96ade88d3e11b58e",
    "plain": "0b4872dbad2dac14ff055e9ffa9110762fb3efa22c2834b877ff93f73a99494c",
}


def _row(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {c: 0 for c, _rate in COLUMNS}
    return {**base, "lifetime_p50_s": None, **kw}


def _model() -> TopModel:
    m = TopModel()
    for t, k in ((0.0, 1), (1.0, 3), (2.0, 7)):
        rows = [
            _row(
                kind="full_attention", live_blocks_end=48 * k, peak_live_blocks=53 * k,
                blocks_stored=5000 * k, blocks_removed=3397 * k, blocks_recomputed=1270 * k,
                orphan_removes=k, lifetime_p50_s=0.009 * k,
            ),
            _row(
                kind="sliding_window", live_blocks_end=139 * k, peak_live_blocks=150 * k,
                blocks_stored=25000 * k, blocks_removed=20857 * k, blocks_recomputed=11016 * k,
                lifetime_p50_s=12.5 * k,
            ),
        ]  # fmt: skip
        health = Health(
            source="tcp://127.0.0.1:5557", publishers=1, connected=1, batches=64 * k,
            last_batch_age_s=0.0,
        )  # fmt: skip
        m.update(t, {"kind": rows}, health)
    return m


def _render(width: int, height: int) -> str:
    console = Console(
        width=width, height=height, record=True, file=io.StringIO(), color_system=None
    )
    console.print(screen(_model(), "kind", width=width, height=height))
    return console.export_text()


def _stripped(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n") + "\n"


def test_top_headers_are_the_registry_short_labels() -> None:
    assert tuple(short_label(m) + ("/s" if r else "") for m, r in COLUMNS) == HEADERS
    assert HEADERS == ("live", "peak", "store/s", "evict/s", "recomp/s", "orphan", "p50 s")
    assert SPARK_HEADER == "60s"
    assert all(m in BY_NAME for m, _rate in COLUMNS)
    # One short label names one metric: none is another's label or name.
    names = {m.name for m in METRICS} | {a for m in METRICS for a in m.aliases}
    assert set(SHORT_LABELS) <= names
    labels = list(SHORT_LABELS.values())
    assert len(set(labels)) == len(labels)
    assert not set(labels) & (names - set(SHORT_LABELS))
    assert all(len(x) <= 16 and "\n" not in x for x in labels)


def test_top_render_spells_no_header() -> None:
    tree = ast.parse(Path(render_top.__file__).read_text())
    consts = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert not consts & {*HEADERS, SPARK_HEADER, "store", "evict", "recomp", "orphan"}
    assert " ".join(LEGEND_80) == LEGEND


@pytest.mark.parametrize("size", ["80x24", "50x12", "120x30", "30x8"])
def test_top_screen_is_byte_identical(size: str) -> None:
    width, height = map(int, size.split("x"))
    text = _render(width, height)
    want = {"80x24": SCREEN_80, "50x12": SCREEN_50}.get(size)
    if want is not None:
        assert _stripped(text) == want
    assert hashlib.sha256(text.encode()).hexdigest() == SHA256[size]


def test_top_plain_block_is_byte_identical() -> None:
    text = plain_block(_model(), "kind")
    assert text.splitlines()[3] == HEAD_80.removesuffix(" 60s")
    assert hashlib.sha256(text.encode()).hexdigest() == SHA256["plain"]


@needs_tmux
@pytest.mark.parametrize(("width", "height"), [(80, 24), (50, 12)])
def test_top_headers_in_tmux(tmp_path: Path, width: int, height: int) -> None:
    path = capture_recording(tmp_path, "gemma3")
    cmd = (
        f"COLUMNS=80 LINES=24 {shlex.quote(sys.executable)} -m kvtool top "
        f"{shlex.quote(str(path))} --speed 0"
    )
    tmux = Tmux(cmd, width, height)
    try:
        pane = tmux.wait_for(r"^full_attention +\d", also="ended")
        lines = [line.rstrip() for line in pane.splitlines()]
        assert (HEAD_80 if width == 80 else HEAD_50) in lines, pane
        if width == 80:
            assert all(line in lines for line in LEGEND_80), pane
        assert max(len(line) for line in lines) <= width
    finally:
        tmux.kill()
