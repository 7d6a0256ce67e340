"""The pure sequencer (issue 9.5): no sockets; hypothesis drives it through arbitrary streams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtool.capture import sequencer
from kvtool.capture.sequencer import (
    MAX_REPLY_BYTES,
    MAX_REPLY_COUNT,
    LiveOrder,
    ReplyVerdict,
    ReplyWindow,
    Resolution,
    Verdict,
)

# ----------------------------------------------------------------- LiveOrder


class Channel:
    """What the recorder does with LiveOrder's answers, without sockets or a replay.

    Every delivered live seq ends up written, counted as a stray, or held (at most one);
    every seq skipped inside an epoch is lost. Epochs are the recorder's (restarts it saw).
    """

    def __init__(self) -> None:
        self.order = LiveOrder()
        self.expected: int | None = None
        self.epoch = 0
        self.written: list[tuple[int, int]] = []  # (recorder epoch, seq)
        self.lost: list[tuple[int, int, int]] = []  # (epoch, first, last)
        self.strays: list[int] = []
        self.held: int | None = None

    def _write(self, seq: int) -> None:
        self.written.append((self.epoch, seq))
        self.expected = seq + 1

    def _place(self, seq: int) -> None:
        verdict = self.order.judge(seq, self.expected)
        if verdict is Verdict.WRITE:
            self._write(seq)
        elif verdict is Verdict.GAP:
            assert self.expected is not None
            self.lost.append((self.epoch, self.expected, seq - 1))
            self._write(seq)
        else:
            assert verdict is Verdict.HOLD and self.order.suspect == seq
            self.held = seq

    def _resolve(self, next_seq: int | None) -> None:
        if self.held is None:
            assert self.order.resolve(next_seq, self.expected) is None
            return
        held, self.held = self.held, None
        if self.order.resolve(next_seq, self.expected) is Resolution.STRAY:
            self.strays.append(held)
            return
        # A restart: a new epoch, numbered from 0; what came before the held seq is lost.
        self.epoch += 1
        self.expected = 0
        self._place(held)

    def live(self, seq: int) -> None:
        self._resolve(seq)
        self._place(seq)

    def quiet(self) -> None:
        self._resolve(None)


class LiveStream(RuleBasedStateMachine):
    """A publisher that sends in order, skips, repeats old seqs and restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.ch = Channel()
        self.next_seq = 0  # the publisher's next seq
        self.sent: list[int] = []  # every live seq delivered
        self.restarts = 0
        self.strays_sent = 0

    def _deliver(self, seq: int) -> None:
        self.sent.append(seq)
        self.ch.live(seq)

    @rule(n=st.integers(1, 5))
    def in_order(self, n: int) -> None:
        for _ in range(n):
            self._deliver(self.next_seq)
            self.next_seq += 1

    @rule(k=st.integers(1, 4))
    def missing(self, k: int) -> None:
        self.next_seq += k

    @precondition(lambda self: self.next_seq > 0)
    @rule(data=st.data())
    def stray_or_duplicate(self, data: st.DataObject) -> None:
        self.strays_sent += 1
        self._deliver(data.draw(st.integers(0, self.next_seq - 1)))

    @rule(first=st.integers(0, 3))
    def restart(self, first: int) -> None:
        self.restarts += 1
        self.next_seq = first

    @rule()
    def quiet(self) -> None:
        self.ch.quiet()

    @invariant()
    def written_once_in_order_per_epoch(self) -> None:
        by_epoch: dict[int, list[int]] = {}
        for epoch, seq in self.ch.written:
            by_epoch.setdefault(epoch, []).append(seq)
        for seqs in by_epoch.values():
            assert seqs == sorted(set(seqs)), seqs  # ascending: never a seq twice

    @invariant()
    def nothing_silently_missing(self) -> None:
        # Every delivered batch is written, dropped as a counted stray, or held.
        held = [] if self.ch.held is None else [self.ch.held]
        assert len(self.sent) == len(self.ch.written) + len(self.ch.strays) + len(held)
        # Inside an epoch, every seq between the first and the last written is written or lost.
        for epoch in {e for e, _ in self.ch.written}:
            seqs = {s for e, s in self.ch.written if e == epoch}
            lost = {s for e, a, b in self.ch.lost if e == epoch for s in range(a, b + 1)}
            assert not seqs & lost
            assert set(range(min(seqs | lost), max(seqs) + 1)) <= seqs | lost

    @invariant()
    def restarts_never_invented(self) -> None:
        # The recorder sees at most as many restarts as happened, plus one per stray it
        # could not tell from a restart (a repeated seq 0 at a quiet moment).
        assert self.ch.epoch <= self.restarts + self.strays_sent

    def teardown(self) -> None:
        self.ch.quiet()
        self.written_once_in_order_per_epoch()
        self.nothing_silently_missing()


TestLiveStream = LiveStream.TestCase
TestLiveStream.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


def test_issue8_6_one_old_seq_then_the_old_run_is_a_stray() -> None:
    ch = Channel()
    for s in [*range(31), 12, *range(31, 40)]:
        ch.live(s)
    assert [s for _, s in ch.written] == list(range(40))
    assert ch.strays == [12] and ch.epoch == 0


def test_a_restart_is_a_behind_seq_followed_by_its_next() -> None:
    ch = Channel()
    for s in [*range(10), 0, 1, 2]:
        ch.live(s)
    assert ch.written == [(0, s) for s in range(10)] + [(1, 0), (1, 1), (1, 2)]
    assert ch.strays == [] and ch.lost == []


def test_a_restart_seen_late_starts_its_epoch_with_a_lost_range() -> None:
    ch = Channel()
    for s in [*range(10), 3, 4]:
        ch.live(s)
    assert ch.written[-2:] == [(1, 3), (1, 4)] and ch.lost == [(1, 0, 2)]


def test_a_restart_followed_by_silence_is_told_by_seq_0() -> None:
    ch = Channel()
    for s in range(10):
        ch.live(s)
    ch.live(0)
    ch.quiet()
    assert ch.written[-1] == (1, 0)
    ch.live(4)
    ch.quiet()
    assert ch.strays == [] and ch.lost == [(1, 1, 3)]
    ch.live(2)  # behind, then quiet: not 0, so a stray
    ch.quiet()
    assert ch.strays == [2]


# --------------------------------------------------------------- ReplyWindow


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(0, 2**64 - 1),
    live_high=st.none() | st.integers(0, 2**64 - 1),
    replies=st.lists(
        st.tuples(
            st.sampled_from([None, b"", b"kv"]),
            st.integers(0, 2**64 - 1) | st.integers(0, 50),
            st.integers(0, MAX_REPLY_BYTES // 4),
        ),
        max_size=40,
    ),
)
def test_issue8_7_reply_window_accepts_only_the_requested_range(
    start: int, live_high: int | None, replies: list[tuple[bytes | None, int, int]]
) -> None:
    """Accepted replies lie in [start, hi], ascend per topic and stay under both caps,
    whatever the socket sends (lies near 2**63 included)."""
    w = ReplyWindow(start, live_high)
    assert w.hi == max(start, live_high or 0) + MAX_REPLY_COUNT
    accepted: dict[bytes | None, list[int]] = {}
    nbytes = 0
    for topic, seq, size in replies:
        verdict = w.check(topic, seq, size)
        if verdict is ReplyVerdict.ACCEPT:
            accepted.setdefault(topic, []).append(seq)
            nbytes += size
        elif verdict is ReplyVerdict.REJECT:
            assert not start <= seq <= w.hi or seq <= max(accepted.get(topic, [-1]))
    for seqs in accepted.values():
        assert seqs == sorted(set(seqs)) and all(start <= s <= w.hi for s in seqs)
    assert nbytes == w.nbytes <= MAX_REPLY_BYTES and w.count <= MAX_REPLY_COUNT


def test_issue8_3_reply_window_floods_past_its_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sequencer, "MAX_REPLY_COUNT", 10)
    w = ReplyWindow(5, 100)
    verdicts = [w.check(b"", 5 + i, 1) for i in range(12)]
    assert verdicts == [ReplyVerdict.ACCEPT] * 10 + [ReplyVerdict.DISCARD] * 2
    assert w.flooded and w.count == 10
    # Once flooding, even a reply that would fit is discarded.
    assert w.check(b"", 100, 1) is ReplyVerdict.DISCARD


def test_issue8_3_reply_window_floods_past_its_bytes() -> None:
    w = ReplyWindow(0)
    assert w.check(None, 0, MAX_REPLY_BYTES - 1) is ReplyVerdict.ACCEPT
    assert w.check(None, 1, 2) is ReplyVerdict.DISCARD and w.flooded
