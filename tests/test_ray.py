"""report --ray: the same map and reduce on a local Ray cluster gives the local report exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.report import build_report
from tests.test_report import record_capture

# Loopback only: tests/conftest.py turns Ray's cluster mode off before Ray is imported.
ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

runner = CliRunner()


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[None]:
    # A cluster of this test's own (2 CPUs, no dashboard); shut down by this process only.
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.parametrize("name", ["gemma3", "gemma3.byteshash", "full_only"])
def test_ray_equals_local(name: str, tmp_path: Path, local_cluster: None) -> None:
    rec = record_capture(name, tmp_path / "r.mcap")
    local = build_report([rec], chunk_bytes=4000, every_ns=10_000_000).to_dict()
    on_ray = build_report(
        [rec], chunk_bytes=4000, every_ns=10_000_000, ray_address="auto"
    ).to_dict()
    assert on_ray == local
    assert ray.is_initialized()  # a cluster kvtool did not connect to is left connected


def test_ray_attributes_removes_without_group_idx(tmp_path: Path, local_cluster: None) -> None:
    # The Ray tasks hand back every column the builder reads: removes without group_idx
    # are attributed with the event index (a table without it made the report fail).
    from tests.test_annotation_core import _edge_cases

    rec, _flags = _edge_cases(tmp_path)["legacy-removes"]
    local = build_report([str(rec)], chunk_bytes=64).to_dict()
    on_ray = build_report([str(rec)], chunk_bytes=64, ray_address="auto").to_dict()
    assert on_ray == local


def test_cli_ray_equals_local(tmp_path: Path, local_cluster: None) -> None:
    a = record_capture("gemma3", tmp_path / "a.mcap")
    b = record_capture("gemma3.byteshash", tmp_path / "b.mcap", endpoint="tcp://127.0.0.1:5558")
    out = []
    for extra in ([], ["--ray", "auto"]):
        result = runner.invoke(app, ["report", str(a), str(b), "--format", "json", *extra])
        assert result.exit_code == 0, result.stderr
        out.append(json.loads(result.stdout))
    assert out[0] == out[1]


def test_issue10_ray_fleet_units_equal_local(tmp_path: Path, local_cluster: None) -> None:
    # Three ranks, one recording each: three units, each a Ray task that reads its own
    # recording (by absolute path) and returns a partial report; merged exactly.
    from kvtool.report.partial import plan_units
    from tests.test_report_partial import _fleet, _same

    paths = _fleet(tmp_path, ["gemma3", "gemma3.byteshash", "full_only"])
    assert len(plan_units(paths)) == 3
    local = build_report(paths, every_ns=5_000_000).to_dict()
    on_ray = build_report(paths, every_ns=5_000_000, ray_address="auto").to_dict()
    _same(on_ray, local)
    assert on_ray["source"]["recordings"] == [str(p) for p in paths]


def test_issue23_an_unreachable_ray_address_is_one_line_fast() -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:  # a port nobody listens on (bound, never listening)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "kvtool", "report", "recordings/gemma3.mcap", "--ray",
             f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "cannot connect to the Ray cluster" in lines[0], proc.stderr
