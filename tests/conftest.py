"""Shared fixtures: the real vLLM captures copied into tests/data/captures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvtool import _jit
from tests.peer import read_frames

# The console entry caches numba's kernels in a folder named by a digest of kvtool's sources
# (kvtool._jit.use_a_cache_of_these_sources); the in-process tests use that folder too, so a
# kernel compiles once for both. Set before any test imports numba.
_jit.use_a_cache_of_these_sources()

# Loopback only: Ray turns a node IP of 127.0.0.1 into the machine's interface address
# (ray._private.services.resolve_ip_for_localhost) and binds its servers to every interface
# unless its cluster mode is off; off, every Ray server binds and connects to 127.0.0.1.
# Ray reads this when it is imported, so it is set before any test imports Ray.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

DATA = Path(__file__).parent / "data"
CAPTURES_DIR = DATA / "captures"
_ALL_CAPTURES = sorted(p.name.removesuffix(".frames") for p in CAPTURES_DIR.glob("*.frames"))
# SGLang's captures have their own truth layout (tests/test_sglang.py reads them, issue 21);
# CAPTURES are the vLLM ones, whose truth files share one layout.
SGLANG_CAPTURES = [n for n in _ALL_CAPTURES if n.startswith("sglang_")]
CAPTURES = [n for n in _ALL_CAPTURES if n not in SGLANG_CAPTURES]


def capture_messages(name: str) -> list[tuple[bytes, int, bytes]]:
    """Return a capture as ``(topic, seq, payload)`` tuples."""
    return read_frames(CAPTURES_DIR / f"{name}.frames")


def capture_truth(name: str) -> dict:
    """Return a capture's ``.truth.json``."""
    return json.loads((CAPTURES_DIR / f"{name}.truth.json").read_text())


@pytest.fixture(params=CAPTURES)
def capture(request: pytest.FixtureRequest) -> str:
    """Each capture's name in turn."""
    return request.param


@pytest.fixture(scope="module")
def unconfirmed_recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """The last 10 seqs dropped live; the replay answers 3 of them and never ends."""
    from typer.testing import CliRunner

    from kvtool.cli import app
    from tests.peer import Peer

    msgs = capture_messages("gemma3")
    n = len(msgs)
    out = tmp_path_factory.mktemp("unconfirmed") / "r.mcap"
    with Peer(
        msgs, drop=set(range(n - 10, n)), replay_mode="cut", replay_cut=3, answer_limit=1
    ) as peer:
        res = CliRunner().invoke(
            app,
            [
                "record",
                peer.endpoint,
                "--replay-endpoint",
                peer.replay_endpoint or "",
                "-o",
                str(out),
                "--duration",
                "3s",
                "--replay-timeout",
                "0.3s",
                "--quiet",
            ],
        )
    assert res.exit_code == 3, res.output
    return out, n, peer.endpoint


@pytest.fixture(scope="session", autouse=True)
def _warm_jit_cache() -> None:
    """Load (or first compile) kvtool's numba kernels into the JIT cache before any test.

    A kvtool command that compiles says so on stderr (kvtool._jit.COMPILE_NOTICE); tests
    that run kvtool and assert an empty stderr then run as a user's second run does,
    whatever the test order or a fresh clone's empty cache. The cold run is tested on its
    own, with a cache of its own (tests/test_scan.py).
    """
    if os.environ.get("NUMBA_BOUNDSCHECK") == "1":
        return  # .ci/run's decoder-only step: compiling the report kernels too costs minutes
    from typer.testing import CliRunner

    from kvtool.cli import app

    gemma3 = Path(__file__).parent.parent / "recordings" / "gemma3.mcap"
    result = CliRunner().invoke(app, ["report", str(gemma3), "--format", "json", "-q"])
    assert result.exit_code == 0, result.output
