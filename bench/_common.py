"""Shared helpers for the benches: timing children, medians, machine facts, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
RESULTS_DIR = DATA / "results"
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class Run:
    """One measured child process."""

    wall_s: float
    cpu_s: float
    maxrss_mb: float
    returncode: int


def run_child(
    cmd: list[str],
    *,
    cpus: str | None = None,
    env: dict[str, str] | None = None,
    stdout: Any = subprocess.DEVNULL,
    stderr: Any = None,
) -> Run:
    """Run ``cmd`` and measure wall time, CPU time and peak RSS of that child (wait4)."""
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    full_env = dict(os.environ)
    full_env.update(env or {})
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=full_env)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, proc.returncode)


def run_child_tty(
    cmd: list[str], *, env: dict[str, str] | None = None, stdout: Any = subprocess.DEVNULL
) -> tuple[Run, str]:
    """:func:`run_child` with stderr on a pseudo-terminal (what a person at a terminal sees).

    Returns the run and everything the child wrote to stderr (a terminal's ``\\r\\n`` as
    ``\\n``): kvtool says some things only to a terminal (the cold-compile notice).
    """
    import pty
    import threading

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child's side is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        run = run_child(cmd, env=env, stdout=stdout, stderr=slave)
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    return run, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gb = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    import msgspec
    import polars

    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": round(ram_gb, 1),
        "python": platform.python_version(),
        "polars": polars.__version__,
        "msgspec": msgspec.__version__,
        "loadavg_at_start": [round(x, 2) for x in load],
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "git": git_head(),
    }


def git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout.strip()
    except OSError:
        return "?"


def report_cmd(rec: Path | str, out: Path | str, *extra: str) -> list[str]:
    """``kvtool report REC --format json -q -o OUT`` plus ``extra``: every report run here."""
    return [*kvtool_cmd(), "report", str(rec), "--format", "json", "-q", "-o", str(out), *extra]


def refuse_failed(bench: str, runs: dict[str, list[Run]]) -> bool:
    """Say so on stderr and return True when a measured run failed (its figures are not
    the command's: the bench then writes none)."""
    failed = [
        f"{name} run {i + 1}: exit {r.returncode}"
        for name, rs in runs.items()
        for i, r in enumerate(rs)
        if r.returncode != 0
    ]
    if failed:
        print(
            f"{bench}: {len(failed)} runs failed ({', '.join(failed[:6])}); no result written",
            file=sys.stderr,
        )
    return bool(failed)


def save_result(name: str, result: dict[str, Any]) -> Path:
    """Write one bench's figures to bench/data/results/NAME.json (RESULTS.md is built from them)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    result = {"machine": machine(), "command": " ".join(sys.argv), **result}
    path.write_text(json.dumps(result, indent=1, default=_default) + "\n")
    return path


def _default(o: Any) -> Any:
    if isinstance(o, Run):
        return asdict(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o))


_PROFILES = [0]


def kvtool_cmd() -> list[str]:
    """The kvtool CLI, run from this checkout.

    With ``BENCH_PROFILE_DIR`` set, each run is profiled with cProfile into that
    directory (``kvtool-N.prof``; read with ``python3 bench/profile_top.py FILE``).
    """
    pdir = os.environ.get("BENCH_PROFILE_DIR")
    if pdir:
        Path(pdir).mkdir(parents=True, exist_ok=True)
        _PROFILES[0] += 1
        out = Path(pdir) / f"kvtool-{os.getpid()}-{_PROFILES[0]}.prof"
        return [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "kvtool"]
    return [sys.executable, "-m", "kvtool"]
