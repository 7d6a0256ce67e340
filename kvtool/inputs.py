"""Several recordings as one input: the one merge order, the same-batch rule, the annotation.

Every command that reads recordings (``replay``, ``report``, ``export``) reads them
through :func:`merge_messages` and annotates with the :class:`kvtool.annotate.Annotation`
that :func:`resolve_annotation` builds, so each gives every batch the same place in the
stream and every event the same kind and window.

**Merge order.** One recording: its file order. Several: by receive time (``log_time``),
ties broken by channel (endpoint, then topic), then seq, then the input's position on
the command line. Each input is read lazily; the merge holds one message per input.

**The same batch.** Two messages from *different* inputs with the same
(endpoint, topic, rank, seq) are the same batch when their payloads are byte-identical
(e.g. ``report a.mcap a.mcap``, a file plus its ``replay -o`` slice, two recorders on one
publisher): the first in merge order is kept, the others are dropped and counted. The
same key with a different payload (a publisher restart between two recordings, or a
corrupt copy) keeps both and is counted. Within one input nothing is dropped (a
publisher restart legitimately repeats seqs). Memory is bounded: a batch is remembered
(key → 16-byte payload digest) for :data:`DEDUPE_WINDOW_NS` of receive time after it
was merged, and at most :data:`DEDUPE_MAX_KEYS` keys are held (oldest forgotten first),
so copies received more than that apart are not recognised as one.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from kvtool import projections, protocol
from kvtool.annotate import (
    Annotation,
    GroupLearner,
    GroupTable,
    event_rank,
    groups_from_list,
    merge_over,
    resolve_groups,
)
from kvtool.errors import ProtocolError
from kvtool.groups import ungrouped_from_record
from kvtool.recording import RecordedMessage, RecordingReader, open_recording
from kvtool.recording import format as fmt
from kvtool.text import plural

DEDUPE_WINDOW_NS = 60 * 10**9
"""How long (receive time) a merged batch is remembered for the same-batch rule."""

DEDUPE_MAX_KEYS = 1_000_000
"""At most this many batches are remembered (about 150 MB at worst; oldest go first)."""

MergePosition = tuple[int, str, str, int]
"""(log_time, endpoint, topic, seq): a message's place in the merge order."""

BatchKey = tuple[str, str, int | None, int]
"""(endpoint, topic, rank, seq): what makes two messages candidates for the same batch."""


def merge_position(m: RecordedMessage) -> MergePosition:
    """Return a message's merge position (see the module docstring).

    Args:
        m: The message.

    Returns:
        ``(log_time, endpoint, topic, seq)``.
    """
    return (m.log_time, m.channel.endpoint, m.channel.topic, m.seq)


@dataclass
class MergeFindings:
    """What the same-batch rule found across inputs.

    Attributes:
        duplicates: Batches dropped because an earlier input held the same bytes.
        differing: Batches kept although another input holds the same key with other bytes.
        examples: A few of each, for messages.
    """

    duplicates: int = 0
    differing: int = 0
    examples: list[str] = field(default_factory=list)

    def _note(self, text: str) -> None:
        if len(self.examples) < 6:
            self.examples.append(text)

    def lines(self) -> list[str]:
        """Return the findings as report lines (empty when there is nothing to say).

        Returns:
            One line per kind of finding.
        """
        out = []
        if self.duplicates:
            ex = "; ".join(e for e in self.examples if e.startswith("same"))[:300]
            out.append(
                f"{plural(self.duplicates, 'batch')} "
                f"{'appears' if self.duplicates == 1 else 'appear'} in more than one input with "
                f"the same payload and {'was' if self.duplicates == 1 else 'were'} counted once "
                f"({ex})"
            )
        if self.differing:
            ex = "; ".join(e for e in self.examples if e.startswith("different"))[:300]
            out.append(
                f"{plural(self.differing, 'batch')} {'shares' if self.differing == 1 else 'share'} "
                "(endpoint, topic, rank, seq) with a batch "
                f"of another input but not its payload; both were kept ({ex})"
            )
        return out


def _keyed(i: int, it: Iterable[RecordedMessage]) -> Iterator[tuple[object, ...]]:
    for n, m in enumerate(it):
        ch = m.channel
        yield m.log_time, ch.endpoint, ch.topic, m.seq, i, n, m


def merge_messages(
    sources: Sequence[Iterable[RecordedMessage]],
    *,
    findings: MergeFindings | None = None,
) -> Iterator[tuple[int, RecordedMessage]]:
    """Merge the messages of several inputs in THE order, each batch once.

    Args:
        sources: One message iterator per input, in command-line order.
        findings: Receives what the same-batch rule found.

    Returns:
        ``(input index, message)`` in merge order; copies of a batch already yielded from
        another input are left out. One input is its own order and holds no copies of
        itself: its messages are paired with 0 without a heap or a generator frame (the
        read of a whole recording goes through here, one message at a time).
    """
    if len(sources) == 1:
        return zip(itertools.repeat(0), sources[0])
    return _merge_heap(sources, findings if findings is not None else MergeFindings())


def _merge_heap(
    sources: Sequence[Iterable[RecordedMessage]], fnd: MergeFindings
) -> Iterator[tuple[int, RecordedMessage]]:
    """The merge of :func:`merge_messages` by a heap over the inputs (any number)."""
    seen: dict[BatchKey, tuple[int, list[tuple[int, bytes]]]] = {}
    order: deque[tuple[int, BatchKey]] = deque()
    for item in heapq.merge(*(_keyed(i, s) for i, s in enumerate(sources))):
        i, msg = item[4], item[6]
        assert isinstance(i, int) and isinstance(msg, RecordedMessage)
        m = msg
        ch = m.channel
        key: BatchKey = (ch.endpoint, ch.topic, ch.dp_rank, m.seq)
        now = m.log_time
        while order and (order[0][0] < now - DEDUPE_WINDOW_NS or len(order) > DEDUPE_MAX_KEYS):
            t, old = order.popleft()
            got = seen.get(old)
            if got is not None and got[0] <= t:
                del seen[old]
        digest = hashlib.blake2b(m.data, digest_size=16).digest()
        got = seen.get(key)
        if got is not None:
            others = [d for j, d in got[1] if j != i]
            if digest in others:
                fnd.duplicates += 1
                fnd._note(f"same: {ch.name} seq {m.seq} in {ch.path}")
                continue
            if others:
                fnd.differing += 1
                fnd._note(f"different: {ch.name} seq {m.seq} in {ch.path}")
            got[1].append((i, digest))
            seen[key] = (now, got[1])
        else:
            seen[key] = (now, [(i, digest)])
        order.append((now, key))
        yield i, m


# -- learning the annotation from the whole input -------------------------------------------

# The learner's projection (kvtool.schema's "learner" fields; kvtool.projections makes the
# structs): only (group_idx, kind, window, block_size) of stores; hashes and tokens are
# skipped undecoded, and every element of a remove or clear past its tag is ignored.
_LEARN_STRUCTS = projections.build(
    projections.LEARNER,
    module=__name__,
    names=("_LearnStored", "_LearnRemoved", "_LearnCleared"),
    array_names=("_LearnStoredArray", "_LearnRemovedArray", "_LearnClearedArray"),
)
_LearnStored, _LearnRemoved, _LearnCleared = _LEARN_STRUCTS.map
_LearnStoredArray, _LearnRemovedArray, _LearnClearedArray = _LEARN_STRUCTS.array
_LEARN = protocol.BatchProjection(
    "learn", _LEARN_STRUCTS.map_union, _LEARN_STRUCTS.array_union, gc=False
)


def learn_events(raw: bytes, *, seq: int | None = None) -> tuple[int | None, list[object]]:
    """Decode what the learner needs of one payload: its rank and its events' annotations.

    Args:
        raw: The payload.
        seq: Its seq, for errors.

    Returns:
        ``(batch rank, events)``; events have ``group_idx`` and ``kv_cache_spec_kind``
        attributes (stores) or none (others).

    Raises:
        ProtocolError: The payload is not a batch.
    """
    hit = _LEARN.decode(raw)
    if hit is not None:
        b = hit[0]
        return b.data_parallel_rank, b.events
    try:
        full = protocol.decode_batch(raw, seq=seq)
    except RecursionError as err:
        raise ProtocolError(f"seq {seq}: malformed payload: nested too deeply", seq=seq) from err
    return full.data_parallel_rank, list(full.events)


def recording_tables(
    reader: RecordingReader,
) -> tuple[GroupTable | None, dict[tuple[str, str], GroupTable]]:
    """Read a recording's own group metadata: recording-wide and per channel.

    Args:
        reader: The open recording.

    Returns:
        ``(recording table or None, {(path, channel name): table})``.

    Raises:
        MetadataError: A stored metadata record is not a valid table.
    """
    name = reader.path
    whole = resolve_groups(None, None, reader.groups, recording=name)
    per: dict[tuple[str, str], GroupTable] = {}
    for rec in reader.read_metadata().get(fmt.META_GROUPS, []):
        ch = rec.get("channel")
        groups = rec.get("groups")
        if isinstance(ch, str) and isinstance(groups, list):
            per[(reader.path, ch)] = groups_from_list(
                groups, source=f"{name} (metadata record for {ch})"
            )
    return whole, per


def recording_ungrouped(reader: RecordingReader) -> dict[str | None, GroupTable]:
    """Read a recording's ``kvtool.ungrouped`` records: the kind of events without group_idx.

    ``replay --annotate --group-meta none=KIND -o COPY`` stores the flag's rule so (issue
    21); it applies as the flag would (:func:`kvtool.annotate.ungrouped_from_record`).

    Args:
        reader: The open recording.

    Returns:
        Channel name (None: every channel) → the rule, as a partial table.

    Raises:
        MetadataError: A stored record does not have its shape.
    """
    out: dict[str | None, GroupTable] = {}
    for rec in reader.read_metadata().get(fmt.META_UNGROUPED, []):
        ch = rec.get("channel")
        key = ch if isinstance(ch, str) else None
        where = f"{reader.path} kvtool.ungrouped record" + (f" for {key}" if key else "")
        out.setdefault(key, ungrouped_from_record(rec, source=where))
    return out


def learn(
    readers: Sequence[RecordingReader],
    annotation: Annotation,
) -> GroupLearner:
    """The learning pass: what annotated stores of channels without metadata say.

    Reads the inputs in merge order (the same-batch rule included, so a copy of a batch
    teaches nothing twice) with a projection that decodes only stores'
    ``(group_idx, kind, window)``; payloads that are not batches are skipped (the
    commands report them when they read the events).

    Args:
        readers: The open recordings.
        annotation: The metadata sources (says which channels need learning).

    Returns:
        The learner, positions being merge positions.
    """
    learner = GroupLearner()
    need: dict[tuple[str, int], bool] = {}
    for r in readers:
        for ch in r.channels.values():
            need[(r.path, ch.id)] = annotation.needs_learning(ch.name)
    if not any(need.values()):
        return learner
    for _i, m in merge_messages([r.messages() for r in readers]):
        ch = m.channel
        if not need.get((ch.path, ch.id), True):
            continue
        try:
            rank, events = learn_events(m.data, seq=m.seq)
        except ProtocolError:
            continue
        learner.observe(
            ch.name, event_rank(ch.dp_rank, rank), events, m.seq, position=merge_position(m)
        )
    return learner


def resolve_annotation(
    paths: Sequence[str | os.PathLike[str]] = (),
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    readers: Sequence[RecordingReader] | None = None,
    learn_from_input: bool = True,
    given: GroupTable | None = None,
) -> Annotation:
    """Build THE annotation of an input: metadata sources by precedence, then learned.

    Args:
        paths: Recordings (opened and closed here), unless ``readers`` is given.
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        readers: Open recordings to use instead of ``paths`` (their messages are read
            once more for learning; the caller keeps them open).
        learn_from_input: Run the learning pass for channels without metadata.
        given: A table already parsed from ``groups_file``/``group_flags`` (not parsed
            again).

    Returns:
        The frozen, picklable :class:`kvtool.annotate.Annotation`.

    Raises:
        MetadataError: Invalid metadata, or both a file and flags.
        RecordingError: A recording cannot be opened.
    """
    if given is None and (groups_file is not None or group_flags):
        given = resolve_groups(groups_file, group_flags, None)
    opened: list[RecordingReader] = []
    try:
        if readers is None:
            for p in paths:
                opened.append(open_recording(p))
            rs: Sequence[RecordingReader] = opened
        else:
            rs = readers
        tables: dict[str, GroupTable] = {}
        # A copy's stored none=KIND rule (issue 21), per channel: applies as the flag would.
        rules: dict[str, GroupTable] = {}
        if given is None or given.partial:
            for r in rs:
                whole, per = recording_tables(r)
                stored = recording_ungrouped(r)
                for ch in r.channels.values():
                    t = per.get((r.path, ch.name)) or whole
                    if t is not None and ch.name not in tables:
                        tables[ch.name] = t
                    rule = stored.get(ch.name) or stored.get(None)
                    if rule is not None and ch.name not in rules:
                        rules[ch.name] = rule
        if given is not None and given.partial:
            # --group-meta flags name some groups: merged over each channel's metadata
            # (a channel without any, or a live stream's, takes the flags alone).
            tables = {name: merge_over(given, t) for name, t in tables.items()}
            if given.groups or not learn_from_input:
                return Annotation(given, tables, recorded_ungrouped=rules)
            # Only none=KIND: the groups of a channel without metadata are learned.
            learner = learn(rs, Annotation(given, tables, recorded_ungrouped=rules))
            return Annotation(given, tables, learner.resolved(), tuple(learner.conflicts()), rules)
        base = Annotation(given, tables, recorded_ungrouped=rules)
        if given is not None or not learn_from_input:
            return base
        learner = learn(rs, base)
        return Annotation(None, tables, learner.resolved(), tuple(learner.conflicts()), rules)
    finally:
        for r in opened:
            r.close()


__all__ = [
    "DEDUPE_MAX_KEYS",
    "DEDUPE_WINDOW_NS",
    "BatchKey",
    "MergeFindings",
    "MergePosition",
    "learn",
    "learn_events",
    "merge_messages",
    "merge_position",
    "recording_tables",
    "recording_ungrouped",
    "resolve_annotation",
]
