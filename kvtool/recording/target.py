"""Where a recording is written: in place, staged beside the one it replaces, or atomically."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import IO

from kvtool.errors import OutputError, RecordingError, RecordingPathError
from kvtool.outputs import (
    AtomicFile,
    OutputKind,
    check_output,
    check_std_streams_not_inputs,
    open_locked,
    temp_prefix,
)

__all__ = ["RecordingTarget"]


class _Positioned:
    """A stream that counts the bytes written to it, for a pipe that cannot ``tell()``.

    The MCAP writer asks its stream for the offset of every record it indexes; a pipe
    (``replay -o - | cat > copy.mcap``) answers "Illegal seek" (issue 24). What the reader
    of the pipe receives starts at offset 0, so the offset is the count of bytes written.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._pos = 0

    @classmethod
    def around(cls, stream: IO[bytes]) -> IO[bytes]:
        """Return ``stream`` itself where it can tell its position, else a counting wrapper."""
        try:
            stream.tell()
        except (OSError, ValueError):
            return cls(stream)  # type: ignore[return-value]
        return stream

    def write(self, data: bytes) -> int:
        n = self._stream.write(data)
        self._pos += len(data) if n is None else n
        return len(data) if n is None else n

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self._stream.close()

    def fileno(self) -> int:
        return self._stream.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


class RecordingTarget:
    """The file a :class:`kvtool.recording.RecordingWriter` writes, under kvtool's output rule.

    A recording is written in place under an exclusive ``flock``; with ``force`` over a
    recording it is staged beside it until its first message (:meth:`take_place`); with
    ``atomic`` (a copy) it is written under a temporary name and renamed by
    :meth:`commit`; a ``stream`` (stdout) is written as it is.

    Args:
        path: Where to write.
        stream: Write to this binary stream instead of opening ``path``.
        force: Replace an existing file.
        inputs: Files the caller reads; the output may not be one of them.
        atomic: Write under a temporary name, renamed into place by :meth:`commit`.

    Raises:
        RecordingPathError: The output rule refuses the path, another writer holds it,
            or it cannot be created.

    Attributes:
        file: The stream to write the recording to.
        own_file: The file was opened here (not a caller's stream).
    """

    def __init__(
        self,
        path: str,
        stream: IO[bytes] | None,
        *,
        force: bool,
        inputs: Iterable[str | os.PathLike[str]],
        atomic: bool,
    ) -> None:
        self.path = path
        self._atomic: AtomicFile | None = None
        self._staged: str | None = None  # a new recording not yet at its path
        self._staged_id = (0, 0)
        self._staged_target = self.path
        self._replaced: IO[bytes] | None = None  # the old one it will replace (locked)
        self._wrapped: io.BufferedWriter | None = None
        self.own_file = stream is None
        self.file: IO[bytes] = self._open(stream, force=force, inputs=inputs, atomic=atomic)

    @property
    def atomic(self) -> bool:
        """True for a copy written under a temporary name."""
        return self._atomic is not None

    @property
    def staged(self) -> bool:
        """True while a ``force`` replacement waits for its first message."""
        return self._staged is not None

    def _open(
        self,
        stream: IO[bytes] | None,
        *,
        force: bool,
        inputs: Iterable[str | os.PathLike[str]],
        atomic: bool,
    ) -> IO[bytes]:
        """Open the output under kvtool's output rule (kvtool/outputs.py)."""
        if stream is not None:
            try:
                check_std_streams_not_inputs(inputs)
            except OutputError as err:
                raise RecordingPathError(str(err)) from None
            if isinstance(stream, io.RawIOBase):
                # An unbuffered stream (stdout under PYTHONUNBUFFERED=1 is a FileIO): mcap's
                # Writer wrapped it in a buffer of its own that nobody flushed, so the
                # recording's end reached stdout only at exit, and a write error (disk
                # full) was never seen. Buffer it here, where flush() and close() see it.
                self._wrapped = io.BufferedWriter(stream)
                stream = self._wrapped
            return _Positioned.around(stream)
        try:
            if os.path.lexists(self.path) or os.path.isdir(self.path):
                check_output(self.path, kind=OutputKind.RECORDING, force=force, inputs=inputs)
            if atomic:
                # A copy (replay -o): written under a temporary name, renamed at close.
                self._atomic = AtomicFile(self.path, force=force)
                return self._atomic.open_bytes()
            if force and os.path.isfile(self.path) and os.path.getsize(self.path) > 0:
                return self._stage()
            # A live recording is written in place, so a killed recorder leaves a readable
            # file at its path; the lock makes a second writer of the same path refuse.
            return open_locked(self.path, force=force, kind=OutputKind.RECORDING)
        except OutputError as err:
            if self._atomic is not None:
                self._atomic.abort()
            raise RecordingPathError(str(err)) from None
        except IsADirectoryError:
            raise RecordingPathError(
                f"{self.path}: is a directory; give a file name such as run.mcap"
            ) from None
        except OSError as err:
            if self._atomic is not None:
                self._atomic.abort()
            raise RecordingPathError(
                f"{self.path}: cannot create: {err.strerror}; choose a writable path"
            ) from err

    def _stage(self) -> IO[bytes]:
        """Write the new recording beside the one ``--force`` replaces, until its first message.

        The old recording stays at its path, locked (a second writer refuses), until a
        message is written: then the new file takes its place in one rename
        (:meth:`take_place`). A recorder that never receives a batch -- no publisher,
        a wrong endpoint, Ctrl-C at once -- leaves the old recording as it was.
        """
        self._replaced = open_locked(
            self.path, force=True, kind=OutputKind.RECORDING, truncate=False
        )
        # Through a symlink, the file it names is replaced (as truncating it in place
        # would have), not the link.
        self._staged_target = os.path.realpath(self.path)
        parent, name = os.path.split(self._staged_target)
        try:
            fd, tmp = tempfile.mkstemp(
                prefix=temp_prefix(name), suffix=".kvtool-tmp.mcap", dir=parent
            )
        except BaseException:
            self._release_replaced()
            raise
        self._staged = tmp
        try:
            st = os.fstat(fd)
            self._staged_id = (st.st_dev, st.st_ino)
            os.fchmod(fd, os.fstat(self._replaced.fileno()).st_mode & 0o777)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            self.drop_staged()
            raise

    def take_place(self, flush: Callable[[], None]) -> None:
        """The first message is written: the new recording replaces the old at its path.

        Args:
            flush: Puts the new recording's first chunk on disk, before it is what the
                path names.

        Raises:
            RecordingError: The old recording could not be replaced (the new one stays
                at its temporary name, which the message gives).
        """
        tmp, self._staged = self._staged, None
        if tmp is None:
            return
        flush()
        try:
            # The lock keeps kvtool writers off the old recording, not other programs:
            # replace only the file still locked, never one put at the path since.
            old = self._replaced
            held = os.fstat(old.fileno()) if old is not None else None
            named = os.stat(self._staged_target)
            if held is None or (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
                raise OSError(errno.EEXIST, "another program put a file at the path meanwhile")
            os.replace(tmp, self._staged_target)
        except OSError as err:
            raise RecordingError(
                f"{self.path}: cannot replace the old recording: {err.strerror or err}; "
                f"the new one is at {tmp}"
            ) from err
        finally:
            self._release_replaced()

    def drop_staged(self) -> None:
        """No message was written: remove the new file; the old recording stays as it was."""
        tmp, self._staged = self._staged, None
        if tmp is not None:
            with contextlib.suppress(OSError):
                named = os.stat(tmp)
                if (named.st_dev, named.st_ino) == self._staged_id:  # still ours
                    os.unlink(tmp)
        self._release_replaced()

    def _release_replaced(self) -> None:
        old, self._replaced = self._replaced, None
        if old is not None:
            with contextlib.suppress(OSError):
                old.close()

    def abort(self) -> None:
        """Drop a copy or a staged replacement; whatever was at the path stays as it was."""
        if self._atomic is not None:
            self._atomic.abort()
        self.drop_staged()

    def commit(self) -> None:
        """Rename a copy into place (nothing to do for any other target).

        Raises:
            RecordingPathError: The rename failed.
        """
        if self._atomic is not None:
            try:
                self._atomic.commit()
            except OutputError as err:
                raise RecordingPathError(str(err)) from None

    def remove_own(self) -> bool:
        """Remove the file written in place, only while the path still names it.

        Returns:
            True when the file was removed.
        """
        try:
            held = os.fstat(self.file.fileno())
            named = os.stat(self.path)
        except (OSError, ValueError):
            return False
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            return False
        try:
            os.unlink(self.path)
        except OSError:
            return False
        return True

    def close_quietly(self) -> None:
        """Close the file (a stream is only flushed); a write error here is already said."""
        # Buffered bytes that cannot be written (disk full): the error was already
        # reported; what reached the disk stays readable.
        with contextlib.suppress(OSError):
            if self.own_file:
                self.file.close()
            else:
                self.file.flush()
        if self._wrapped is not None:
            # Let go of the caller's raw stream without closing it (it may be stdout).
            with contextlib.suppress(ValueError, OSError):
                self._wrapped.detach()
            self._wrapped = None
