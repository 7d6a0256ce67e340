"""What a report read (``Report.source``) and what it found (``Report.findings``), typed.

:class:`ReportSource` is the ``source`` object of the JSON contract as a frozen struct:
its :meth:`ReportSource.to_dict` is that object, key for key and in the same order (keys
that appear only sometimes -- ``unselected_batches``, the timeline's -- appear exactly as
before). :class:`Finding` is one finding: its kind (a code to act on instead of matching
the text), the recording it names when it names one, and its text.

No polars and no numpy here: renderers and ``diff`` read these without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Finding(str):
    """One finding: a line of text that also carries its ``kind`` and the ``path`` it names.

    It *is* its text (a ``str``), so it prints, compares and goes into JSON as the line it
    always was; code that needs to tell findings apart reads :attr:`kind` instead of
    searching the text.

    Args:
        kind: What the finding is about (one of :data:`FINDING_KINDS`).
        text: The line.
        path: The recording it names, if it names one.
    """

    kind: str
    path: str | None

    def __new__(cls, kind: str, text: str, path: str | None = None) -> Finding:
        """Make the finding ``text`` of ``kind`` (about ``path``, if given)."""
        self = super().__new__(cls, text)
        self.kind = kind
        self.path = path
        return self

    @property
    def text(self) -> str:
        """The line, as a plain ``str``."""
        return str.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Finding, (self.kind, self.text, self.path))


FINDING_KINDS = (
    "unannotated",  # no store (or no remove) could be given a kind
    "unattributed",  # removes without group_idx that could not be attributed
    "kind_change",  # a group changes kind mid-stream
    "silent_kind",  # a kind stored blocks but none was evicted while others were
    "restart",  # a publisher restarted: its state started afresh
    "negative_lifetime",  # the publisher's clock went backwards
    "sparse_timeline",  # only the buckets with events are listed
    "orphan_removes",  # removed blocks that were not live
    "out_of_metadata",  # stores of a group index the metadata does not list
    "malformed",  # payloads or events that could not be decoded
    "unknown_events",  # events of a type this kvtool does not know
    "lost",  # batches lost while recording, or a tail never confirmed (the gap ledger)
    "damaged",  # a damaged recording, read as far as it goes
    "input",  # the input as a whole: same-batch copies, annotation conflicts
    "what_if",  # a condition that weakens a what-if prediction
)
"""Every :attr:`Finding.kind`."""


def finding_kind(finding: object) -> str | None:
    """The :attr:`Finding.kind` of ``finding``; None for a plain line (no kind known).

    What a command decides on, never the text (issue 19): a plain line that happens to say
    "lost while recording" is not a lost-batches finding.

    Args:
        finding: A :class:`Finding`, or any other line.

    Returns:
        Its kind, or None.
    """
    return finding.kind if isinstance(finding, Finding) else None


@dataclass(frozen=True, slots=True)
class ChannelSource:
    """One channel read: its recording, name, endpoint, topic and data-parallel rank."""

    recording: str
    channel: str
    endpoint: str
    topic: str
    dp_rank: int | None

    def to_dict(self) -> dict[str, object]:
        """The channel's object in ``source.channels``."""
        return {
            "recording": self.recording,
            "channel": self.channel,
            "endpoint": self.endpoint,
            "topic": self.topic,
            "dp_rank": self.dp_rank,
        }


@dataclass(frozen=True, slots=True)
class TimelineSource:
    """The timeline's clock, its time zero and the data's span on it (seconds)."""

    clock: str
    origin_s: float | None
    start_s: float | None
    end_s: float | None


@dataclass(frozen=True, slots=True)
class ReportSource:
    """What a report read: recordings, channels, metadata sources, counts, damage.

    Attributes:
        recordings: The recordings, as the command line named them.
        channels: Every channel read, in order of first appearance.
        group_metadata: The group metadata sources in use.
        batches: Batches read (and selected).
        events: Events decoded.
        block_rows: Block rows (one per hash; one per clear).
        duration_s: Last row's message minus the first message on ``duration_clock``.
        duration_clock: Always ``receive``.
        lifetimes: ``exact`` or how the lifetimes were binned.
        recompute_gaps: ``exact`` or how the recompute gaps were binned.
        skipped_batches: Malformed payloads skipped.
        skipped_events: Undecodable events skipped.
        unknown_events: Events of unknown type, per tag, most frequent first.
        damaged: One line per damaged recording.
        unselected_batches: Batches ``--channel``/``--rank``/``--since``/``--until`` left
            out (in JSON only when some were).
        timeline: With ``--every``: the timeline's clock and span (else None).
    """

    recordings: list[str]
    channels: list[ChannelSource]
    group_metadata: list[str]
    batches: int
    events: int
    block_rows: int
    duration_s: float | None
    duration_clock: str
    lifetimes: str
    recompute_gaps: str
    skipped_batches: int
    skipped_events: int
    unknown_events: dict[str, int]
    damaged: list[str]
    unselected_batches: int = 0
    timeline: TimelineSource | None = None

    @property
    def clock(self) -> str:
        """The timeline's clock (``receive`` without a timeline)."""
        return self.timeline.clock if self.timeline is not None else "receive"

    def to_dict(self) -> dict[str, object]:
        """The ``source`` object of the JSON contract (findings are added by the renderer)."""
        out: dict[str, object] = {
            "recordings": list(self.recordings),
            "channels": [c.to_dict() for c in self.channels],
            "group_metadata": list(self.group_metadata),
            "batches": self.batches,
        }
        if self.unselected_batches:
            out["unselected_batches"] = self.unselected_batches
        out.update(
            events=self.events,
            block_rows=self.block_rows,
            duration_s=self.duration_s,
            duration_clock=self.duration_clock,
        )
        if self.timeline is not None:
            out.update(
                clock=self.timeline.clock,
                timeline_origin_s=self.timeline.origin_s,
                timeline_start_s=self.timeline.start_s,
                timeline_end_s=self.timeline.end_s,
            )
        out.update(
            lifetimes=self.lifetimes,
            recompute_gaps=self.recompute_gaps,
            skipped_batches=self.skipped_batches,
            skipped_events=self.skipped_events,
            unknown_events=dict(self.unknown_events),
            damaged=list(self.damaged),
        )
        return out


__all__ = [
    "FINDING_KINDS",
    "ChannelSource",
    "Finding",
    "ReportSource",
    "TimelineSource",
    "finding_kind",
]
