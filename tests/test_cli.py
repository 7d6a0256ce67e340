"""Generic command-line behaviour: help, version, ``python -m kvtool``, usage errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

import kvtool
from kvtool.cli import app
from tests.recutil import write_capture

runner = CliRunner()
COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_issue_command_is_registered() -> None:
    assert {"info", "record", "replay", "report"} <= set(COMMANDS)


def test_root_help_lists_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert result.stderr == ""
    for name in COMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name: str) -> None:
    result = runner.invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ") or "Usage:" in result.stdout
    assert f"kvtool {name}" in result.stdout or f" {name} " in result.stdout
    assert "Traceback" not in result.output
    # A real description, not just the usage line.
    assert len(result.stdout.strip().splitlines()) > 3


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"kvtool {kvtool.__version__}\n"


def test_python_dash_m(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"kvtool {kvtool.__version__}\n"


def test_python_dash_m_info_on_truncated_file(tmp_path: Path) -> None:
    # Exit status 3 and exactly one stderr line from a real process: no traceback.
    path = tmp_path / "cut.mcap"
    write_capture(path, "gemma3", chunk_size=2048)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "truncated" in lines[0]
    assert "Batches:" in proc.stdout


def test_no_arguments_shows_help_and_usage_status() -> None:
    result = runner.invoke(app, [])
    assert result.exit_code == 2
    assert "Usage:" in result.output


def test_unknown_command_is_usage_error() -> None:
    result = runner.invoke(app, ["frobnicate"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "No such command 'frobnicate'" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_unknown_flag_is_usage_error(name: str) -> None:
    result = runner.invoke(app, [name, "--no-such-flag"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "No such option: --no-such-flag" in result.stderr
    assert "Traceback" not in result.output


def test_bad_choice_is_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "r.mcap"
    write_capture(path, limit=2)
    result = runner.invoke(app, ["info", "--format", "yaml", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "'yaml' is not one of 'table', 'json'" in result.stderr


def test_missing_argument_is_usage_error() -> None:
    result = runner.invoke(app, ["info"])
    assert result.exit_code == 2
    assert "Missing argument" in result.stderr


def test_traceback_flag_reraises(tmp_path: Path) -> None:
    path = tmp_path / "x.mcap"
    path.write_text("not mcap")
    plain = runner.invoke(app, ["info", str(path)])
    assert plain.exit_code == 1 and plain.exception is not None  # SystemExit only
    assert isinstance(plain.exception, SystemExit)
    loud = runner.invoke(app, ["--traceback", "info", str(path)])
    assert loud.exit_code == 1
    assert type(loud.exception).__name__ == "RecordingError"


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["replay", "--no-such-flag", "x.mcap"], "kvtool replay: No such option: --no-such-flag"),
        (["report"], "kvtool report: Missing argument"),
        (["record", "--dp-size", "0", "-o", "x.mcap", "5557"], "kvtool record: Invalid value"),
        (["nosuch"], "kvtool: No such command 'nosuch'"),
    ],
)
def test_console_script_usage_errors_are_one_line(args: list[str], expect: str) -> None:
    """Click's usage errors reach a user of the real entry point as one line, exit 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvtool", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(expect)


# -- review leftovers of issues 8 and 11 ----------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
GEMMA = ROOT / "recordings" / "gemma3.mcap"
GAPS = ROOT / "recordings" / "gemma3-gaps.mcap"


def _kvtool(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-m", "kvtool", *args], timeout=120, check=False, **kwargs
    )


@pytest.mark.parametrize(
    "args",
    [
        ["report", "{rec}"],
        ["report", "{rec}", "-o", "-"],
        ["replay", "{rec}", "--format", "jsonl"],
        ["info", "{rec}"],
        ["diff", "{rec}", "{other}"],
        ["export", "{rec}", "-o", "{tmp}/out.parquet"],
        ["top", "{rec}", "--once", "--speed", "0"],
    ],
    ids=lambda a: " ".join(a[:2] if a[0] != "report" else a[:1] + a[2:]),
)
def test_issue8_2_stdout_into_an_input_is_refused(args: list[str], tmp_path: Path) -> None:
    """``kvtool report c.mcap -o - 1<> c.mcap`` overwrote the recording it read."""
    rec = tmp_path / "c.mcap"
    rec.write_bytes(GEMMA.read_bytes())
    before = rec.read_bytes()
    argv = [a.format(rec=rec, other=GEMMA, tmp=tmp_path) for a in args]
    with open(rec, "r+b") as out:  # the shell's `1<> c.mcap`
        proc = _kvtool(argv, stdout=out, stderr=subprocess.PIPE)
    assert proc.returncode == 2, proc.stderr
    assert rec.read_bytes() == before
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and "stdout is redirected into this input" in lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["replay", str(GEMMA), "--rank", "²"],
        ["replay", str(GEMMA), "--rank", "٣"],
        ["replay", str(GEMMA), "--window", "²"],
        ["replay", str(GEMMA), "--group", "٣"],
        ["report", str(GEMMA), "--group-meta", "²=full_attention"],
        ["report", str(GEMMA), "--group-meta", "0=full_attention:²"],
        ["report", str(GEMMA), "--group-meta", "0=full_attention:٣"],
    ],
)
def test_issue8_14_non_ascii_digits_are_usage_errors(args: list[str]) -> None:
    """``'²'.isdigit()`` is True (int() then crashed) and '٣' was read as 3."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "internal error" not in result.stderr


def test_issue11_12_plot_write_error_is_reported(tmp_path: Path) -> None:
    """``report --plot /dev/full`` said "plot written" and exited 0."""
    pytest.importorskip("matplotlib")
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    proc = _kvtool(
        ["report", str(GEMMA), "--plot", "/dev/full", "-o", str(tmp_path / "r.txt")],
        capture_output=True,
    )
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "plot written" not in err
    assert err.splitlines() == [
        "kvtool: /dev/full: cannot write: No space left on device; the output is left as it was"
    ]


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_issue8_1_plot_names_kvtool_as_its_maker(suffix: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    image = tmp_path / f"run{suffix}"
    result = runner.invoke(app, ["report", str(GEMMA), "--plot", str(image), "-q"])
    assert result.exit_code == 0, result.stderr
    assert b"kvtool" in image.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == [image.name]  # no temporary left


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(GEMMA)],
        ["report", str(GEMMA), "--format", "json"],
        ["diff", str(GEMMA), str(GEMMA)],
        ["info", str(GEMMA)],
        ["replay", str(GEMMA), "--format", "jsonl"],
        ["replay", str(GEMMA), "--format", "pretty"],
    ],
)
def test_issue11_12_full_stdout_is_one_line(args: list[str]) -> None:
    """``> /dev/full`` gave "internal error: OSError [Errno 28]"."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with open("/dev/full", "wb") as full:
        proc = _kvtool(args, stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert proc.stderr.decode() == "kvtool: cannot write to stdout: No space left on device\n"


def test_issue8_3_sigterm_removes_temporary_outputs(tmp_path: Path) -> None:
    """SIGTERM skipped cleanup: ``.NAME.*.kvtool-tmp`` files stayed beside the output."""
    import signal

    import zmq

    ctx = zmq.Context.instance()
    probe = ctx.socket(zmq.PUB)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(linger=0)
    out = tmp_path / "out.mcap"
    log = tmp_path / "stderr.txt"
    # Waiting for a subscriber that never comes holds the -o temporary open: no timing.
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvtool",
                "replay",
                str(GEMMA),
                "--publish",
                f"tcp://127.0.0.1:{port}",
                "--wait-subscribers",
                "1",
                "-o",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        polls = 600
        while not list(tmp_path.glob(".out.mcap.*.kvtool-tmp*")) and polls:
            assert proc.poll() is None, log.read_text()
            polls -= 1
            time.sleep(0.1)  # polling for the file, not timing anything
        assert list(tmp_path.glob(".out.mcap.*.kvtool-tmp*")), "the temporary never appeared"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not list(tmp_path.glob("*kvtool-tmp*"))
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    "args",
    [
        ["info", str(GAPS)],
        ["report", str(GAPS)],
        ["report", str(GAPS), "-q", "--format", "json"],
        ["replay", str(GAPS), "--format", "jsonl"],
        ["export", str(GAPS), "-o", "{tmp}/e.parquet"],
        ["diff", str(GEMMA), str(GAPS)],
    ],
)
def test_issue11_12_lost_batches_exit_3_everywhere(args: list[str], tmp_path: Path) -> None:
    """One policy: 3 = finished, but batches were lost (``report`` exited 0)."""
    argv = [a.format(tmp=tmp_path) for a in args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 3, result.stderr
    assert "3 batch" in result.stderr and "lost while recording" in result.stderr


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_issue11_10_help_has_examples_placeholders_and_fits(name: str | None) -> None:
    """-h is --help; real placeholders, never ``<list[Path]>``; 2-4 examples; 80 columns."""
    args = [name] if name else []
    long = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    short = runner.invoke(app, [*args, "-h"], env={"COLUMNS": "80"})
    assert long.exit_code == short.exit_code == 0, short.output
    assert short.stdout == long.stdout
    text = long.stdout
    assert "<list[" not in text and "{files}" not in text
    assert not re.search(r" <(str|path|int|float|int range|bool)>", text), text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    examples = text.split("Examples:\n", 1)[1].splitlines()
    runs = [ln for ln in examples if ln.strip().startswith("kvtool ")]
    assert 2 <= len(runs) <= 4, examples
    assert all(ln.strip().startswith(f"kvtool {name or ''}") for ln in runs)
    if name in ("report", "replay", "record"):  # long option lists come in panels
        assert {"Output:", "Annotation:" if name != "record" else "Gap recovery:"} <= set(
            text.splitlines()
        )


def test_issue11_10_usage_shows_placeholders() -> None:
    usage = {n: runner.invoke(app, [n, "-h"]).stdout.splitlines()[0] for n in COMMANDS}
    assert usage["report"] == "Usage: kvtool report [OPTIONS] FILE..."
    assert usage["record"] == "Usage: kvtool record [OPTIONS] ENDPOINT..."
    assert usage["info"] == "Usage: kvtool info [OPTIONS] FILE..."


def test_issue11_10_replay_group_does_one_job(tmp_path: Path) -> None:
    """--group IDX filters; metadata is --group-meta; the old form says what to type."""
    old = runner.invoke(app, ["replay", str(GEMMA), "--annotate", "--group", "0=full_attention"])
    assert old.exit_code == 2
    assert old.stderr.splitlines() == [
        "kvtool: --group '0=full_attention': --group IDX keeps events of a group; give group "
        "metadata as --group-meta 0=full_attention"
    ]
    meta = runner.invoke(
        app,
        [
            "replay",
            str(GEMMA),
            "--annotate",
            "--group-meta",
            "0=mamba",
            "--group",
            "0",
            "--format",
            "jsonl",
            "--type",
            "BlockStored",
        ],
    )
    assert meta.exit_code == 0, meta.stderr
    rows = [json.loads(line) for line in meta.stdout.splitlines()]
    assert rows and {r["group_idx"] for r in rows} == {0}
    assert {r["kv_cache_spec_kind"] for r in rows} == {"mamba"}


@pytest.mark.parametrize("cmd", [["report", str(GEMMA)], ["diff", str(GEMMA), str(GEMMA)]])
def test_issue24_group_is_no_hidden_alias_of_group_meta(cmd: list[str]) -> None:
    """Issue 24: --group was a hidden alias of --group-meta in report but a filter in replay."""
    result = runner.invoke(app, [*cmd, "--group", "0=mamba", "-f", "json"])
    assert result.exit_code == 2
    assert "No such option: --group" in result.stderr and "--group-meta" in result.stderr
    assert runner.invoke(app, [*cmd, "--group-meta", "0=mamba", "-f", "json"]).exit_code == 0


def test_issue11_10_record_replay_endpoint_and_hidden_alias() -> None:
    for name in ("record", "top"):
        text = runner.invoke(app, [name, "-h"]).stdout
        assert "--replay-endpoint ENDPOINT" in text
        assert "--replay " not in text and "--replay," not in text
    # The old name still parses (the usage error is about the missing -o, not --replay).
    old = runner.invoke(app, ["record", "5557", "--replay", "5558"])
    assert old.exit_code == 2 and "--output" in old.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["info", str(GEMMA), "--format", "json"],
        ["diff", str(GEMMA), str(GEMMA), "--format", "json"],
        ["report", str(GEMMA), "--format", "json"],
    ],
)
def test_issue11_10_one_output_option(args: list[str], tmp_path: Path) -> None:
    """-o/--output FILE (- for stdout) on every text command, under one --force rule."""
    target = tmp_path / "out.json"
    to_stdout = runner.invoke(app, [*args, "-o", "-"])
    assert to_stdout.exit_code == 0, to_stdout.stderr
    first = runner.invoke(app, [*args, "--output", str(target)])
    assert first.exit_code == 0, first.stderr
    assert first.stdout == ""
    assert json.loads(target.read_text()) == json.loads(to_stdout.stdout)
    again = runner.invoke(app, [*args, "-o", str(target)])
    assert again.exit_code == 2 and "pass --force" in again.stderr
    assert runner.invoke(app, [*args, "-o", str(target), "--force"]).exit_code == 0


# -- issue 24: every number agrees, every output is honest ---------------------------------


def _pipeline(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cmd}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "80", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )


KV = f"{sys.executable} -m kvtool"


@pytest.mark.parametrize(
    ("cmd", "status"),
    [
        # a crossed --fail-on behind head: the CI gate still fails
        (f"{KV} diff {GEMMA} {GAPS} --fail-on blocks_removed:1 | head -1", 1),
        (f"{KV} diff {GEMMA} {GAPS} --fail-on blocks_removed:1 -f json | head -c 10", 1),
        # lost batches: exit 3 behind head too
        (f"{KV} report {GAPS} -f csv | head -1", 3),
        (f"{KV} replay {GAPS} -f jsonl | head -1", 3),
        (f"{KV} replay {GAPS} -f pretty | head -1", 3),
        # a --check disagreement
        (
            f"{KV} replay {GEMMA} --check --group-meta 0=mamba --group-meta 1=mamba"
            " --group-meta 2=mamba --group-meta 3=mamba --group-meta 4=mamba"
            " --group-meta 5=mamba | head -1",
            1,
        ),
        # and a clean run stays 0
        (f"{KV} replay {GEMMA} -f jsonl | head -1", 0),
        (f"{KV} diff {GEMMA} {GEMMA} --fail-on blocks_removed:1 | head -1", 0),
    ],
)
def test_issue24_exit_status_survives_a_closed_stdout(cmd: str, status: int) -> None:
    """Issue 24: `| head` turned every exit status into 0 (BrokenPipeError mapped to OK)."""
    proc = _pipeline(f"{cmd} >/dev/null")
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_issue24_replay_copy_to_a_pipe(tmp_path: Path) -> None:
    """Issue 24: `replay -o - | cat > c.mcap` failed with 'Illegal seek'."""
    piped, direct = tmp_path / "piped.mcap", tmp_path / "direct.mcap"
    proc = _pipeline(f"{KV} replay {GEMMA} -q -o - | cat > {piped}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert _pipeline(f"{KV} replay {GEMMA} -q -o - > {direct}").returncode == 0
    from kvtool.recording import open_recording

    with open_recording(piped) as a, open_recording(direct) as b:
        ma = [(m.seq, m.data) for m in a.messages()]
        mb = [(m.seq, m.data) for m in b.messages()]
        assert a.recovery.complete  # a summary and footer whose offsets are right
    assert ma == mb and len(ma) == 64
