"""What a person reads from ``report`` and ``replay``: fits the terminal, escapes, says why."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingWriter
from kvtool.render.events import format_hash
from kvtool.render.progress import FileOffsets, ProgressBar
from kvtool.render.report import DEFAULT_COLUMNS, render_csv, render_table
from kvtool.report import COLUMNS, build_report

ROOT = Path(__file__).resolve().parent.parent
GEMMA = ROOT / "recordings" / "gemma3.mcap"
ENC = msgspec.msgpack.Encoder()
runner = CliRunner()

EVIL = "\x1b[2J\x1b]0;pwned\x07"
"""Clear the screen and retitle the window: what a hostile recording or peer would send."""


def _stored(hashes: list[int], group: int, kind: str | None, window: int | None = None) -> dict:
    ev: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": group,
    }
    if kind is not None:
        ev["kv_cache_spec_kind"] = kind
        ev["kv_cache_spec_sliding_window"] = window
    return ev


def _removed(hashes: list[int], group: int) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": group}


def _record(
    path: Path,
    batches: list[list[dict]],
    *,
    endpoint: str = "tcp://127.0.0.1:5557",
    topic: str = "",
    groups: list[dict] | None = None,
) -> Path:
    with RecordingWriter(path) as w:
        ch = w.add_channel(endpoint, topic, 0)
        for seq, events in enumerate(batches):
            ts = 1000.0 + seq
            w.write(ch, seq, ENC.encode([ts, events, 0]), log_time=int(ts * 1e9))
        if groups is not None:
            w.add_groups(groups, "test")
    return path


def _hostile(tmp_path: Path) -> Path:
    kind = f"evil{EVIL}[bold red]kind[/]"
    return _record(
        tmp_path / "evil.mcap",
        [[_stored([1, 2], 0, kind)], [_removed([1], 0)], [_stored([3], 1, "=1+1")]],
        endpoint=f"tcp://127.0.0.1:5557{EVIL}",
        topic=f"topic{EVIL}",
    )


def _no_raw_escape(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text)


# -- 8.15: strings from a recording never reach the terminal raw -------------------------------


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_issue8_15_report_escapes_hostile_strings(tmp_path: Path, fmt: str) -> None:
    rec = _hostile(tmp_path)
    result = runner.invoke(
        app, ["report", str(rec), "--format", fmt, "--every", "1s", "--by", "kind,group"]
    )
    assert result.exit_code == 0, result.stderr
    _no_raw_escape(result.stdout)
    _no_raw_escape(result.stderr)
    if fmt == "table":
        assert "\\x1b[2J" in result.stdout  # shown, visibly, not acted on
        assert "[bold red]kind[/]" in result.stdout  # not taken as rich markup
    if fmt == "markdown":  # shown, and not taken as Markdown either (issue 24)
        assert "\\\\x1b\\[2J" in result.stdout
        assert "\\[bold red\\]kind\\[/\\]" in result.stdout


def test_issue8_15_report_csv_neutralises_formulas(tmp_path: Path) -> None:
    rec = _hostile(tmp_path)
    result = runner.invoke(app, ["report", str(rec), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    kinds = {r["kind"] for r in rows}
    assert "'=1+1" in kinds and "=1+1" not in kinds


def test_issue8_15_replay_pretty_escapes_hostile_strings(tmp_path: Path) -> None:
    rec = _hostile(tmp_path)
    other = _record(tmp_path / "b.mcap", [[_stored([9], 0, "full_attention")]])
    result = runner.invoke(app, ["replay", str(rec), str(other), "--format", "pretty"])
    assert result.exit_code == 0, result.stderr
    _no_raw_escape(result.stdout)
    assert "evil\\x1b[2J" in result.stdout
    assert "127.0.0.1:5557\\x1b" in result.stdout  # the channel column (several channels)


def test_issue8_15_replay_check_escapes_hostile_strings(tmp_path: Path) -> None:
    groups = [{"group_idx": 0, "kind": f"full{EVIL}", "block_size": 16, "sliding_window": None}]
    rec = _record(tmp_path / "c.mcap", [[_stored([1], 0, f"other{EVIL}")]], groups=groups)
    result = runner.invoke(app, ["replay", str(rec), "--check"])
    assert result.exit_code == 1, result.output
    assert result.stdout.strip()
    _no_raw_escape(result.stdout)
    _no_raw_escape(result.stderr)


# -- 11.1: tables fit 80 columns, nothing is cut ----------------------------------------------


def _big(tmp_path: Path) -> Path:
    # long kind names and seven-digit counts: the widest cells a default table meets
    batches = [
        [
            _stored(list(range(k * 10**7, k * 10**7 + 2000)), k, kind)
            for k, kind in enumerate(
                ["chunked_local_attention", "encoder_only_attention", "sliding_window_mla"]
            )
        ]
        for _ in range(60)
    ]
    return _record(tmp_path / "big.mcap", batches)


def _lines(console: Console) -> list[str]:
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return out.splitlines()


@pytest.mark.parametrize("columns", [DEFAULT_COLUMNS, COLUMNS])
def test_issue11_1_report_table_fits_80_columns(tmp_path: Path, columns: tuple[str, ...]) -> None:
    rep = build_report([_big(tmp_path)], every_ns=10**9)
    console = Console(file=io.StringIO(), width=80, soft_wrap=True)
    render_table(rep, console, ("kind", "window", "group"), columns)
    lines = _lines(console)
    text = "\n".join(lines)
    assert "…" not in text
    # Every line, the prose too (summary, legend, findings: wrapped, not cut).
    assert max(len(ln) for ln in lines) <= 80
    assert all(ln == ln.rstrip() for ln in lines)
    assert any(ln.startswith("columns: ") for ln in lines)
    assert "120,000" in text  # thousands separators, never cut
    assert "chunked_local_attention" in text


def test_issue11_1_default_table_is_one_block_at_80_columns() -> None:
    rep = build_report([GEMMA])
    console = Console(file=io.StringIO(), width=80, soft_wrap=True)
    render_table(rep, console, ("kind",))
    lines = _lines(console)
    assert sum(ln.startswith("kind ") for ln in lines) == 1  # one header: nothing spilled
    head = lines.index("by kind") + 1
    assert "life" in lines[head] and "p50 s" in lines[head + 1]  # units in the headers
    assert max(len(ln) for ln in lines) <= 80


def test_issue24_default_columns_add_up() -> None:
    """315 stored - 214 removed != 48 live: the 53 cleared blocks were hidden (issue 24)."""
    from kvtool.render.report import DEFAULT_COLUMNS

    rep = build_report([GEMMA])
    assert "blocks_cleared" in DEFAULT_COLUMNS
    for r in rep.by_kind.to_dicts():
        left = r["blocks_stored"] - (r["blocks_removed"] - r["orphan_removes"])
        assert left - r["blocks_cleared"] == r["live_blocks_end"]


def test_issue11_1_cli_at_columns_80_cuts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for extra in ([], ["--wide"], ["--by", "group", "--every", "500ms"]):
        result = runner.invoke(app, ["report", str(GEMMA), *extra])
        assert result.exit_code == 0, result.stderr
        assert "…" not in result.stdout
        assert "1,890" in result.stdout


def test_issue11_1_columns_option(monkeypatch: pytest.MonkeyPatch) -> None:
    result = runner.invoke(app, ["report", str(GEMMA), "--columns", "tokens_stored"])
    assert result.exit_code == 0
    assert "30,240" in result.stdout and "1,890" not in result.stdout
    bad = runner.invoke(app, ["report", str(GEMMA), "--columns", "tokens"])
    assert bad.exit_code == 2 and bad.stderr.startswith("kvtool: --columns 'tokens'")


# -- 11.3: one CSV, one header --------------------------------------------------------------


def test_issue11_3_csv_with_timeline_is_one_table() -> None:
    result = runner.invoke(app, ["report", str(GEMMA), "--format", "csv", "--every", "500ms"])
    assert result.exit_code == 0
    assert result.stdout.count("table,") == 1  # the header once, not a second one mid-stream
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert all(None not in r for r in rows)  # no row longer than the header
    tables = {r["table"] for r in rows}
    assert tables == {"by_kind", "by_window", "timeline"}
    timeline = [r for r in rows if r["table"] == "timeline"]
    assert len(timeline) >= 2 and all(r["time_s"] != "" and r["kind"] for r in timeline)
    kinds = [r for r in rows if r["table"] == "by_kind" and r["kind"] == "full_attention"]
    assert kinds[0]["blocks_stored"] == "315" and kinds[0]["time_s"] == ""


def test_issue11_3_render_csv_without_timeline_keeps_the_header() -> None:
    rep = build_report([GEMMA])
    out = io.StringIO()
    render_csv(rep, out, ("kind",))
    header = out.getvalue().splitlines()[0].split(",")
    assert header == ["table", "kind", "sliding_window", "group_idx", *COLUMNS]


# -- 11.5: no silent empty results ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--kind", "sliding"], "kvtool: --kind 'sliding': not a KV cache kind"),
        (["--since", "2s", "--until", "1s"], "kvtool: --since 2s is after --until 1s"),
        (["--hash-format", "oct"], "kvtool: --hash-format 'oct'"),
    ],
)
def test_issue11_5_bad_filter_is_one_line_usage_error(args: list[str], expect: str) -> None:
    result = runner.invoke(app, ["replay", str(GEMMA), "-f", "jsonl", *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(expect) and result.stderr.count("\n") == 1


def test_issue11_5_misspelt_kind_suggests() -> None:
    result = runner.invoke(app, ["replay", str(GEMMA), "--kind", "sliding_windw"])
    assert "did you mean sliding_window" in result.stderr


@pytest.mark.parametrize("kind", ["unannotated", "unattributed", "mamba"])
def test_issue11_5_known_kinds_are_accepted(kind: str) -> None:
    result = runner.invoke(app, ["replay", str(GEMMA), "-f", "jsonl", "--kind", kind])
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (
            ["--seq", "70:80"],
            "kvtool: 0 of 1,925 events (64 batches) matched --seq 70:80; seqs in the input: 0-63",
        ),
        (["--since", "5s"], "matched --since 5s; the input spans 0-3.150 s (receive time)"),
        (["--kind", "mamba"], "kinds of stores in the input: full_attention, sliding_window"),
    ],
)
def test_issue11_5_empty_selection_is_said(args: list[str], expect: str) -> None:
    result = runner.invoke(app, ["replay", str(GEMMA), "-f", "jsonl", *args])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert expect in result.stderr and result.stderr.count("\n") == 1


def test_issue11_5_nonempty_selection_says_nothing() -> None:
    result = runner.invoke(app, ["replay", str(GEMMA), "-f", "jsonl", "--seq", "3:4"])
    assert result.exit_code == 0 and result.stdout and result.stderr == ""


# -- 11.8: progress ---------------------------------------------------------------------------


def test_issue11_8_progress_bar_is_off_without_a_terminal(tmp_path: Path) -> None:
    bar = ProgressBar(None, "reading", 100)
    with bar:
        offsets = FileOffsets(bar, {"a": 60, "b": 40})
        offsets.seen("a", 30)
        offsets.seen("b", 40)
        offsets.seen("a", 10)  # an earlier offset does not go back
    assert not bar.shown and bar.done == 70
    out = tmp_path / "o.mcap"
    result = runner.invoke(app, ["replay", str(GEMMA), "-o", str(out)])
    assert result.exit_code == 0
    assert "━" not in result.stderr  # piped: no bar


def test_issue11_8_progress_bar_draws_on_a_terminal() -> None:
    err = io.StringIO()
    console = Console(file=err, force_terminal=True, width=100)
    with ProgressBar(console, "reading x.mcap", 1000) as bar:
        bar.update(500)
    assert bar.shown is False  # closed
    assert "reading x.mcap" in err.getvalue()


# -- 11.11: one representation per hash -------------------------------------------------------


def test_issue11_11_hash_formats() -> None:
    big = 2**64 - 1
    assert format_hash(big) == str(big)
    assert format_hash(big, "hex") == "ffffffffffffffff"
    assert format_hash(-1, "hex") == "ffffffffffffffff"
    assert format_hash(big, "int") == big
    assert format_hash(b"\xab\xcd", "int") == "abcd"


def test_issue11_11_jsonl_default_is_exact_in_json_and_matches_pretty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for the whole hash
    result = runner.invoke(app, ["replay", str(GEMMA), "-f", "jsonl", "--seq", "0"])
    first = json.loads(result.stdout.splitlines()[0])
    hashes = first["block_hashes"]
    assert all(isinstance(h, str) and h.isdigit() for h in hashes)
    assert any(int(h) > 2**53 for h in hashes) or int(hashes[0]) >= 0
    pretty = runner.invoke(app, ["replay", str(GEMMA), "-f", "pretty", "--seq", "0"])
    assert f"hash {hashes[0]}" in pretty.stdout.splitlines()[0]
    hexed = runner.invoke(
        app, ["replay", str(GEMMA), "-f", "jsonl", "--seq", "0", "--hash-format", "hex"]
    )
    assert json.loads(hexed.stdout.splitlines()[0])["block_hashes"][0] == (f"{int(hashes[0]):016x}")


# -- 11.12: time column, stable widths, | head, --plot --------------------------------------


def test_issue11_12_pretty_has_time_column_and_stable_widths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # every column (narrower: tests/test_replay.py)
    result = runner.invoke(
        app, ["replay", str(GEMMA), "-f", "pretty", "--seq", "0:20", "--type", "BlockStored"]
    )
    lines = result.stdout.splitlines()
    assert lines[0].lstrip().startswith("0.000s")
    assert lines[-1].split()[0].endswith("s") and float(lines[-1].split()[0][:-1]) > 0
    # every column starts at the same place on every line
    for word in ("seq ", " r0 ", " BlockStored ", " block", " tokens", " hash "):
        assert len({ln.index(word) for ln in lines}) == 1, word


def test_pretty_columns_align_in_cells_with_wide_kind_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kind vLLM does not know yet, in CJK: two cells a character. Padding by characters
    # put the columns after it two cells further right on its line than on the others.
    from rich.cells import cell_len

    monkeypatch.setenv("COLUMNS", "200")
    rec = _record(
        tmp_path / "wide.mcap",
        [[_stored([1], 0, "注意力")], [_stored([2, 3], 1, "mamba")], [_stored([4], 2, "注意")]],
    )
    result = runner.invoke(app, ["replay", str(rec), "-f", "pretty"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    for word in (" block", " tokens", " hash "):
        assert len({cell_len(ln[: ln.index(word)]) for ln in lines}) == 1, word


def test_issue11_12_pretty_since_counts_from_the_file_start() -> None:
    result = runner.invoke(app, ["replay", str(GEMMA), "-f", "pretty", "--since", "1s"])
    t = float(result.stdout.split()[0].rstrip("s"))
    assert t >= 1.0


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "markdown"])
def test_issue11_12_report_into_head_exits_0(fmt: str) -> None:
    cmd = (
        f"{sys.executable} -m kvtool report {GEMMA} --every 1ms --wide --by kind,window,group "
        f"-f {fmt} | head -c 1 >/dev/null; echo $? ${{PIPESTATUS[0]}}"
    )
    proc = subprocess.run(
        ["bash", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout.split() == ["0", "0"], proc.stderr
    # nothing but the report's findings (R8's copy_choice on this capture)
    assert all(line.startswith("kvtool: finding: ") for line in proc.stderr.splitlines())


def test_issue11_12_replay_pretty_into_head_exits_0() -> None:
    cmd = (
        f"{sys.executable} -m kvtool replay {GEMMA} -f pretty | head -1 >/dev/null; "
        "echo ${PIPESTATUS[0]}"
    )
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["0"], proc.stderr


def test_issue11_12_plot_without_matplotlib_fails_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvtool.report as lib  # the report command imports build_report from here when it runs

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("the report was computed before matplotlib was checked")

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(lib, "build_report", boom)
    result = runner.invoke(app, ["report", str(GEMMA), "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 2
    assert "pip install 'kvtool[plot]'" in result.stderr


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_issue11_12_report_quiet_on_truncated_file_says_why(tmp_path: Path, fmt: str) -> None:
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(GEMMA.read_bytes()[:15000])
    result = runner.invoke(app, ["report", str(cut), "-q", "-f", fmt])
    assert result.exit_code == 3
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "truncated" in lines[0] and str(cut) in lines[0]


@pytest.mark.parametrize("width", [40, 80, 120])
def test_issue11_7_live_status_measures_wide_kinds_in_cells(width: int) -> None:
    """Kind names come from the network and may be CJK (two cells a character); the status
    used to count characters, so its lines overflowed the terminal and broke mid-segment."""
    from collections import Counter

    from rich.cells import cell_len
    from rich.console import Console

    from kvtool.capture import CaptureStats
    from kvtool.render.status import LiveStatus

    kinds = ["\u6ed1\u52a8\u7a97\u53e3\u6ce8\u610f\u529b", "\u5168\u6ce8\u610f\u529b"]
    stats = CaptureStats(
        batches=123_456,
        events=9_876_543,
        stores=Counter({f"{k}{i}": 10**9 + i for i in range(4) for k in kinds}),
        removes=Counter({f"{k}{i}": 10**6 + i for i in range(4) for k in kinds}),
        elapsed_ns=12 * 10**9,
    )
    console = Console(width=width, force_terminal=True)
    text = LiveStatus(console).render(stats).plain  # type: ignore[arg-type]
    for line in text.splitlines():
        assert cell_len(line) <= width, line
    assert "\u6ed1\u52a8\u7a97\u53e3\u6ce8\u610f\u529b0 1,000,000,000" in text
    assert "\u2026" not in text


# -- issue 24: one printable for every sink ---------------------------------------------------


def test_issue24_printable_escapes_every_format_and_separator_character() -> None:
    """Issue 24: 145 format characters (U+061C, U+2028/2029, soft hyphen, U+206A-206F, the
    TAG block) passed through printable() unchanged."""
    import unicodedata

    from kvtool.text import printable

    hidden = [
        chr(c)
        for c in range(0x110000)
        if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp", "Zs") and c != 0x20
    ]
    assert len(hidden) > 200
    for ch in hidden:
        shown = printable(f"full_attention{ch}")
        assert shown != f"full_attention{ch}" and shown.isprintable(), hex(ord(ch))
        assert shown.startswith("full_attention\\"), hex(ord(ch))
    for ch in ("\u061c", "\u2028", "\u2029", "\u00ad", "\u206a", "\u206f", "\U000e0041"):
        assert ch not in printable(f"a{ch}b")
    assert printable("\U000e0041") == "\\U000e0041"
    assert printable("注意力 full_attention é") == "注意力 full_attention é"


def test_issue24_two_kinds_never_print_as_one_row(tmp_path: Path) -> None:
    tagged = "full_attention\U000e0041"
    rec = _record(
        tmp_path / "tag.mcap",
        [[_stored([1], 0, "full_attention")], [_stored([2], 1, tagged)]],
    )
    result = runner.invoke(app, ["report", str(rec), "--by", "kind"])
    assert result.exit_code == 0, result.stderr
    rows = [ln.split()[0] for ln in result.stdout.splitlines() if "full_attention" in ln]
    # two rows, told apart (before: two rows that read "full_attention" alike)
    assert set(rows) == {"full_attention", "full_attention\\U000e0041"}
    assert rows.count("full_attention") == rows.count("full_attention\\U000e0041")


def test_issue24_markdown_passes_no_html_or_markup_from_a_kind(tmp_path: Path) -> None:
    rec = _record(
        tmp_path / "md.mcap",
        [
            [_stored([1], 0, "<img src=x onerror=alert(1)>")],
            [_stored([2], 1, "**bold** [link](http://x) `code` _em_")],
            [_stored([3], 2, "full_attention")],
        ],
    )
    for cmd in (
        ["report", str(rec), "-f", "markdown"],
        ["diff", str(rec), str(rec), "-f", "markdown", "--all"],
    ):
        result = runner.invoke(app, cmd)
        assert result.exit_code == 0, result.stderr
        out = result.stdout
        assert "<img" not in out and "&lt;img src=x onerror=alert(1)" in out
        assert "**bold**" not in out and "\\*\\*bold\\*\\*" in out
        assert "[link](" not in out and "\\[link\\](http://x)" in out
        assert "`code`" not in out and "\\_em\\_" in out
        assert "full_attention" in out  # an underscore inside a word stays as it is


def test_issue24_export_csv_cells_are_text_not_formulas(tmp_path: Path) -> None:
    rec = _record(
        tmp_path / "f.mcap",
        [
            [_stored([1], 0, '=HYPERLINK("http://x","click")')],
            [_stored([2], 1, "@SUM(A1:A9)")],
            [_stored([3], 2, "-1+2")],
            [_stored([4], 3, "+cmd")],
            [_stored([5], 4, f"zero\u200bwidth{EVIL}")],
        ],
    )
    out = tmp_path / "e.csv"
    result = runner.invoke(app, ["export", str(rec), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    kinds = [r["kind"] for r in csv.DictReader(io.StringIO(out.read_text()))]
    assert kinds == [
        '\'=HYPERLINK("http://x","click")',
        "'@SUM(A1:A9)",
        "'-1+2",
        "'+cmd",
        "zero\\u200bwidth\\x1b[2J\\x1b]0;pwned\\x07",
    ]
    report = runner.invoke(app, ["report", str(rec), "-f", "csv", "--by", "kind"])
    rkinds = {r["kind"] for r in csv.DictReader(io.StringIO(report.stdout))}
    assert set(kinds) <= rkinds  # one rule for both CSVs


@pytest.mark.parametrize(
    ("suffix", "magic"),
    [
        (".jpg", b"\xff\xd8\xff"),
        (".jpeg", b"\xff\xd8\xff"),
        (".tif", b"II*\x00"),
        (".webp", b"RIFF"),
        (".eps", b"%!PS-Adobe"),
        (".png", b"\x89PNG"),
    ],
)
def test_issue24_plot_formats_draw_quietly(tmp_path: Path, suffix: str, magic: bytes) -> None:
    """Issue 24: --plot out.jpg (.jpeg, .tif, .webp) was 'internal error: ValueError' (no
    metadata there), and .eps leaked a matplotlib warning through -q."""
    pytest.importorskip("matplotlib")
    out = tmp_path / f"plot{suffix}"
    result = runner.invoke(app, ["report", str(GEMMA), "-q", "-f", "json", "--plot", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    assert out.read_bytes().startswith(magic)
    cmd = [sys.executable, "-m", "kvtool", "report", str(GEMMA), "-q", "-f", "json"]
    proc = subprocess.run(
        [*cmd, "--plot", str(out), "--force"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stderr == ""  # matplotlib's own logging too


def test_issue24_plot_format_needing_latex_is_a_usage_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = runner.invoke(app, ["report", str(GEMMA), "--plot", str(tmp_path / "p.pgf")])
    assert result.exit_code == 2
    assert "cannot draw 'pgf' images; use one of .avif, .eps," in result.stderr
