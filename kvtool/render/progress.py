"""A progress bar on stderr for long reads: bytes of the input done, rate and ETA."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import Console
    from rich.progress import Progress, TaskID


def input_size(paths: Iterable[str | os.PathLike[str]]) -> int | None:
    """Return the total size in bytes of the input files, or None when one is not a file.

    Args:
        paths: The inputs.

    Returns:
        Their summed size, or None (a FIFO, a missing file: the bar then only pulses).
    """
    total = 0
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            return None
        if not os.path.isfile(p):
            return None
        total += st.st_size
    return total


class ProgressBar:
    """A transient rich progress bar; a no-op when ``console`` is None.

    Feed it ``update(done, total)`` (bytes of the input) from a callback or a loop; without a
    total it pulses and shows the time elapsed. Use it as a context manager: the bar is
    removed when the work ends, so only the command's own output stays on the terminal.

    Args:
        console: The stderr console, or None for no bar (piped, ``-q``).
        description: What is being done (``reading run.mcap``).
        total: Bytes to do, when known.
    """

    def __init__(self, console: Console | None, description: str, total: int | None) -> None:
        self.total = total
        self.done = 0
        self._step = max(1, (total or 0) // 1000)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if console is not None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            sized = (DownloadColumn(), TimeElapsedColumn(), TimeRemainingColumn())
            self._progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                *(sized if total is not None else (TimeElapsedColumn(),)),
                console=console,
                transient=True,
            )
            self._task = self._progress.add_task(description, total=total)

    @property
    def shown(self) -> bool:
        """True when a bar is drawn."""
        return self._progress is not None

    def update(self, done: int, total: int | None = None) -> None:
        """Set the bytes done (and the total, when it becomes known).

        Args:
            done: Bytes of the input processed so far.
            total: The total, if it changed.
        """
        if total is not None and total != self.total:
            self.total = total
            self._step = max(1, total // 1000)
        elif done - self.done < self._step:
            return  # redraw at most ~1000 times over the whole input
        self.done = done
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=self.total)

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Remove the bar."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class FileOffsets:
    """Bytes done over several input files read in an interleaved order.

    Each message read says which file it came from and at what offset; the bytes done are
    the sum, over the files, of the furthest offset seen.

    Args:
        bar: The bar to update.
        sizes: Each file's size, by path.
    """

    def __init__(self, bar: ProgressBar, sizes: dict[str, int]) -> None:
        self.bar = bar
        self._at = dict.fromkeys(sizes, 0)
        self._done = 0

    def seen(self, path: str, offset: int) -> None:
        """Note that a message at ``offset`` of ``path`` was read.

        Args:
            path: The file.
            offset: Its offset in the file.
        """
        prev = self._at.get(path, 0)
        if offset > prev:
            self._at[path] = offset
            self._done += offset - prev
            self.bar.update(self._done)


__all__ = ["FileOffsets", "ProgressBar", "input_size"]
