"""The pure sequencer (issue 9.5): no sockets; hypothesis drives it through arbitrary streams."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvtool.capture import seqstate
from kvtool.capture.sequencer import (
    MAX_PLAUSIBLE_JUMP,
    MAX_REPLY_BYTES,
    MAX_REPLY_COUNT,
    Action,
    Budget,
    CaptureStats,
    Limits,
    LiveOrder,
    Lose,
    NewChannel,
    ReplyVerdict,
    ReplyWindow,
    Request,
    ResetReplySocket,
    Resolution,
    Restart,
    Sequencer,
    Stray,
    Verdict,
    Write,
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
    monkeypatch.setattr(seqstate, "MAX_REPLY_COUNT", 10)  # read where it is defined
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


# ------------------------------------------------------------------ Sequencer

_TOPICS = (b"a", b"b")
_EXTRA_TOPIC = b"zz"  # past max_channels: malformed, never a channel
_LIMITS = Limits(
    replay_timeout_ns=100,
    quiet_ns=50,
    replay_deadline_ns=300,
    max_held_bytes=120,
    max_late_replies=20,
    max_channels=len(_TOPICS),
    max_remembered=50,
    stop_tail_quiet_ns=10,
)
_BUFFER_STEPS = 30  # the model publisher's replay buffer
_MAX_PAYLOAD = 40
_LOST_BOUND = MAX_PLAUSIBLE_JUMP + 2 * MAX_REPLY_COUNT + 1
_LIES = (
    st.integers(0, 2**64 - 1)
    | st.integers(2**63 - 40, 2**63 + 40)
    | st.integers(0, 80)
    | st.integers(MAX_PLAUSIBLE_JUMP - 5, MAX_PLAUSIBLE_JUMP + 5)
)


class SequencerMachine(RuleBasedStateMachine):
    """The whole per-endpoint sequencer against a model publisher and its replay socket.

    Live batches come in order, skipped, repeated (stray or duplicate), after restarts
    and implausible jumps; the replay socket answers honestly (in request order, maybe
    partly), lies (any seq, near 2**63 too), or goes silent; time passes in ticks and
    busy stretches; the stop runs the recorder's stop sequence. Checked on every action:
    per channel and epoch the Write and Lose actions walk the seqs contiguously (so a
    seq is written at most once, in order, or ledgered lost), an epoch opens where its
    Restart says, no lost range is implausibly large, held bytes stay bounded; after
    the stop, every live seq of the last epoch is covered -- nothing silently missing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.stopped = False
        self.pub_next: dict[bytes, int] = dict.fromkeys(_TOPICS, 0)
        self.run: dict[bytes, int] = dict.fromkeys(_TOPICS, 0)
        # Channels may also come from replies (an old-layout reply without a topic
        # belongs to the subscribed topic, b""), so the model tracks any topic.
        self.buffer: list[tuple[bytes, int, bytes]] = []  # the replay buffer, publish order
        self.answers: list[tuple[bytes, int, bytes] | None] = []  # queued replies; None: end
        self.cursor: dict[bytes, int | None] = defaultdict(lambda: None)
        self.epoch_start: dict[bytes, int | None] = defaultdict(lambda: None)
        self.channels: set[bytes] = set()
        self.written: dict[tuple[bytes, int], list[int]] = {}
        self.epoch: dict[bytes, int] = defaultdict(int)
        self.since_restart: dict[bytes, list[int]] = defaultdict(list)
        self.strays: list[tuple[bytes, int]] = []
        self.seq = Sequencer("tcp://127.0.0.1:5557", 0)

    @initialize(has_replay=st.booleans(), history=st.booleans())
    def start(self, has_replay: bool, history: bool) -> None:
        self.seq = Sequencer(
            "tcp://127.0.0.1:5557",
            0,
            has_replay=has_replay,
            history=history,
            limits=_LIMITS,
            stats=CaptureStats(),
            budget=Budget(),
        )
        if history:
            self._do(self.seq.start_history(self.now))

    # ------------------------------------------------------------ the model
    def _payload(self, topic: bytes, seq: int) -> bytes:
        return b"%s/%d/%d" % (topic, self.run[topic], seq % 10**6)

    def _do(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, NewChannel):
                assert a.topic not in self.channels
                assert len(self.channels) < _LIMITS.max_channels
                self.channels.add(a.topic)
            elif isinstance(a, Restart):
                self.epoch[a.topic] += 1
                self.cursor[a.topic] = None
                self.epoch_start[a.topic] = 0 if a.to_seq <= MAX_PLAUSIBLE_JUMP else a.to_seq
                self.since_restart[a.topic] = []
            elif isinstance(a, (Write, Lose)):
                assert a.topic in self.channels
                first = a.seq if isinstance(a, Write) else a.first
                last = a.seq if isinstance(a, Write) else a.last
                cur = self.cursor[a.topic]
                if cur is None:
                    start = self.epoch_start[a.topic]
                    assert start is None or first == start, (a, start)
                else:
                    assert first == cur, (a, cur)  # contiguous: never twice, never skipped
                assert first <= last and last - first < _LOST_BOUND, a
                self.cursor[a.topic] = last + 1
                if isinstance(a, Write):
                    self.written.setdefault((a.topic, self.epoch[a.topic]), []).append(a.seq)
            elif isinstance(a, Stray):
                self.strays.append((a.topic, a.seq))
            elif isinstance(a, Request):
                self.answers += [b for b in self.buffer if b[1] >= a.start_seq]
                self.answers.append(None)
            elif isinstance(a, ResetReplySocket):
                self.answers.clear()  # a new socket: what the old one queued is gone
        self._check_held()

    def _check_held(self) -> None:
        s = self.seq
        assert s.held_bytes <= _LIMITS.max_held_bytes + _MAX_PAYLOAD
        over = s.held_bytes > _LIMITS.max_held_bytes
        assert not over or (s.pending is not None and s.pending.abandon)

    def _live(self, topic: bytes, seq: int, payload: bytes) -> None:
        self._do(self.seq.live(topic, seq, payload, self.now, self.now))
        if topic in self.seq.channels:  # else: one topic too many, malformed
            self.since_restart[topic].append(seq)

    def _publish(self, topic: bytes, deliver: bool) -> None:
        seq = self.pub_next[topic]
        payload = self._payload(topic, seq)
        self.buffer = [*self.buffer, (topic, seq, payload)][-_BUFFER_STEPS:]
        self.pub_next[topic] = seq + 1
        if deliver:
            self._live(topic, seq, payload)

    # ---------------------------------------------------------------- rules
    @precondition(lambda self: not self.stopped)
    @rule(topic=st.sampled_from(_TOPICS), n=st.integers(1, 6))
    def live_in_order(self, topic: bytes, n: int) -> None:
        for _ in range(n):
            self._publish(topic, deliver=True)

    @precondition(lambda self: not self.stopped)
    @rule(topic=st.sampled_from(_TOPICS), k=st.integers(1, 5))
    def live_missing(self, topic: bytes, k: int) -> None:
        for _ in range(k):
            self._publish(topic, deliver=False)  # in the replay buffer only

    @precondition(lambda self: not self.stopped)
    @rule(topic=st.sampled_from(_TOPICS), data=st.data())
    def live_stray_or_duplicate(self, topic: bytes, data: st.DataObject) -> None:
        if self.pub_next[topic] == 0:
            return
        seq = data.draw(st.integers(max(0, self.pub_next[topic] - 40), self.pub_next[topic] - 1))
        self._live(topic, seq, self._payload(topic, seq))

    @precondition(lambda self: not self.stopped)
    @rule(topic=st.sampled_from(_TOPICS), first=st.integers(0, 3))
    def publisher_restart(self, topic: bytes, first: int) -> None:
        self.run[topic] += 1
        self.pub_next[topic] = first
        self.buffer = [b for b in self.buffer if b[0] != topic]

    @precondition(lambda self: not self.stopped)
    @rule(topic=st.sampled_from(_TOPICS), to=_LIES)
    def live_jump(self, topic: bytes, to: int) -> None:
        self.pub_next[topic] = min(to, 2**64 - 1)
        self._publish(topic, deliver=True)

    @precondition(lambda self: not self.stopped and len(self.channels) == _LIMITS.max_channels)
    @rule(seq=st.integers(0, 50))
    def live_on_too_many_topics(self, seq: int) -> None:
        before = self.seq.stats.malformed
        extra = b"extra/%d" % len(self.since_restart)  # never a channel yet
        self._do(self.seq.live(extra, seq, b"x", self.now, self.now))
        assert extra not in self.seq.channels
        assert self.seq.stats.malformed >= before
        # While a replay is pending the batch is held like every live batch; once nothing
        # is pending it has been placed, and a batch on a topic past the cap is counted,
        # never dropped silently (held ones are counted when their request ends, together).
        if self.seq.pending is None and not self.seq.budget.full:
            assert self.seq.stats.malformed >= before + 1

    @precondition(lambda self: not self.stopped)
    @rule(k=st.integers(1, 40))
    def replay_answers(self, k: int) -> None:
        for _ in range(k):
            if not self.answers:
                return
            item = self.answers.pop(0)
            if item is None:
                self._do(self.seq.reply_end(self.now))
            else:
                topic, seq, payload = item
                self._do(self.seq.reply(topic, seq, payload, self.now, self.now))

    @precondition(lambda self: not self.stopped)
    @rule(
        topic=st.sampled_from([*_TOPICS, None, _EXTRA_TOPIC]),
        seq=_LIES,
        size=st.integers(0, _MAX_PAYLOAD),
    )
    def replay_lies(self, topic: bytes | None, seq: int, size: int) -> None:
        self._do(self.seq.reply(topic, seq, b"L" * size, self.now, self.now))

    @precondition(lambda self: not self.stopped)
    @rule()
    def replay_goes_silent(self) -> None:
        self.answers.clear()

    @precondition(lambda self: not self.stopped)
    @rule(dt=st.sampled_from([1, 20, 60, 120, 250, 600]))
    def tick(self, dt: int) -> None:
        self.now += dt
        self._do(self.seq.tick(self.now))
        assert self.seq.held_bytes <= _LIMITS.max_held_bytes

    @precondition(lambda self: not self.stopped)
    @rule(dt=st.sampled_from([50, 300]))
    def busy(self, dt: int) -> None:
        self.now += dt
        self.seq.credit_busy(self.now, dt)

    @precondition(lambda self: not self.stopped)
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        self._stop(data.draw(st.booleans()), data.draw(st.booleans()))

    @precondition(lambda self: self.stopped)
    @rule()
    def stopped_stays_stopped(self) -> None:
        assert self.seq.pending is None and not self.seq.held

    def _stop(self, answer: bool, settle_all: bool) -> None:
        s = self.seq
        self.now += 20
        s.begin_stop(self.now)
        for _ in range(5):
            self._do(s.stop_tail(self.now))
            if s.pending is None:
                break
            if answer:
                self.replay_answers(200)
            else:
                self.now += 30
                self._do(s.check_replay(self.now))
        self.now += 30
        self._do(s.abort_replay(self.now))
        self._do(s.release(self.now))
        done = False
        while settle_all and not done:
            actions, done = s.settle(3)
            self._do(actions)
        if not done:
            self._do(s.settle(2)[0])
            self._do(s.settle_give_up())
        self.stopped = True
        self._check_nothing_missing()

    def _check_nothing_missing(self) -> None:
        s = self.seq
        assert s.pending is None and not s.held and s.held_bytes == 0
        for topic, ch in s.channels.items():
            assert ch.suspect is None and not ch.reserve
            cur = self.cursor[topic]
            for seq in self.since_restart[topic]:
                # Written, lost, or dropped as a stray/duplicate behind the stream.
                assert cur is not None and seq < cur, (topic, seq, cur)
        for seqs in self.written.values():
            assert seqs == sorted(set(seqs))
        assert s.stats.stray == len(self.strays)

    def teardown(self) -> None:
        if not self.stopped:
            self._stop(answer=True, settle_all=True)


TestSequencerMachine = SequencerMachine.TestCase
TestSequencerMachine.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_issue8_7_live_jump_near_2_63_opens_a_new_run() -> None:
    """A live seq 2**63-10 after seq 20: a restart to a new run, not a ~9.2e18 gap."""
    s = Sequencer("tcp://127.0.0.1:5557", 0, has_replay=False)
    acts = [a for seq in (*range(21), 2**63 - 10, 2**63 - 9) for a in s.live(b"", seq, b"p", 0, 0)]
    assert [a for a in acts if isinstance(a, (Lose, Restart))] == [Restart(b"", 20, 2**63 - 10)]
    assert [a.seq for a in acts if isinstance(a, Write)] == [*range(21), 2**63 - 10, 2**63 - 9]
    assert s.stats.lost == 0 and s.stats.restarts == 1


def test_issue8_7_a_reply_cannot_borrow_another_channels_seq_range() -> None:
    """Channel b at seq ~2**32 must not make a lie for channel a at that height plausible
    (found by the state machine: the ledger claimed ~4.3e9 lost batches on a)."""
    s = Sequencer("tcp://127.0.0.1:5557", 0)
    far = MAX_PLAUSIBLE_JUMP + 100
    s.live(b"a", 0, b"p", 0, 0)
    s.live(b"b", far, b"p", 0, 0)
    acts = s.live(b"a", 2, b"p", 0, 0)  # a gap at a:1, asked of the replay socket
    assert [a for a in acts if isinstance(a, Request)] == [Request(1, "gap", b"a")]
    acts = s.reply(b"a", 1, b"r", 0, 1)  # fills the hole: the gap ends (issue 23)
    acts += s.reply(b"a", far + 5, b"lie", 0, 1)  # inside the endpoint's window, not a's
    acts += s.reply_end(2)
    assert [a.seq for a in acts if isinstance(a, Write)] == [1, 2]
    assert s.stats.replay_rejected == 1
    s.begin_stop(10**9)
    s.release(10**9)
    acts, done = s.settle()
    assert done and not [a for a in acts if isinstance(a, Lose)]
    assert s.stats.lost == 0


def test_issue8_3_held_bytes_never_pass_the_bound_by_more_than_one_batch() -> None:
    """Live batches held for a slow replay: the request is given up as soon as the bound
    is passed (not at the next tick, which a fast stream may not reach for a burst)."""
    limits = Limits(max_held_bytes=1_000)
    s = Sequencer("tcp://127.0.0.1:5557", 0, limits=limits)
    s.live(b"", 0, b"p", 0, 0)
    s.live(b"", 2, b"x" * 100, 0, 0)  # a gap at 1: held from here on
    assert s.pending is not None
    peak = 0
    for seq in range(3, 40):
        acts = s.live(b"", seq, b"x" * 100, 0, 0)
        peak = max(peak, s.held_bytes)
    assert peak <= limits.max_held_bytes + 100
    assert s.pending is None and s.stats.replay_timeouts == 1
    assert [a for a in acts if isinstance(a, Write)][-1].seq == 39
    assert s.stats.lost == 1  # seq 1, in the ledger


def test_a_whole_vllm_replay_buffer_is_not_a_flood() -> None:
    """An honest answer to a request is vLLM's whole buffer (10,000 batches of ~16 kB):
    every reply is accepted. A 64 MiB cap took it for a flood and lost its tail (bench)."""
    from kvtool.capture.sequencer import VLLM_BUFFER_STEPS, ReplyVerdict

    w = ReplyWindow(0, VLLM_BUFFER_STEPS)
    verdicts = {w.check(b"", seq, 16_000) for seq in range(VLLM_BUFFER_STEPS)}
    assert verdicts == {ReplyVerdict.ACCEPT} and not w.flooded
    assert w.count == VLLM_BUFFER_STEPS
