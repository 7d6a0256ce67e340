"""What-if accuracy (issue 20): predicted recomputed blocks against real reruns, per kind.

Each shape folder holds a recording at pool N0 (``*.mcap``), ``groups.json`` and
``truth.json`` (the real counts at N0 and at N0 + K from reruns of the same workload on
vLLM's own manager). For every K and kind the script prints the prediction made from
the N0 recording alone, the real count and the error, then the mean and largest
absolute error per kind. It also times the prediction beside a plain report.

    python3 bench/whatif_accuracy.py                       # tests/data/whatif/*
    python3 bench/whatif_accuracy.py /work/shared/whatif/*  # other folders, same layout
    python3 bench/whatif_accuracy.py tests/data/whatif/full --time bench/data/big10.mcap --repeat 5
        # cost: `report -j 1 -q` with and without --what-if (five K), in turn: medians of
        # wall and CPU (user + system), peak RSS, and the ratio run pair by run pair
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvtool.report.whatif import parse_what_if, what_if  # noqa: E402


def shape(folder: Path) -> list[tuple[str, int, int, int, float]]:
    """Return (kind, K, predicted, real, error %) for every K and kind of one folder."""
    truth = json.loads((folder / "truth.json").read_text())
    runs = [r for r in truth["runs"] if r["K_blocks"] > 0]
    mcap = next(folder.glob("*.mcap"))
    extras = parse_what_if(",".join(f"+{r['K_blocks']}" for r in runs))
    groups = folder / "groups.json"
    res = what_if([mcap], extras, groups_file=groups if groups.exists() else None)
    out = []
    for entry, run in zip(res.entries, runs, strict=True):
        real = {r["kind"]: r["restores_after_eviction"] for r in run["by_kind"]}
        for row in entry["by_kind"]:  # type: ignore[attr-defined]
            t = real[row["kind"]]
            p = row["blocks_recomputed"]
            out.append((row["kind"], run["K_blocks"], p, t, (p - t) / t * 100 if t else 0.0))
    return out


def _run(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (KiB) of one CLI run."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtool", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _pid, _status, ru = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped here
    return time.perf_counter() - t, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="*", type=Path)
    ap.add_argument("--time", type=Path, metavar="FILE.mcap", help="time plain vs --what-if")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    folders = a.folders or sorted(p for p in (ROOT / "tests/data/whatif").iterdir() if p.is_dir())
    for folder in folders:
        rows = shape(folder)
        print(f"== {folder.name} ({next(folder.glob('*.mcap')).name})")
        print(f"{'kind':<16} {'+K':>6} {'predicted':>10} {'real':>8} {'error':>8}")
        for kind, k, p, t, e in rows:
            print(f"{kind:<16} {k:>6} {p:>10,} {t:>8,} {e:>+7.1f}%")
        for kind in dict.fromkeys(r[0] for r in rows):
            errs = [abs(r[4]) for r in rows if r[0] == kind]
            print(f"  {kind}: mean |error| {sum(errs) / len(errs):.1f} %, max {max(errs):.1f} %")
    if a.time is not None:
        f = str(a.time)
        plain = ["report", f, "-j", "1", "-q"]
        wi = [*plain, "--what-if", "+10,+50,+100,+500,+1000"]
        _run(wi)  # compile and cache the kernels once
        _run(plain)
        runs: dict[str, list[tuple[float, float, int]]] = {"plain": [], "what-if": []}
        for _ in range(a.repeat):  # in turn, so that load changes hit both alike
            runs["what-if"].append(_run(wi))
            runs["plain"].append(_run(plain))
        for name, rs in runs.items():
            print(
                f"{name:>8}: wall {_median([r[0] for r in rs]):.2f} s, "
                f"CPU {_median([r[1] for r in rs]):.2f} s, "
                f"peak RSS {max(r[2] for r in rs) / 1024:,.0f} MiB (median of {len(rs)})"
            )
        ratios = [w[0] / p[0] for w, p in zip(runs["what-if"], runs["plain"], strict=True)]
        cpu = [w[1] / p[1] for w, p in zip(runs["what-if"], runs["plain"], strict=True)]
        print(
            f"== cost on {a.time.name}: --what-if x5 / plain, wall {_median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}), CPU {_median(cpu):.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
