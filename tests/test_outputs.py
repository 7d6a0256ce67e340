"""kvtool.outputs: no command writes over an input; --force replaces a file, or a kvtool directory.

Every test works inside ``tmp_path``: on the code before the fix these commands destroyed
files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.errors import ExitStatus, OutputError
from kvtool.outputs import (
    AtomicFile,
    OutputKind,
    check_output,
    is_kvtool_recording,
    kvtool_made,
    open_locked,
    write_text,
)
from kvtool.recording import RecordingPathError, RecordingWriter, open_recording
from tests.test_live_faults import free_port
from tests.test_report import record_capture

runner = CliRunner()


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    return record_capture("gemma3", tmp_path / "run.mcap")


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# -- 8.2: an output that is one of the inputs ------------------------------------------------


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotted"])
def test_issue8_2_replay_refuses_its_own_input(rec: Path, tmp_path: Path, how: str) -> None:
    before = rec.read_bytes()
    if how == "same":
        out = rec
    elif how == "symlink":
        out = tmp_path / "alias.mcap"
        out.symlink_to(rec)
    elif how == "hardlink":
        out = tmp_path / "twin.mcap"
        os.link(rec, out)
    else:
        out = tmp_path / "." / ".." / tmp_path.name / rec.name
    result = runner.invoke(app, ["replay", str(rec), "-o", str(out), "--force", "--kind", "mamba"])
    assert result.exit_code == ExitStatus.USAGE
    assert "is also an input" in _one_line(result.stderr)
    assert rec.read_bytes() == before


def test_issue8_2_report_refuses_its_own_input(rec: Path) -> None:
    before = rec.read_bytes()
    for args in (["-o", str(rec)], ["-o", str(rec), "--force"], ["--plot", str(rec), "--force"]):
        result = runner.invoke(app, ["report", str(rec), *args])
        assert result.exit_code == ExitStatus.USAGE, args
        assert rec.name in _one_line(result.stderr)
    assert rec.read_bytes() == before


def test_issue8_2_record_refuses_groups_file_as_output(tmp_path: Path) -> None:
    groups = tmp_path / "groups.json"
    groups.write_text('[{"group_idx": 0, "kind": "full_attention"}]')
    result = runner.invoke(
        app, ["record", "5557", "-o", str(groups), "--groups", str(groups), "--force"]
    )
    assert result.exit_code == ExitStatus.USAGE
    assert "is also an input" in _one_line(result.stderr)
    assert groups.read_text().startswith("[{")


def test_issue8_2_library_refuses_input(rec: Path) -> None:
    with pytest.raises(OutputError, match=r"is also an input"):
        check_output(rec, kind=OutputKind.RECORDING, force=True, inputs=[rec])
    with pytest.raises(OutputError, match=r"holds the input"):
        check_output(rec.parent, kind=OutputKind.EXPORT_DIR, force=True, inputs=[rec])


# -- 8.4: two writers of one path ------------------------------------------------------------


def _kvtool(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvtool", *args]


def test_issue8_4_second_recorder_of_same_output_refuses(tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = subprocess.Popen(
        _kvtool(
            "record", endpoint, "-o", str(out), "-q", "--duration", "120s", "--connect-timeout", "0"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # Wait (bounded) until the first recorder has written its header: it holds the lock.
        deadline = time.monotonic() + 60
        while not (out.exists() and is_kvtool_recording(out.read_bytes()[:512])):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first recorder never started"
            time.sleep(0.05)
        second = subprocess.run(
            _kvtool("record", endpoint, "-o", str(out), "--force", "-q", "--duration", "1s"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == ExitStatus.USAGE, second.stderr
        assert _one_line(second.stderr) == (
            f"kvtool: {out}: another kvtool process is writing it; choose another path"
        )
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    # The first recorder stopped without a batch: it leaves no empty file (issue 24), and
    # the second never touched it.
    assert first.returncode == ExitStatus.FAILED
    assert not out.exists()


def test_issue8_4_writer_lock_in_process(tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    with RecordingWriter(out) as w:
        with pytest.raises(RecordingPathError, match=r"another kvtool process is writing it"):
            RecordingWriter(out, force=True)
        w.write(
            w.add_channel("tcp://h:1"), 0, b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\xc0", 1
        )
    with RecordingWriter(out, force=True):  # released at close
        pass


def test_issue8_4_atomic_replace_respects_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    with RecordingWriter(out):
        af = AtomicFile(out, force=True)
        af.tmp.write_bytes(b"new")
        with pytest.raises(OutputError, match=r"another kvtool process is writing it"):
            af.commit()
    assert is_kvtool_recording(out.read_bytes())
    assert [p.name for p in tmp_path.iterdir()] == ["r.mcap"]


def test_issue8_4_recorder_starting_during_a_forced_replace_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recorder that opens the old file just before a ``--force`` copy is renamed over it
    must not go on writing into a file no path names any more (its recording lost).

    The race is made deterministic by starting the recorder at the moment of the rename;
    on the old code the lock was checked and released before the rename, so the recorder
    got the lock and its recording vanished.
    """
    out = tmp_path / "r.mcap"
    with RecordingWriter(out):
        pass
    af = AtomicFile(out, force=True)
    af.tmp.write_bytes(out.read_bytes())
    real_replace = os.replace
    started: list[object] = []

    def racing_replace(src: object, dst: object) -> None:
        try:
            started.append(RecordingWriter(out, force=True))
        except RecordingPathError as err:
            started.append(err)
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", racing_replace)
    af.commit()
    monkeypatch.undo()
    assert len(started) == 1
    assert isinstance(started[0], RecordingPathError), "the recorder writes a lost file"
    assert "another kvtool process is writing it" in str(started[0])


def test_issue8_4_open_locked_refuses_a_path_replaced_before_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the path is renamed over between open() and flock(), the lock guards a file no
    path names: open_locked refuses instead of recording into it (old code: it did)."""
    import fcntl

    import kvtool.outputs

    out = tmp_path / "r.mcap"
    with RecordingWriter(out):
        pass
    other = tmp_path / "other.mcap"
    other.write_bytes(out.read_bytes())
    real_flock = fcntl.flock

    def racing_flock(fd: int, op: int) -> None:
        if other.exists():
            os.replace(other, out)
        real_flock(fd, op)

    monkeypatch.setattr(kvtool.outputs.fcntl, "flock", racing_flock)
    with pytest.raises(OutputError, match="was replaced by another process"):
        open_locked(out, force=True, kind=OutputKind.RECORDING)
    monkeypatch.undo()
    assert is_kvtool_recording(out.read_bytes())  # the file now at the path is untouched


# -- 11.10: one --force rule ------------------------------------------------------------------


def test_issue11_10_report_output_needs_force(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    out.write_text("mine")
    result = runner.invoke(app, ["report", str(rec), "-o", str(out), "--format", "json"])
    assert result.exit_code == ExitStatus.USAGE
    assert _one_line(result.stderr) == f"kvtool: {out}: file exists; pass --force to overwrite it"
    assert out.read_text() == "mine"
    # --force replaces the regular file, whatever it holds (issue 24).
    result = runner.invoke(app, ["report", str(rec), "--output", str(out), "-f", "json", "--force"])
    assert result.exit_code == 0, result.stderr
    assert out.read_text().startswith("{")
    # kvtool's own output, of any command and format, is replaced by any other.
    for fmt in ("csv", "markdown", "table", "json"):
        result = runner.invoke(app, ["report", str(rec), "-o", str(out), "-f", fmt, "--force"])
        assert result.exit_code == 0, (fmt, result.stderr)
    for cmd in (["info", str(rec)], ["info", str(rec), "-f", "json"], ["diff", str(rec), str(rec)]):
        result = runner.invoke(app, [*cmd, "-o", str(out), "--force"])
        assert result.exit_code == 0, (cmd, result.stderr)


@pytest.mark.parametrize(
    "text",
    ["my notes\n", "x,y\n1,2\n", '{\n  "a": 1\n}\n', "### Notes\n", "A: hello\n", "#!/bin/sh\n"],
)
def test_issue24_force_replaces_a_regular_file_whatever_it_holds(
    rec: Path, tmp_path: Path, text: str
) -> None:
    """Issue 24: --force refused a user's regular file ('not a kvtool text file'), guessing
    from its first bytes. Now: without --force never replaced; with it, replaced whole."""
    out = tmp_path / "notes.txt"
    for cmd in (["report", str(rec)], ["info", str(rec)], ["diff", str(rec), str(rec)]):
        out.write_text(text)
        result = runner.invoke(app, [*cmd, "-o", str(out)])
        assert result.exit_code == ExitStatus.USAGE and "pass --force" in result.stderr, cmd
        assert out.read_text() == text
        result = runner.invoke(app, [*cmd, "-o", str(out), "--force"])
        assert result.exit_code == 0, (cmd, result.stderr)
        assert out.read_text() != text and text not in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run.mcap"]


def test_force_through_a_symlink_replaces_the_file_it_names(rec: Path, tmp_path: Path) -> None:
    # Before: the link itself was replaced by a regular file (and /dev/stdout with it).
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "today.txt"
    link = tmp_path / "latest.txt"
    link.symlink_to(Path("runs") / "today.txt")
    for _ in range(2):  # created through the link, then replaced through it
        result = runner.invoke(app, ["report", str(rec), "-o", str(link), "--force"])
        assert result.exit_code == 0, result.stderr
        assert link.is_symlink() and target.read_text().startswith("report: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.txt", "run.mcap", "runs"]


def test_output_that_is_our_stdout_is_written_not_replaced(rec: Path, tmp_path: Path) -> None:
    # `-o /dev/stdout > out.txt`: the shell's file, appended to; no --force needed, no
    # temporary file, the /dev/stdout link untouched.
    out = tmp_path / "out.txt"
    out.write_text("before\n")
    with open(out, "a") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", "report", str(rec), "-o", "/dev/stdout", "-f", "json"],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("before\n{") and text.rstrip().endswith("}")
    assert os.path.islink("/dev/stdout")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "run.mcap"]


def test_stderr_into_an_input_is_refused_without_writing_it(rec: Path) -> None:
    # Before: the refusal itself was written into the recording, cutting it off.
    before = rec.read_bytes()
    with open(rec, "ab") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", "report", str(rec)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=120,
        )
    assert proc.returncode == ExitStatus.USAGE
    assert rec.read_bytes() == before


def test_issue11_10_dash_is_stdout(rec: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(rec), "-o", "-", "--format", "json"])
    assert result.exit_code == 0 and result.stdout.startswith("{")
    assert not (Path.cwd() / "-").exists()
    result = runner.invoke(app, ["replay", str(rec), "-o", "-"])
    assert result.exit_code == 0, result.stderr
    copy = tmp_path / "copy.mcap"
    copy.write_bytes(result.stdout_bytes)
    with open_recording(copy) as r:
        assert len(list(r.messages())) > 0
    result = runner.invoke(app, ["export", str(rec), "-o", "-"])
    assert result.exit_code == ExitStatus.USAGE and "export writes files" in result.stderr


def test_issue24_force_replaces_a_foreign_file(rec: Path, tmp_path: Path) -> None:
    photo = tmp_path / "photo.mcap"
    for cmd in (["replay", str(rec), "--kind", "mamba"], ["report", str(rec)]):
        photo.write_bytes(b"\xff\xd8\xff\xe0 not a recording")
        result = runner.invoke(app, [*cmd, "-o", str(photo), "--force"])
        assert result.exit_code == 0, (cmd, result.stderr)
        assert photo.read_bytes() != b"\xff\xd8\xff\xe0 not a recording"
    assert photo.read_text().startswith("report: ")


# -- the rule, piece by piece -----------------------------------------------------------------


def test_issue24_a_kvtool_directory_is_known_by_its_mark_alone(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    assert not kvtool_made(d)
    (d / ".kvtool-export").write_text("")  # a file of that name is no mark
    assert not kvtool_made(d)
    (d / ".kvtool-export").unlink()
    (d / ".kvtool-export").symlink_to(tmp_path)  # nor a symlink to a directory
    assert not kvtool_made(d)
    (d / ".kvtool-export").unlink()
    (d / ".kvtool-export").mkdir()
    assert kvtool_made(d)
    with pytest.raises(OutputError, match="pass --force"):
        check_output(d, kind=OutputKind.EXPORT_DIR, force=False)
    check_output(d, kind=OutputKind.EXPORT_DIR, force=True)


def test_directories_and_devices(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"is a directory"):
        check_output(tmp_path, kind=OutputKind.TEXT, force=True)
    with pytest.raises(OutputError, match=r"directory .* does not exist"):
        check_output(tmp_path / "no" / "x.txt", kind=OutputKind.TEXT, force=False)
    check_output("/dev/null", kind=OutputKind.TEXT, force=False)  # a stream, nothing replaced
    write_text("/dev/null", "x", force=False)
    assert os.path.exists("/dev/null") and not Path("/dev/null").is_file()


def test_atomic_file_abort_and_race(tmp_path: Path) -> None:
    out = tmp_path / "o.txt"
    out.write_text("old")
    with pytest.raises(RuntimeError), AtomicFile(out, force=True) as af:
        af.tmp.write_text("half")
        raise RuntimeError
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["o.txt"]
    # Without --force, a file that appears meanwhile is never replaced.
    new = tmp_path / "n.txt"
    af = AtomicFile(new, force=False)
    af.tmp.write_text("mine")
    new.write_text("theirs")
    with pytest.raises(OutputError, match=r"file exists"):
        af.commit()
    assert new.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.txt", "o.txt"]


def test_atomic_file_keeps_umask_permissions(tmp_path: Path) -> None:
    out = tmp_path / "o.txt"
    write_text(out, "x", force=False)
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_issue24_open_locked_force_truncates_any_regular_file_under_the_lock(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r.mcap"
    out.write_bytes(b"precious")
    with open_locked(out, force=True, kind=OutputKind.RECORDING) as f:
        assert out.read_bytes() == b""
        with pytest.raises(OutputError, match="another kvtool process is writing it"):
            open_locked(out, force=True, kind=OutputKind.RECORDING)
        f.write(b"new")
    assert out.read_bytes() == b"new"


# -- a named pipe as output: written to when read, refused at once when nobody reads --------


def _no_hang(seconds: int) -> None:
    """Safety net for the old code, which blocked forever in open(): fail, not hang."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError("kvtool blocked opening the named pipe")

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)


@pytest.mark.parametrize("how", ["atomic", "locked"])
def test_issue8_13_fifo_output_without_reader_is_refused_not_hung(tmp_path: Path, how: str) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _no_hang(20)
    try:
        with pytest.raises(OutputError, match="a named pipe nobody reads"):
            if how == "atomic":
                write_text(fifo, "a,b\n", force=False)
            else:
                open_locked(fifo, force=True, kind=OutputKind.RECORDING)
    finally:
        signal.alarm(0)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_issue8_13_fifo_output_with_reader_gets_the_data(rec: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there first
    try:
        result = runner.invoke(app, ["report", str(rec), "-o", str(fifo), "--format", "csv"])
        assert result.exit_code == 0, result.output
        data = b""
        while chunk := os.read(reader, 1 << 16):
            data += chunk
    finally:
        os.close(reader)
    expected = runner.invoke(app, ["report", str(rec), "--format", "csv"]).stdout_bytes
    assert data == expected
    assert not [p.name for p in tmp_path.iterdir() if "kvtool-tmp" in p.name]


# -- stdout/stderr redirected into an input -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "stream", "mode"),
    [
        (["replay", "{IN}", "-o", "-"], "stdout", "ab"),  # >> run.mcap
        (["replay", "{IN}", "-o", "-"], "stdout", "r+b"),  # 1<> run.mcap: overwrote the head
        (["diff", "{IN}", "{IN}"], "stdout", "ab"),
        (["diff", "{IN}", "{IN}"], "stdout", "r+b"),
    ],
)
def test_issue8_2_std_stream_redirected_into_the_input_is_refused(
    rec: Path, tmp_path: Path, args: list[str], stream: str, mode: str
) -> None:
    """The shell opens the redirection, so no -o check saw it: on the old code these
    appended to (or overwrote the start of) the recording being read."""
    before = rec.read_bytes()
    argv = [a.replace("{IN}", str(rec)) for a in args]
    with open(rec, mode) as target:
        redirect = {stream: target}
        other = "stderr" if stream == "stdout" else "stdout"
        proc = subprocess.run(
            _kvtool(*argv), **redirect, **{other: subprocess.PIPE}, timeout=120, check=False
        )
    assert proc.returncode == ExitStatus.USAGE
    assert rec.read_bytes() == before
    assert _one_line(proc.stderr.decode()) == (
        f"kvtool: {rec}: stdout is redirected into this input; kvtool never writes over "
        "its input, send stdout elsewhere"
    )


def test_long_output_name_is_written_atomically(rec: Path, tmp_path: Path) -> None:
    """Old code: the temporary name (whole name + ~20 characters) was too long."""
    out = tmp_path / ("r" * 248 + ".mcap")
    result = runner.invoke(app, ["replay", str(rec), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert is_kvtool_recording(out.read_bytes())
    write_text(tmp_path / ("t" * 250 + ".txt"), "text\n", force=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["run.mcap", out.name, "t" * 250 + ".txt"]
    )


def test_write_failure_inside_an_atomic_file_is_one_line(tmp_path: Path) -> None:
    """A write that fails inside the block (a plot library writing the file itself on a
    full disk) left as OSError reached the user as 'internal error' on the old code; now
    one line naming the output, the old output kept and no temporary file left."""
    out = tmp_path / "t.txt"
    out.write_text("old\n")
    with (
        pytest.raises(OutputError, match=r"t\.txt: cannot write: No space left on device"),
        AtomicFile(out, force=True) as af,
        af.open_text() as f,
    ):
        f.write("new")
        raise OSError(28, "No space left on device")
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_issue24_plot_force_replaces_any_picture(rec: Path, tmp_path: Path) -> None:
    """Issue 24: --force replaced only a PNG, PDF or SVG naming kvtool as its maker."""
    pytest.importorskip("matplotlib")
    theirs = {
        "logo.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64),
        "paper.pdf": b"%PDF-1.5\n%\xe2\xe3\n1 0 obj << /Producer (pdfTeX) >> endobj\n",
        "diagram.svg": b'<?xml version="1.0"?>\n<!-- Created with Inkscape -->\n<svg/>\n',
    }
    for name, data in theirs.items():
        (tmp_path / name).write_bytes(data)
        result = runner.invoke(app, ["report", str(rec), "--plot", str(tmp_path / name)])
        assert result.exit_code == ExitStatus.USAGE and "pass --force" in result.stderr
        assert (tmp_path / name).read_bytes() == data
        result = runner.invoke(app, ["report", str(rec), "--plot", str(tmp_path / name), "--force"])
        assert result.exit_code == 0, (name, result.output)
        assert (tmp_path / name).read_bytes() != data


def test_a_cut_short_cleanup_still_removes_the_temporary_output(tmp_path: Path) -> None:
    # A second Ctrl-C (or `timeout` signalling the process and its group) used to land in
    # the clean-up of the first and leave a 100 MB temporary file beside the output: now
    # the first signal ignores the rest, and whatever is left goes at exit.
    out = tmp_path / "old.txt"
    out.write_text("report: old - 1 batches\n")
    code = """
import os, signal, sys, time
from kvtool import _signals
from kvtool.outputs import AtomicFile
_signals.install(["report"])
af = AtomicFile(sys.argv[1], force=True)  # never committed nor aborted
with open(af.tmp, "w") as f:
    f.write("x" * 100_000)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    os.kill(os.getpid(), signal.SIGINT)  # ignored, as is a SIGTERM now
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    _signals.interrupted()
"""
    proc = subprocess.run(
        [sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (ExitStatus.INTERRUPTED, "kvtool: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]
    assert out.read_text() == "report: old - 1 batches\n"


def test_output_to_our_stderr_shares_its_file_position(tmp_path: Path) -> None:
    # `-o /dev/stderr 2> e.txt`: the report and the lines printed after it share the one
    # descriptor; before, a descriptor of its own made the later lines overwrite the report.
    gaps = Path(__file__).resolve().parent.parent / "recordings" / "gemma3-gaps.mcap"
    out = tmp_path / "e.txt"
    with open(out, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", "report", str(gaps), "-o", "/dev/stderr"],
            stdout=subprocess.DEVNULL,
            stderr=f,
            timeout=120,
        )
    assert proc.returncode == ExitStatus.DAMAGED
    lines = out.read_text().splitlines()
    assert lines[0].startswith("report: ") and "by kind" in lines
    assert lines[-1].startswith("kvtool: ") and "lost while recording" in lines[-1]


def test_force_replaces_its_own_output_with_long_paths_and_one_batch(
    rec: Path, tmp_path: Path
) -> None:
    # The summary line wraps (long paths: 'batches' on the next line), a side of one
    # batch says 'batch': still kvtool's own output to --force.
    long_dir = tmp_path / ("a_rather_long_directory_name_for_runs_" * 3)
    long_dir.mkdir()
    a, b = long_dir / "a.mcap", long_dir / "b.mcap"
    a.write_bytes(rec.read_bytes())
    one = long_dir / "one.mcap"
    assert runner.invoke(app, ["replay", str(rec), "--seq", "0", "-o", str(one)]).exit_code == 0
    b.write_bytes(rec.read_bytes())
    out = tmp_path / "out.txt"
    for cmd in (
        ["report", str(a), str(b)],
        ["diff", str(a), str(b), "--", str(a)],
        ["diff", str(one), str(one)],
        ["info", str(a)],
        ["report", str(one), "-f", "markdown"],
    ):
        out.unlink(missing_ok=True)
        for extra in ([], ["--force"]):
            result = runner.invoke(app, [*cmd, "-o", str(out), *extra])
            assert result.exit_code == 0, (cmd, extra, result.stderr)
