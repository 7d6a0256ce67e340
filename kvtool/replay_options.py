"""The options of ``replay --publish``: checked together, then parsed into values.

The command declares the options; this module says which go together and what each
value means (a count, a rate, a duration, a seq set), in the one wording of the errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtool.errors import UsageError

# The publisher's modules (pyzmq) load only when --publish is parsed.
if TYPE_CHECKING:
    from kvtool.pacing import Pacing

__all__ = ["PublishFlags", "Publishing", "parse_publishing"]


def _number(text: str | None, option: str, *, integer: bool = False, zero: bool = False) -> float:
    if text is None:
        raise UsageError(f"{option}: missing value")
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise UsageError(f"{option} {text!r}: expected {kind}") from None
    if value < 0 or (value == 0 and not zero) or value != value:
        raise UsageError(f"{option} {text!r}: must be {'>= 0' if zero else '> 0'}")
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")


def _seconds(text: str | None, option: str) -> float:
    if text is None:
        return 0.0
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"{option} {text!r}: expected seconds (e.g. 2, 0.5, 500ms, 1m)")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2) or "s"]


def _seq_set(text: str | None) -> frozenset[int]:
    from kvtool.replay import parse_seq_range

    out: set[int] = set()
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        a, b = parse_seq_range(part)
        if a is None or b is None or b - a > 10_000_000:
            raise UsageError(f"--drop {part!r}: expected seqs like 5,9,20:30")
        out.update(range(a, b + 1))
    return frozenset(out)


@dataclass(frozen=True)
class PublishFlags:
    """The options of ``replay --publish``, as given on the command line."""

    publish: str | None
    connect: bool
    replay_endpoint: str | None
    legacy_replay: bool
    buffer_steps: str
    renumber: bool
    speed: str | None
    rate: str | None
    max_speed: bool
    loop: str
    wait_subscribers: str
    wait_timeout: str | None
    start_delay: str | None
    hold: str | None
    drop: str | None

    def check(self) -> None:
        """Refuse publishing options without --publish, and pacings given together.

        Raises:
            UsageError: The first option that does not go with the others.
        """
        publishing_only = [
            ("--replay-endpoint", self.replay_endpoint is not None),
            ("--legacy-replay", self.legacy_replay),
            ("--renumber", self.renumber),
            ("--speed", self.speed is not None),
            ("--rate", self.rate is not None),
            ("--max-speed", self.max_speed),
            ("--loop", self.loop != "1"),
            ("--wait-subscribers", self.wait_subscribers != "0"),
            ("--start-delay", self.start_delay is not None),
            ("--drop", self.drop is not None),
            ("--connect", self.connect),
        ]
        if self.publish is None:
            for flag, given in publishing_only:
                if given:
                    raise UsageError(f"{flag} needs --publish ENDPOINT")
        if sum([self.speed is not None, self.rate is not None, self.max_speed]) > 1:
            raise UsageError("give only one of --speed, --rate and --max-speed")
        if self.replay_endpoint is None and self.legacy_replay:
            raise UsageError("--legacy-replay needs --replay-endpoint")


@dataclass(frozen=True)
class Publishing:
    """The options of ``replay --publish``, parsed: what ``publish_recording`` takes."""

    endpoint: str
    replay_endpoint: str | None
    pacing: Pacing
    buffer_steps: int
    loops: int | None
    wait_subscribers: int
    wait_timeout_s: float | None
    start_delay_s: float
    hold_s: float
    drop: frozenset[int]


def parse_publishing(pub: PublishFlags) -> Publishing:
    """Parse the options of ``--publish``.

    Args:
        pub: The options as given.

    Returns:
        Endpoints, pacing, counts and durations.

    Raises:
        UsageError: A value that does not parse, or the same endpoint twice.
    """
    from kvtool.endpoints import parse_endpoint
    from kvtool.pacing import Pacing

    assert pub.publish is not None
    drop = _seq_set(pub.drop)
    endpoint = parse_endpoint(pub.publish, option="--publish", bind=not pub.connect)
    rep_ep = (
        parse_endpoint(pub.replay_endpoint, option="--replay-endpoint")
        if pub.replay_endpoint
        else None
    )
    if rep_ep == endpoint:
        raise UsageError(f"--publish and --replay-endpoint are the same endpoint {endpoint}")
    loops: int | None
    if pub.loop.strip().lower() in ("forever", "inf", "infinite"):
        loops = None
    else:
        loops = int(_number(pub.loop, "--loop", integer=True))
    pacing = Pacing(
        speed=_number(pub.speed, "--speed") if pub.speed is not None else 1.0,
        rate=_number(pub.rate, "--rate") if pub.rate is not None else None,
        max_speed=pub.max_speed,
    )
    steps = int(_number(pub.buffer_steps, "--buffer-steps", integer=True))
    n_wait = int(_number(pub.wait_subscribers, "--wait-subscribers", integer=True, zero=True))
    wait_s = _seconds(pub.wait_timeout, "--wait-timeout") if pub.wait_timeout is not None else None
    delay_s = _seconds(pub.start_delay, "--start-delay")
    hold_s = _seconds(pub.hold, "--hold") if pub.hold is not None else (1.0 if rep_ep else 0.0)
    return Publishing(endpoint, rep_ep, pacing, steps, loops, n_wait, wait_s, delay_s, hold_s, drop)
