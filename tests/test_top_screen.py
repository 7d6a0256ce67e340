"""``kvtool top``'s screen (issue 24): full keys, keys that act at once, pause, narrow sizes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from kvtool.render.top import screen
from kvtool.top import Health, RecordingSource, ReportFeed, TopModel, TopView, split_keys
from tests.replayutil import capture_recording
from tests.tmuxutil import Tmux, needs_tmux


def kvtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvtool", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _row(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "live_blocks_end": 0,
        "peak_live_blocks": 0,
        "blocks_stored": 0,
        "blocks_removed": 0,
        "blocks_recomputed": 0,
        "orphan_removes": 0,
        "lifetime_p50_s": None,
    }
    return {**base, **kw}


def test_issue24_function_keys_are_not_letters() -> None:
    assert split_keys("\x1bOP\x1bOQ") == []  # F1, F2 (were p and q)
    assert split_keys("p\x1b[15~q") == ["p", "q"]  # F5 between two keys
    assert split_keys("\x1b[A\x1b[1;5Dk") == ["k"]  # arrows, with modifiers
    assert split_keys("g") == ["g"]


def test_issue24_one_group_with_two_windows_is_two_rows() -> None:
    model = TopModel()
    rows = [
        _row(group_idx=1, kind="sliding_window", sliding_window=64, live_blocks_end=10),
        _row(group_idx=1, kind="sliding_window", sliding_window=128, live_blocks_end=20),
    ]
    model.update(0.0, {"group": rows}, Health())
    got = model.rows("group")
    assert [(r.label, r.live) for r in got] == [
        ("1 sliding_window:128", 20),
        ("1 sliding_window:64", 10),
    ]


def test_issue24_rows_that_print_alike_stay_apart() -> None:
    model = TopModel()
    rows = [_row(kind="full_attention", live_blocks_end=1), _row(kind="full\u200battention")]
    model.update(0.0, {"kind": rows}, Health())
    assert len(model.rows("kind")) == 2


def _render(model: TopModel, view: str, width: int, height: int) -> str:
    console = Console(width=width, height=height, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(screen(model, view, width=width, height=height))
    text = console.export_text()
    console.file.close()
    return text


@pytest.mark.parametrize(("width", "height"), [(80, 24), (50, 12), (40, 12)])
def test_issue24_key_column_never_wraps_or_disappears(width: int, height: int) -> None:
    model = TopModel()
    rows = [
        _row(kind="sliding_window_mla", live_blocks_end=123456, lifetime_p50_s=0.0123),
        _row(kind="chunked_local_attention", live_blocks_end=5, lifetime_p50_s=12.5),
        _row(kind="full_attention", live_blocks_end=7),
    ]
    model.update(0.0, {"kind": rows}, Health(source="tcp://127.0.0.1:5557"))
    text = _render(model, "kind", width, height)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for kind in ("sliding_window_mla", "chunked_local_attention", "full_attention"):
        assert any(line.startswith(kind + " ") for line in lines), text
    # the live column is the last to give way
    assert re.search(r"^sliding_window_mla +123,456", text, re.MULTILINE), text


def test_issue24_number_columns_keep_their_width_between_refreshes() -> None:
    model = TopModel()
    widths = set()
    for p50 in (0.5, 0.0123, 1.25, None):
        model.update(0.0, {"kind": [_row(kind="mamba", lifetime_p50_s=p50)]}, Health())
        header = next(x for x in _render(model, "kind", 80, 24).splitlines() if "p50 s" in x)
        widths.add(header.index("p50 s"))
    assert len(widths) == 1


def test_issue24_pause_pauses_playback(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3", step_ns=50_000_000)  # 64 batches, 3.15 s
    src = RecordingSource(str(path), speed=1.0)
    view = TopView(source=src, feed=ReportFeed(src.groups))
    try:
        src.start(0.0)
        first = len(src.take(0.5))
        view.key("p", 0.5)
        assert src.take(100.0) == []  # paused: nothing comes due, however long
        assert not src.done
        view.key("p", 100.0)
        assert len(src.take(100.5)) > 0  # resumed where it stood, not at t=100
        assert not src.done
        assert first > 0
    finally:
        src.stop()


def test_issue24_top_on_a_truncated_recording_exits_3(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    data = path.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: len(data) * 2 // 3])
    proc = kvtool("top", str(cut), "--once", "--speed", "0")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "truncated" in lines[0], proc.stderr
    assert "kvtool top" in proc.stdout  # the numbers of what was read are still shown


@needs_tmux
@pytest.mark.parametrize(("width", "height"), [(80, 24), (50, 12)])
def test_issue24_top_screen_in_tmux_shows_every_key(
    tmp_path: Path, width: int, height: int
) -> None:
    path = capture_recording(tmp_path, "gemma3")
    # COLUMNS/LINES exported by the caller must not win over the terminal's real size.
    cmd = (
        f"COLUMNS=80 LINES=24 {shlex.quote(sys.executable)} -m kvtool top "
        f"{shlex.quote(str(path))} --speed 0"
    )
    tmux = Tmux(cmd, width, height)
    try:
        pane = tmux.wait_for(r"^sliding_window ", also="ended")
        for key in ("sliding_window", "full_attention"):
            assert re.search(rf"^{key} +\d", pane, re.MULTILINE), pane
        assert max(len(line) for line in pane.splitlines()) <= width
        tmux.keys("g")
        pane = tmux.wait_for(r"^group ")
        assert re.search(r"^0 full_attention +\d", pane, re.MULTILINE), pane
        assert re.search(r"^1 sliding_window:64 +\d", pane, re.MULTILINE), pane
    finally:
        tmux.kill()


@needs_tmux
def test_issue24_a_resize_redraws_the_final_screen(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    cmd = f"{shlex.quote(sys.executable)} -m kvtool top {shlex.quote(str(path))} --speed 0"
    tmux = Tmux(cmd)
    try:
        tmux.wait_for(r"ended(.*\n)*sliding_window +\d")
        tmux.resize(50, 12)
        pane = tmux.wait_for(r"^kind +live +peak +store/s +evict/s$")  # the 50-column layout
        assert re.search(r"^full_attention +\d", pane, re.MULTILINE), pane
        assert max(len(line) for line in pane.splitlines()) <= 50
    finally:
        tmux.kill()
