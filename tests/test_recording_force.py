"""--force on a recording: the old one stays at its path until the new one has a message.

The new recording is written beside the old (locked, so a second writer refuses) and
takes its place in one rename when its first message is written; closed, aborted or
discarded without a message, it goes and the old recording is left as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtool.errors import RecordingError, RecordingPathError
from kvtool.recording import RecordingWriter, open_recording
from tests.conftest import capture_messages

PAYLOADS = [p for _t, _s, p in capture_messages("full_only")[:4]]


def _old(path: Path) -> bytes:
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557")
        for i, payload in enumerate(PAYLOADS[:2]):
            w.write(ch, i, payload, 1_000 + i)
    return path.read_bytes()


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("end", ["close", "abort", "discard"])
def test_no_message_leaves_the_old_recording(end: str, tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    old = _old(out)
    w = RecordingWriter(out, force=True)
    w.add_channel("tcp://127.0.0.1:5558")
    assert w.replaced_nothing
    assert out.read_bytes() == old  # untouched while the new one has no message
    if end == "close":
        w.close(ledger={"lost": 0})
    elif end == "abort":
        w.abort()
    else:
        assert w.discard_if_empty()
        w.close()
    assert out.read_bytes() == old
    assert _names(tmp_path) == ["r.mcap"]


def test_the_first_message_puts_the_new_recording_in_place(tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    _old(out)
    with RecordingWriter(out, force=True) as w:
        ch = w.add_channel("tcp://127.0.0.1:5558")
        w.write(ch, 7, PAYLOADS[3], 5_000)
        assert not w.replaced_nothing
        assert _names(tmp_path) == ["r.mcap"]
        with open_recording(out) as r:  # readable at its path from the first message on
            assert [m.seq for m in r.messages()] == [7]
        w.write(ch, 8, PAYLOADS[2], 6_000)
    with open_recording(out) as r:
        assert [m.data for m in r.messages()] == [PAYLOADS[3], PAYLOADS[2]]
    assert _names(tmp_path) == ["r.mcap"]


def test_a_second_writer_refuses_while_the_first_holds_the_old_recording(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r.mcap"
    old = _old(out)
    w = RecordingWriter(out, force=True)
    try:
        with pytest.raises(RecordingPathError, match="another kvtool process is writing it"):
            RecordingWriter(out, force=True)
    finally:
        w.close()
    assert out.read_bytes() == old


def test_issue24_force_replaces_any_regular_file_the_same_safe_way(tmp_path: Path) -> None:
    """Issue 24: --force refused a file that was not a kvtool recording (from its bytes).

    Now any regular file is replaced, as a recording is: it stays at its path, locked, until
    the new recording has a message; without one it is left as it was.
    """
    out = tmp_path / "r.mcap"
    out.write_bytes(b"precious")
    w = RecordingWriter(out, force=True)
    w.add_channel("tcp://127.0.0.1:5558")
    assert w.replaced_nothing
    with pytest.raises(RecordingPathError, match="another kvtool process is writing it"):
        RecordingWriter(out, force=True)
    w.close()
    assert out.read_bytes() == b"precious"
    assert _names(tmp_path) == ["r.mcap"]
    with RecordingWriter(out, force=True) as w:
        w.write(w.add_channel("tcp://127.0.0.1:5558"), 3, PAYLOADS[0], 3_000)
    with open_recording(out) as r:
        assert [m.seq for m in r.messages()] == [3]
    assert _names(tmp_path) == ["r.mcap"]


def test_through_a_symlink_the_file_it_names_is_replaced(tmp_path: Path) -> None:
    real = tmp_path / "data" / "r.mcap"
    real.parent.mkdir()
    _old(real)
    link = tmp_path / "latest.mcap"
    link.symlink_to(real)
    with RecordingWriter(link, force=True) as w:
        w.write(w.add_channel("tcp://127.0.0.1:5558"), 9, PAYLOADS[1], 9_000)
    assert link.is_symlink()
    with open_recording(real) as r:
        assert [m.seq for m in r.messages()] == [9]
    assert _names(real.parent) == ["r.mcap"]


def test_a_file_another_program_put_at_the_path_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "r.mcap"
    _old(out)
    w = RecordingWriter(out, force=True)
    ch = w.add_channel("tcp://127.0.0.1:5558")
    theirs = tmp_path / "theirs"
    theirs.write_bytes(b"not kvtool's")
    theirs.replace(out)  # another program (no kvtool lock) replaces the old recording
    with pytest.raises(RecordingError, match="another program put a file at the path"):
        w.write(ch, 1, PAYLOADS[0], 1_000)
    w.close()
    assert out.read_bytes() == b"not kvtool's"
    kept = [p for p in tmp_path.iterdir() if p.name != "r.mcap"]
    assert len(kept) == 1  # the new recording stays where it was written, named in the error
    with open_recording(kept[0]) as r:  # flushed before the rename was refused: readable
        assert [m.data for m in r.messages()] == [PAYLOADS[0]]
