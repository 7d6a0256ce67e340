"""Output paths: the one place that decides what kvtool may write, replace or lock.

The rule, for every command that writes (``record -o``, ``replay -o``, ``report -o``,
``report --plot``, ``export -o``):

- An output that is one of the command's inputs (same device and inode, through any
  symlink or hard link) is refused, and so is a directory output that holds an input.
- An existing output is refused unless ``--force`` is given. With it (DESIGN.md, "Several
  inputs"), a regular file is replaced atomically, whatever it holds; a directory (an
  ``export`` output) only if kvtool created it, which it marks by the empty directory
  :data:`EXPORT_MARKER` it makes inside (polars, DuckDB, Spark and pyarrow skip a hidden
  directory, and an empty one holds no file whose extension would trip a scan). Nothing is
  decided from a file's contents: no sniffing of headers, magic bytes or metadata.
  An empty directory is no output to replace: an export is written there without
  ``--force``.
  A directory is never replaced by a file output, nor a block device or socket. A
  character device or FIFO (``/dev/null``, a named pipe) is written to as a stream:
  nothing is replaced. A named pipe nobody reads is refused at once, not waited on.
- Files are written to a temporary name in the output's directory and renamed into
  place only when complete (:class:`AtomicFile`), so a failure leaves the old output
  intact. A recording that ``record`` writes is the exception: it is written in place so
  a killed recorder leaves a readable file at the path given, under an exclusive lock
  (:func:`open_locked`) so a second writer of the same path refuses.
- ``-`` means stdout where the output is a stream (``report -o -``, ``replay -o -``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import IO

from kvtool.errors import OutputError

PARQUET_KEY = "kvtool"
"""The Parquet key-value metadata key kvtool writes into its Parquet files (which version
wrote which table; for readers, never what ``--force`` decides by)."""
MCAP_MAGIC = b"\x89MCAP0\r\n"
KVTOOL_PROFILE = "kvtool"
EXPORT_MARKER = ".kvtool-export"
"""The empty directory kvtool makes inside every export directory it creates: the one mark
``--force`` replaces a directory by (never a file's contents)."""

PathLike = str | os.PathLike[str]


class OutputKind(StrEnum):
    """What an output is: a directory (an export) or a file of some kind."""

    RECORDING = "recording"
    PARQUET = "Parquet file"
    TEXT = "text file"
    IMAGE = "image"
    EXPORT_DIR = "export directory"


def is_stdout(path: PathLike | None) -> bool:
    """Return True when ``path`` is ``-``, the spelling of stdout for stream outputs."""
    return path is not None and os.fspath(path) == "-"


def _stat(path: PathLike) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise OutputError(f"{os.fspath(path)}: cannot check the output: {err.strerror}") from err


def same_file(a: PathLike, b: PathLike) -> bool:
    """Return True when ``a`` and ``b`` are the same file (device and inode, links followed).

    Args:
        a: A path.
        b: Another path.

    Returns:
        True when both exist and are one file.
    """
    sa, sb = _stat(a), _stat(b)
    return sa is not None and sb is not None and (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _inside(path: PathLike, directory: PathLike) -> bool:
    try:
        Path(path).resolve().relative_to(Path(directory).resolve())
    except ValueError:
        return False
    return True


def check_not_input(output: PathLike, inputs: Iterable[PathLike]) -> None:
    """Refuse an output that is one of the inputs, or a directory that holds one.

    Args:
        output: The output path.
        inputs: Every file the command reads (recordings, groups files).

    Raises:
        OutputError: The output is an input (same device and inode), or lies around one.
    """
    out = os.fspath(output)
    st = _stat(out)
    for inp in inputs:
        i = os.fspath(inp)
        if i == "-":
            continue
        if same_file(out, i):
            raise OutputError(
                f"{out}: is also an input ({i}); kvtool never writes over its input, "
                "choose another output path"
            )
        if st is not None and stat.S_ISDIR(st.st_mode) and _inside(i, out):
            raise OutputError(
                f"{out}: holds the input {i}; choose an output directory outside the inputs"
            )


def check_std_streams_not_inputs(inputs: Iterable[PathLike]) -> None:
    """Refuse when stdout or stderr is redirected into one of the inputs.

    ``kvtool report run.mcap >> run.mcap`` (or ``1<> run.mcap``, ``2>> run.mcap``) writes
    into the recording being read: appended text cuts the file off from its summary and
    footer, and ``1<>`` overwrites its first bytes. The shell opened that file, so no
    ``-o`` check sees it; the descriptors are compared with the inputs instead.

    Args:
        inputs: Every file the command reads.

    Raises:
        OutputError: File descriptor 1 or 2 is one of the inputs (same device and inode).
    """
    streams = _file_std_streams()
    if not streams:
        return
    for inp in inputs:
        i = os.fspath(inp)
        if i == "-":
            continue
        si = _stat(i)
        if si is None:
            continue
        for fd, st in streams:
            if (st.st_dev, st.st_ino) == (si.st_dev, si.st_ino):
                name = "stdout" if fd == 1 else "stderr"
                if fd == 2:
                    # Saying so on stderr would write into the input: say nothing there
                    # (the exit status tells), and let nothing later write there either.
                    silence_fd(2)
                raise OutputError(
                    f"{i}: {name} is redirected into this input; kvtool never writes over "
                    f"its input, send {name} elsewhere"
                )


def silence_fd(fd: int) -> None:
    """Point descriptor ``fd`` at /dev/null: nothing written there arrives anywhere.

    For a stream that must not be written any more: stderr redirected into an input, or
    stdout whose reader went away (what is still buffered is dropped, and the
    interpreter's final flush neither fails nor prints "Exception ignored").

    Args:
        fd: The descriptor.
    """
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(devnull, fd)
        os.close(devnull)


def _file_std_streams() -> list[tuple[int, os.stat_result]]:
    """Our stdout and stderr where they are regular files (a shell's ``>``): (fd, stat)."""
    streams = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            streams.append((fd, st))
    return streams


def _std_stream_fd(path: PathLike) -> int | None:
    """Return 1 or 2 when ``path`` names the regular file our stdout or stderr is, else None.

    ``-o /dev/stdout`` with ``> out.txt``: a stream the shell opened for us, written to
    through that very descriptor (one file position, so nothing printed later lands on
    top of the output), never replaced.
    """
    st = _stat(path)
    if st is None or not stat.S_ISREG(st.st_mode):
        return None
    for fd, sfd in _file_std_streams():
        if (sfd.st_dev, sfd.st_ino) == (st.st_dev, st.st_ino):
            return fd
    return None


def is_kvtool_recording(head: bytes) -> bool:
    """Return True when ``head`` (a file's first bytes) starts a kvtool MCAP recording.

    For readers and tests; never what decides whether ``--force`` replaces a file.

    Args:
        head: At least the first few hundred bytes of the file.

    Returns:
        True for MCAP magic followed by a Header record of profile ``kvtool``.
    """
    if not head.startswith(MCAP_MAGIC) or len(head) < len(MCAP_MAGIC) + 13:
        return False
    pos = len(MCAP_MAGIC)
    if head[pos] != 0x01:  # Header record
        return False
    n = int.from_bytes(head[pos + 9 : pos + 13], "little")
    profile = head[pos + 13 : pos + 13 + n]
    return len(profile) == n and profile == KVTOOL_PROFILE.encode()


def kvtool_made(directory: PathLike) -> bool:
    """Return True when kvtool created ``directory`` (it holds the :data:`EXPORT_MARKER`).

    Only the marker's presence counts (a real directory, not a symlink to one); no file in
    ``directory`` is opened.

    Args:
        directory: An existing directory.

    Returns:
        Whether ``--force`` may replace it.
    """
    try:
        st = os.lstat(os.path.join(directory, EXPORT_MARKER))
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode)


def mark_kvtool_made(directory: PathLike) -> None:
    """Mark a directory kvtool just created as its own (see :func:`kvtool_made`).

    Args:
        directory: The new directory.
    """
    os.mkdir(os.path.join(directory, EXPORT_MARKER))


def check_output(
    output: PathLike, *, kind: OutputKind, force: bool, inputs: Iterable[PathLike] = ()
) -> None:
    """Refuse an output path kvtool must not write (the rule in the module docstring).

    Args:
        output: The output path (``-`` is stdout and always allowed).
        kind: What the command writes there.
        force: ``--force`` was given.
        inputs: Every file the command reads.

    Raises:
        OutputError: The output is an input, exists without ``force``, is not kvtool's to
            replace, or its directory does not exist.
    """
    out = os.fspath(output)
    inputs = list(inputs)
    check_std_streams_not_inputs(inputs)
    if out == "-":
        return
    check_not_input(out, inputs)
    st = _stat(out)
    if st is None:
        parent = Path(out).parent
        if not parent.is_dir():
            raise OutputError(f"{out}: directory {parent} does not exist")
        return
    if kind is OutputKind.EXPORT_DIR:
        _check_export_dir(Path(out), st, force)
        return
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{out}: is a directory; give a file name")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or _std_stream_fd(out):
        return  # a stream (/dev/null, a named pipe, our stdout): written to, not replaced
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{out}: not a regular file; kvtool writes only regular files")
    if not force:
        raise OutputError(f"{out}: file exists; pass --force to overwrite it")


def _check_export_dir(out: Path, st: os.stat_result, force: bool) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{out}: exists and is not a directory; give a directory name")
    if not any(out.iterdir()):
        return
    if not force:
        raise OutputError(f"{out}: directory exists; pass --force to replace kvtool's export in it")
    if not kvtool_made(out):
        raise OutputError(
            f"{out}: a directory kvtool did not create (no {EXPORT_MARKER} in it); --force "
            "replaces only a directory kvtool exported to, choose another path"
        )


_TEMPS: dict[str, bool] = {}
"""Temporary outputs kvtool made and has not yet moved into place nor removed (path:
is a directory), of this process (:data:`_TEMPS_PID`)."""
_TEMPS_PID = 0


def track_temp(path: PathLike, *, is_dir: bool = False) -> None:
    """Remember a temporary output kvtool just made, until :func:`untrack_temp`.

    Whatever is still remembered when the process exits (normally, or through an
    interrupt that cut a clean-up short: a second Ctrl-C, a signal sent to the process
    group and the process) is removed then (:func:`remove_temps`, run at exit).

    Args:
        path: The temporary file, or the new directory kvtool made (never a user's).
        is_dir: It is a directory (removed with everything kvtool wrote in it).
    """
    global _TEMPS_PID
    if os.getpid() != _TEMPS_PID:
        _TEMPS.clear()  # a forked child: its parent's temporaries are not its own
        if _TEMPS_PID == 0:
            import atexit

            atexit.register(remove_temps)
        _TEMPS_PID = os.getpid()
    _TEMPS[os.fspath(path)] = is_dir


def untrack_temp(path: PathLike) -> None:
    """Forget a temporary output: it was moved into place, or removed."""
    _TEMPS.pop(os.fspath(path), None)


def remove_temps() -> None:
    """Remove every temporary output still remembered (:func:`track_temp`)."""
    if os.getpid() != _TEMPS_PID:
        return
    import shutil

    for path, is_dir in list(_TEMPS.items()):
        with contextlib.suppress(OSError):
            if is_dir:
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        _TEMPS.pop(path, None)


def temp_prefix(name: str) -> str:
    """Return the prefix of a temporary name beside the output ``name``.

    Hidden, and naming the output for a user who finds one after a crash, but cut short:
    with the random part and ``.kvtool-tmp`` appended, the whole output name would make a
    name too long for the file system (255 bytes) whenever the output's own name is long.

    Args:
        name: The output's file name.

    Returns:
        ``.NAME.`` with NAME at most 64 characters.
    """
    return f".{name[:64]}."


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _holding_lock(path: PathLike) -> Iterator[None]:
    """Hold the writer's lock on the existing file ``path`` (if any) for the block.

    Replacing a file under its lock closes the race a plain check leaves open: a recorder
    that opens the old file meanwhile cannot lock it and refuses, instead of going on to
    write into a file no path names any more.

    Raises:
        OutputError: Another kvtool process holds the lock (is writing ``path``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(
                f"{os.fspath(path)}: another kvtool process is writing it; choose another path"
            ) from None
        yield
    finally:
        os.close(fd)


def _link_target(path: PathLike) -> Path:
    """The file a symlink names (what kvtool writes and replaces), else ``path`` itself.

    A link whose target has no name to replace (``/dev/stdout`` on a pipe or terminal:
    ``pipe:[…]``) stays as given: it is written to as a stream.
    """
    p = Path(path)
    if not os.path.islink(p):
        return p
    real = Path(os.path.realpath(p))
    st, rst = _stat(p), _stat(real)
    if st is None or (rst is not None and (st.st_dev, st.st_ino) == (rst.st_dev, rst.st_ino)):
        return real  # dangling: the file it names is created, as the shell's `>` would
    return p


def _is_stream(path: PathLike) -> bool:
    st = _stat(path)
    return st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode))


def _open_stream(path: PathLike) -> int:
    """Open a character device or FIFO output for writing, without waiting for a reader.

    A plain ``open()`` of a FIFO nobody reads blocks forever (no deadline, and a recorder
    that converts SIGTERM into a flag never stops); opening it non-blocking fails at once
    instead, so kvtool says so. The descriptor is switched back to blocking writes.

    Returns:
        The descriptor, open for writing.

    Raises:
        OutputError: A FIFO with no process reading it, or it cannot be opened.
    """
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ENXIO:
            raise OutputError(
                f"{p}: a named pipe nobody reads; start its reader first (kvtool does not "
                "wait for one)"
            ) from None
        raise OutputError(f"{p}: cannot open: {err.strerror}") from err
    os.set_blocking(fd, True)
    return fd


class AtomicFile:
    """A file written under a temporary name beside its target and renamed into place.

    Until :meth:`commit`, the target is untouched; :meth:`abort` (or leaving the ``with``
    block with an exception) removes the temporary file. Without ``force`` the commit
    links the file into place and fails if something appeared at the target meanwhile.
    A character device or FIFO target is written to directly.

    Args:
        path: The target (already checked with :func:`check_output`).
        force: Replace an existing target.

    Attributes:
        path: The target.
        tmp: Where to write; keeps the target's suffix (plot libraries pick the format
            from it).
    """

    def __init__(self, path: PathLike, *, force: bool) -> None:
        # Through a symlink, the file it names is written and replaced, never the link
        # (a user's `latest.txt -> runs/today.txt`, or /dev/stdout itself).
        self.path = _link_target(path)
        self.force = force
        self._done = False
        std = _std_stream_fd(self.path)
        self.direct = std is not None or _is_stream(self.path)
        self._stream_fd: int | None = None
        if std is not None:
            self.tmp = self.path
            sys.stdout.flush() if std == 1 else sys.stderr.flush()
            self._stream_fd = os.dup(std)
            return
        if self.direct:
            self.tmp = self.path
            # Opened now, so a FIFO without a reader fails here instead of hanging later;
            # held until commit so the reader sees end of file only when kvtool is done.
            self._stream_fd = _open_stream(self.path)
            return
        try:
            fd, tmp = tempfile.mkstemp(
                prefix=temp_prefix(self.path.name),
                suffix=f".kvtool-tmp{self.path.suffix[:16]}",
                dir=self.path.parent,
            )
        except OSError as err:
            raise OutputError(f"{self.path}: cannot create: {err.strerror}") from err
        track_temp(tmp)
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        self.tmp = Path(tmp)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
            return
        self.abort()
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            # Writing the output failed (disk full, /dev/full, EIO): one line naming the
            # output, not an internal error; a plot library's own write ends up here too.
            raise OutputError(
                f"{self.path}: cannot write: {exc.strerror or exc}; the output is left as it was"
            ) from exc

    def open_text(self, *, encoding: str = "utf-8", newline: str | None = "") -> IO[str]:
        """Open the temporary file (or the stream) for writing text."""
        if self._stream_fd is not None:
            return open(os.dup(self._stream_fd), "w", encoding=encoding, newline=newline)
        return open(self.tmp, "w", encoding=encoding, newline=newline)

    def open_bytes(self) -> IO[bytes]:
        """Open the temporary file (or the stream) for writing bytes."""
        if self._stream_fd is not None:
            return open(os.dup(self._stream_fd), "wb")
        return open(self.tmp, "wb")

    def _close_stream(self) -> None:
        if self._stream_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._stream_fd)
            self._stream_fd = None

    def commit(self) -> None:
        """Move the finished file into place.

        Raises:
            OutputError: The target appeared meanwhile (without ``force``) or another
                kvtool process holds it.
        """
        if self._done:
            return
        self._done = True
        if self.direct:
            self._close_stream()
            return
        try:
            if self.force:
                with _holding_lock(self.path):
                    os.replace(self.tmp, self.path)
                return
            try:
                os.link(self.tmp, self.path)
            except FileExistsError:
                raise OutputError(
                    f"{self.path}: file exists; pass --force to overwrite it"
                ) from None
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV):
                    raise
                # A file system without hard links: rename (not atomic against a racer).
                if self.path.exists():
                    raise OutputError(
                        f"{self.path}: file exists; pass --force to overwrite it"
                    ) from None
                os.rename(self.tmp, self.path)
                return
            os.unlink(self.tmp)
        except OSError as err:
            raise OutputError(f"{self.path}: cannot write: {err.strerror}") from err
        finally:
            with contextlib.suppress(OSError):
                if self.tmp.exists() and self.tmp != self.path:
                    self.tmp.unlink()
            untrack_temp(self.tmp)

    def abort(self) -> None:
        """Drop the temporary file; the target stays as it was."""
        if self._done:
            return
        self._done = True
        self._close_stream()
        if not self.direct:
            with contextlib.suppress(OSError):
                self.tmp.unlink()
            untrack_temp(self.tmp)


def write_text(path: PathLike, text: str, *, force: bool, inputs: Iterable[PathLike] = ()) -> None:
    """Write a text output (a report) atomically under the output rule.

    Args:
        path: The output file.
        text: Its whole content.
        force: ``--force`` was given.
        inputs: The command's inputs.

    Raises:
        OutputError: The rule refuses the path, or the write fails.
    """
    check_output(path, kind=OutputKind.TEXT, force=force, inputs=inputs)
    with AtomicFile(path, force=force) as af:
        try:
            with af.open_text() as f:
                f.write(text)
        except OSError as err:
            raise OutputError(f"{path}: cannot write: {err.strerror}") from err


def open_locked(
    path: PathLike, *, force: bool, kind: OutputKind, truncate: bool = True
) -> IO[bytes]:
    """Open ``path`` for writing in place under an exclusive lock held until it is closed.

    Used for recordings ``record`` writes, which must be readable at their own path after
    a crash. The lock (``flock``) makes a second writer of the same path refuse instead of
    both writing one file. With ``force`` an existing regular file is truncated only once
    the lock is held (a recorder replaces a non-empty one atomically instead: it stages the
    new recording and renames it over the file still locked).

    Args:
        path: The output file.
        force: Replace an existing file.
        kind: What is written.
        truncate: With ``force``: empty an existing file (False: leave its content, for
            a caller that only holds the lock until a new file takes its place).

    Returns:
        The open binary file (locked).

    Raises:
        OutputError: The file exists without ``force``, or is locked.
        OSError: It cannot be created (the caller words the error).
    """
    p = os.fspath(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (0 if force else os.O_EXCL)
    try:
        fd = os.open(p, flags, 0o666)
    except FileExistsError:
        raise OutputError(f"{p}: file exists; pass --force to overwrite it") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISFIFO(st.st_mode):
            # Our own read-write descriptor would count as the reader: reopen write-only
            # so a FIFO nobody reads is refused instead of filling up and hanging.
            os.close(fd)
            fd = -1
            fd = _open_stream(p)
            return os.fdopen(fd, "wb")
        if stat.S_ISREG(st.st_mode):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputError(
                    f"{p}: another kvtool process is writing it; choose another path"
                ) from None
            # The path may have been replaced between open() and flock() (a --force copy
            # renamed over it): the lock then guards a file no path names, and a recording
            # written there would be lost. Refuse unless the path still names this file.
            now = _stat(p)
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise OutputError(
                    f"{p}: was replaced by another process while kvtool opened it; "
                    "choose another path"
                )
            if st.st_size > 0 and truncate:
                os.ftruncate(fd, 0)
        return os.fdopen(fd, "wb")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


__all__ = [
    "EXPORT_MARKER",
    "PARQUET_KEY",
    "AtomicFile",
    "OutputKind",
    "check_not_input",
    "check_output",
    "check_std_streams_not_inputs",
    "is_kvtool_recording",
    "is_stdout",
    "kvtool_made",
    "mark_kvtool_made",
    "open_locked",
    "remove_temps",
    "same_file",
    "silence_fd",
    "temp_prefix",
    "track_temp",
    "untrack_temp",
    "write_text",
]
