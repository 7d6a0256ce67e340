"""The lifetime bound of R8 (docs/SEMANTICS.md): quantiles under the two extreme copy rules.

Which copy of a twice-cached key vLLM evicted is not on the wire. The report's lifetimes
follow the kernel's rule (:mod:`kvtool.report.kcopy`); beside it, the state kernel runs
the same rows under the two extremes, the oldest copy first and the newest copy first
(:attr:`kvtool.report.kernel.State.shadows`). Their lifetime quantiles, the lower and the
higher of the two per quantile, are the columns ``lifetime_pNN_s_bound_low`` and
``lifetime_pNN_s_bound_high`` (equal to ``lifetime_pNN_s`` where no key had two copies).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import polars as pl

from kvtool.columns import np
from kvtool.report.names import LIFETIME_BOUND_COLUMNS, LIFETIME_COLUMNS
from kvtool.report.samples import Seconds, SecondsPart

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.kernel import State

CopyBoundPart = tuple[SecondsPart, SecondsPart]
"""A partial report's lifetimes under the oldest-first and the newest-first rule."""

_RULES = ("oldest", "newest")

BOUND_EXACT = 100_000
"""Samples per rule kept exactly before a histogram takes over (at most the report's own
limit): the bound's quantiles are then the histogram's, and its memory stays small beside
the report's exact lifetimes (live ``top``/``serve`` keep it under issue 23's bound)."""


def _names(rule: str) -> tuple[str, ...]:
    return tuple(f"{c}_{rule}" for c in LIFETIME_COLUMNS)


Triple = tuple["NDArray[Any]", "NDArray[Any]", "NDArray[Any]"]
"""(report row, remove time, store time) of lifetimes."""


class Samples(NamedTuple):
    """A kernel step's lifetimes for the bound (:meth:`Samples.of`), off its state."""

    bound: list[list[Triple]]
    late: list[Triple]

    @classmethod
    def of(cls, state: State) -> Samples:
        """Move the state's ``bound_samples`` and ``late_samples`` (emptied) into one."""
        out = cls([list(s) for s in state.bound_samples], list(state.late_samples))
        for s in state.bound_samples:
            s.clear()
        state.late_samples.clear()
        return out


class CopyBound:
    """Lifetimes per report row under the two extreme copy rules (see the module docstring)."""

    def __init__(self) -> None:
        self.rules = (Seconds(), Seconds())

    def take(self, state: State | Samples, limit: int, life: Seconds) -> None:
        """Move the lifetimes the kernel's shadows found since the last call into here.

        Lifetimes are taken on whole microseconds of each ``ts``, a negative one (a clock
        stepping back) clamped to 0, as the report's own.

        Args:
            state: The kernel state (its :attr:`~kvtool.report.kernel.State.bound_samples`
                and ``late_samples`` are emptied).
            limit: Exact samples kept before a histogram takes over
                (:data:`~kvtool.report.aggregates.EXACT_LIFETIMES`; the bound's at most
                :data:`BOUND_EXACT`).
            life: The report's own lifetimes: the state's ``late_samples`` (lifetimes no
                row carries) go there.
        """
        # A state without shadows (bounds=False) has no bound samples.
        bound, late = (
            (state.bound, state.late)
            if isinstance(state, Samples)
            else (
                state.bound_samples,
                state.late_samples,
            )
        )
        pairs = list(zip(self.rules, bound, strict=False))
        for seconds, samples in [*pairs, (life, late)]:
            for gkey, removed, stored in samples:
                if len(gkey) == 0:
                    continue
                span: NDArray[Any] = (np.rint(removed * 1e6) - np.rint(stored * 1e6)) * 1e-6
                cap = limit if seconds is life else min(limit, BOUND_EXACT)
                seconds.add(gkey, np.maximum(span, 0.0), cap)
            samples.clear()

    def part(self) -> CopyBoundPart:
        """Return this as a partial report holds it."""
        return self.rules[0].part(), self.rules[1].part()

    @classmethod
    def merge(
        cls, parts: Sequence[tuple[CopyBoundPart | None, dict[int, int]]], limit: int
    ) -> CopyBound:
        """Merge units' bounds (each with its row ids → the merged report rows).

        Args:
            parts: Per unit, its :meth:`part` (None: a unit that kept none) and row ids.
            limit: As :meth:`take`'s.

        Returns:
            The merged bound.
        """
        out = cls()
        kept = [(p, ids) for p, ids in parts if p is not None]
        cap = min(limit, BOUND_EXACT)
        out.rules = (
            Seconds.merge([(p[0], ids) for p, ids in kept], cap),
            Seconds.merge([(p[1], ids) for p, ids in kept], cap),
        )
        return out

    def quantiles(
        self,
        levels: pl.DataFrame,
        members: dict[str, dict[object, list[int]]],
        rows: int,
    ) -> dict[str, pl.DataFrame]:
        """The bound columns per key of each level column (as :meth:`Seconds.quantiles`).

        Args:
            levels: Per report row its key in each level column.
            members: Per level column, each key's report rows.
            rows: Report rows there are.

        Returns:
            Per level column, one row per key with samples under either rule.
        """
        old, new = (
            s.quantiles(levels, members, _names(r), rows)
            for s, r in zip(self.rules, _RULES, strict=True)
        )
        out = {}
        for col, a in old.items():
            t = a.join(new[col], on=col, how="full", coalesce=True, nulls_equal=True)
            exprs = []
            for c, low, high in zip(
                LIFETIME_COLUMNS,
                LIFETIME_BOUND_COLUMNS[0::2],
                LIFETIME_BOUND_COLUMNS[1::2],
                strict=True,
            ):
                pair = (pl.col(f"{c}_oldest"), pl.col(f"{c}_newest"))
                exprs += [pl.min_horizontal(*pair).alias(low), pl.max_horizontal(*pair).alias(high)]
            out[col] = t.select(col, *exprs)
        return out


__all__ = ["BOUND_EXACT", "CopyBound", "CopyBoundPart"]
