"""Issue 20: heavy preemption, detected from the stream, is a what-if condition."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtool.report.whatif import parse_what_if, what_if
from kvtool.report.whatif.build import RESUME_BATCHES, RESUME_TAIL_BATCHES
from tests.test_report import record_batches, removed, stored

FA = {"group": 0, "kind": "full_attention"}
DATA = Path(__file__).parent / "data" / "whatif"


def _stream(
    preempted: int, others: int, pause: int, *, past: bool = True
) -> list[list[dict[str, object]]]:
    """Requests that store a chain, lose it to eviction, and come back ``pause`` batches on,
    computing the chain again and going on past its old tail (a preempted request resuming
    mid-prefill), or, with ``past=False``, ending at it (one preempted while decoding).
    """
    batches: list[list[dict[str, object]]] = []
    for r in range(preempted):
        chain = [1000 * (r + 1) + i for i in range(3)]
        batches.append([stored(chain, **FA)])
        batches.append([removed(chain[::-1], 0)])
        batches.extend([] for _ in range(pause - 1))
        batches.append([stored([*chain, chain[-1] + 1] if past else chain, **FA)])
    for r in range(others):
        batches.append([stored([900_000 + 10 * r + i for i in range(2)], **FA)])
    return batches


def _conditions(tmp_path: Path, batches: list[list[dict[str, object]]]) -> dict[str, object]:
    path = record_batches(tmp_path / "p.mcap", batches)
    entry = what_if([path], parse_what_if("+4")).entries[0]
    names = {c["condition"]: c["detail"] for c in entry["conditions"]}  # type: ignore[attr-defined]
    return {"names": names, "resumed": entry["resumed_requests"], "requests": entry["requests"]}


def test_requests_resuming_within_a_few_steps_are_heavy_preemption(tmp_path: Path) -> None:
    got = _conditions(tmp_path, _stream(preempted=12, others=20, pause=2))
    assert got["resumed"] == 12
    assert "heavy_preemption" in got["names"]  # type: ignore[operator]
    assert "12 of 44 requests" in got["names"]["heavy_preemption"]  # type: ignore[index]


def test_a_chain_computed_again_after_a_pause_is_a_next_turn_not_preemption(
    tmp_path: Path,
) -> None:
    got = _conditions(tmp_path, _stream(preempted=12, others=20, pause=RESUME_BATCHES + 5))
    assert got["resumed"] == 0 and "heavy_preemption" not in got["names"]  # type: ignore[operator]


def test_a_request_preempted_while_decoding_resumes_up_to_its_old_tail(tmp_path: Path) -> None:
    # It recomputes its prompt and generated tokens: the store ends where it stopped, and
    # may come a decode block (``block_size`` steps) plus its wait after that tail's store.
    got = _conditions(tmp_path, _stream(12, 20, RESUME_TAIL_BATCHES - 1, past=False))
    assert got["resumed"] == 12 and "heavy_preemption" in got["names"]  # type: ignore[operator]
    (tmp_path / "late").mkdir()
    got = _conditions(tmp_path / "late", _stream(12, 20, RESUME_TAIL_BATCHES + 5, past=False))
    assert got["resumed"] == 0 and "heavy_preemption" not in got["names"]  # type: ignore[operator]


def test_a_few_preemptions_are_not_heavy(tmp_path: Path) -> None:
    got = _conditions(tmp_path, _stream(preempted=3, others=20, pause=1))
    assert got["resumed"] == 3 and "heavy_preemption" not in got["names"]  # type: ignore[operator]


@pytest.mark.parametrize("shape", ["full", "gemma3", "mamba"])
def test_the_reruns_recordings_show_no_heavy_preemption(shape: str) -> None:
    # Their N0 runs had 3, 0 and 0 preemptions (truth.json).
    (path,) = (DATA / shape).glob("*.mcap")
    entry = what_if([path], parse_what_if("+10")).entries[0]
    names = [c["condition"] for c in entry["conditions"]]  # type: ignore[attr-defined]
    assert "heavy_preemption" not in names
    assert entry["resumed_requests"] <= 3  # type: ignore[operator]
