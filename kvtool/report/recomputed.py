"""The per-event ``recomputed`` flag of ``kvtool export``: the report's recomputes, row by row.

:class:`RecomputeFlags` feeds each annotated chunk through a
:class:`~kvtool.report.builder.ReportBuilder`, the report's own path into the state
kernel (:func:`kvtool.report.kernel.step`, with the builder's restart and attribution
handling), and keeps what the kernel said each row was. A row is flagged when the
kernel called it :data:`~kvtool.report.kernel.RECOMPUTED`, so the flags summed per
group equal the report's ``blocks_recomputed`` of that group, on any chunking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtool.columns import np
from kvtool.report import kernel
from kvtool.report.builder import ReportBuilder

if TYPE_CHECKING:
    import polars as pl
    from numpy.typing import NDArray

    from kvtool.columns import TableAnnotator


class _Builder(ReportBuilder):
    """A report builder that keeps the kernel's per-row output of its last chunk."""

    last: kernel.Out | None = None

    def _step(self, *args: Any, **kwargs: Any) -> tuple[kernel.Out, NDArray[Any]]:
        out, restart_drop = super()._step(*args, **kwargs)
        self.last = out
        return out, restart_drop


class RecomputeFlags:
    """Per annotated chunk (in stream order): which rows are recomputes.

    Args:
        annotator: The annotator the chunks come from (for removes without ``group_idx``).
    """

    def __init__(self, annotator: TableAnnotator) -> None:
        self._builder = _Builder(None, annotator.group_kind)

    def __call__(self, df: pl.DataFrame) -> NDArray[np.bool_]:
        """Return, per row of ``df``, whether it is a recompute.

        A recompute is a store of a key that was stored earlier and is not live now.

        Args:
            df: The next annotated chunk (:func:`kvtool.columns.iter_annotated`).

        Returns:
            One bool per row.
        """
        b = self._builder
        b.last = None
        b.add(df)
        if b.last is None:  # an empty chunk
            return np.zeros(df.height, dtype=np.bool_)
        flags: NDArray[np.bool_] = b.last.what == kernel.RECOMPUTED
        return flags


__all__ = ["RecomputeFlags"]
