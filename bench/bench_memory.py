"""Peak RSS of ``kvtool report`` on the 1x and the 10x recordings (goal, issue 19: 10x <= 1.2x 1x).

Peak RSS is the child's own ``ru_maxrss`` from ``wait4`` (what ``/usr/bin/time -v``
prints as "Maximum resident set size"), one process per run, runs interleaved.

    python3 bench/bench_memory.py bench/data/big1.mcap bench/data/big10.mcap --runs 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, median, refuse_failed, report_cmd, run_child, save_result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("small", nargs="?", default=str(ROOT / "bench/data/big1.mcap"))
    ap.add_argument("big", nargs="?", default=str(ROOT / "bench/data/big10.mcap"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--name", default="memory", help="result file name (bench/data/results/)")
    ap.add_argument("--cpus", default=None, help="taskset CPU list, e.g. 1")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="report --jobs (RSS is the driver's; default 1: one process)",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-mem-"))
    files = {"1x": Path(args.small), "10x": Path(args.big)}
    runs: dict[str, list[Any]] = {k: [] for k in files}
    reports: dict[str, Any] = {}
    for i in range(args.runs):
        for name, path in files.items():
            out = tmp / f"{name}.json"
            out.unlink(missing_ok=True)
            cmd = report_cmd(path, out, "--jobs", str(args.jobs))
            r = run_child(cmd, cpus=args.cpus, stderr=subprocess.PIPE)
            runs[name].append(r)
            print(
                f"run {i + 1} {name:4s} maxrss {r.maxrss_mb:8.1f} MB  wall {r.wall_s:7.2f} s"
                f"  rc {r.returncode}",
                file=sys.stderr,
            )
            if out.exists():
                reports[name] = json.loads(out.read_text())
    if refuse_failed("bench_memory", runs):  # a failed run's figures are not the report's
        return 1
    med_rss = {k: median([r.maxrss_mb for r in v]) for k, v in runs.items()}
    med_wall = {k: median([r.wall_s for r in v]) for k, v in runs.items()}
    sizes = {}
    for name, path in files.items():
        truth_path = path.with_suffix(".truth.json")
        if truth_path.exists():
            sizes[name] = json.loads(truth_path.read_text())["generator"]["block_events"]
    result: dict[str, Any] = {
        "files": {k: str(v) for k, v in files.items()},
        "block_events": sizes,
        "runs": runs,
        "median_maxrss_mb": med_rss,
        "median_wall_s": med_wall,
        "ratio_10x_over_1x": med_rss["10x"] / med_rss["1x"],
        "jobs": args.jobs,
        "block_events_per_s": {k: sizes[k] / med_wall[k] for k in sizes if k in med_wall},
        "live_blocks_end": {k: v["totals"].get("live_blocks_end") for k, v in reports.items()},
    }
    for name, path in files.items():
        truth_path = path.with_suffix(".truth.json")
        if truth_path.exists() and name in reports:
            from bench_report import compare, wire_literal

            truth = json.loads(truth_path.read_text())
            literal = wire_literal(path, tmp)
            result.setdefault("checks", {})[f"report_incremental_vs_truth_{name}"] = (
                compare(literal, truth, "report", "truth") if literal else ["no report"]
            )
    save_result(args.name, result)
    for k in files:
        print(
            f"{k:4s} ({sizes.get(k, '?')} block events): median peak RSS {med_rss[k]:.1f} MB, "
            f"wall {med_wall[k]:.2f} s"
        )
    print(f"10x / 1x peak RSS = {result['ratio_10x_over_1x']:.2f}  (goal <= 1.2)")
    for k, rate in result["block_events_per_s"].items():
        print(f"{k:4s} throughput {rate / 1e6:.2f} M block events/s (--jobs {args.jobs})")
    for name, diffs in result.get("checks", {}).items():
        print(f"{name}: {'equal' if not diffs else f'{len(diffs)} differences'}")
        for d in diffs[:10]:
            print(f"  {d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
