"""A fleet's recordings: ``report`` of several ranks, one process vs a pool vs Ray, same report.

Builds (once, under ``bench/data/``) a fleet from one generated recording: ``--ranks`` copies
of its stream, each as another data-parallel rank (vLLM's port offset by the rank; receive
times shifted by a few microseconds per rank so the ranks interleave), written

- ``files``: one recording per rank (what a recorder per engine writes), and
- ``onefile``: all ranks in one recording (what one recorder subscribed to every rank writes).

Then times ``python -m kvtool report ... --format json -q`` as whole processes, interleaved,
``--runs`` times each: ``--jobs 1`` (one ordered pass), ``--jobs 2`` (the ranks are units
of work reported in two worker processes, partial reports merged) and, with ``--ray
ADDRESS``, the same units as Ray tasks (``local`` starts a Ray instance in the kvtool
process: its start-up is part of the time). Every report must equal the ``--jobs 1`` one.

    python3 bench/bench_fleet.py bench/data/big1.mcap --ranks 2 --runs 3 [--ray local]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import DATA, ROOT, kvtool_cmd, median, run_child, save_result

sys.path.insert(0, str(ROOT))

from kvtool.recording import RecordingWriter, open_recording

RANK_SHIFT_NS = 3_000


def build_fleet(src: Path, ranks: int) -> tuple[list[Path], Path]:
    """Write the fleet's recordings (once; reused when present)."""
    stem = f"{src.stem}-fleet{ranks}"
    files = [DATA / f"{stem}-rank{r}.mcap" for r in range(ranks)]
    one = DATA / f"{stem}-onefile.mcap"
    if all(p.exists() for p in files) and one.exists():
        return files, one
    with open_recording(src) as reader:
        groups = reader.groups
        msgs = [(m.channel.endpoint, m.seq, m.log_time, m.data) for m in reader.messages()]
    writers = [RecordingWriter(p) for p in files]
    together = RecordingWriter(one)
    try:
        own = [w.add_channel(f"tcp://127.0.0.1:{5557 + r}", "", r) for r, w in enumerate(writers)]
        shared = [together.add_channel(f"tcp://127.0.0.1:{5557 + r}", "", r) for r in range(ranks)]
        for _ep, seq, log_time, data in msgs:
            for r in range(ranks):
                t = log_time + r * RANK_SHIFT_NS
                writers[r].write(own[r], seq, data, log_time=t)
                together.write(shared[r], seq, data, log_time=t)
        if groups is not None:
            for w in [*writers, together]:
                w.add_groups(groups, "bench/bench_fleet.py")
    finally:
        for w in [*writers, together]:
            w.close()
    return files, one


def main() -> int:
    ap = argparse.ArgumentParser(description="report of a fleet: --jobs 1 vs 2 vs Ray")
    ap.add_argument("recording", nargs="?", default=str(ROOT / "bench/data/big1.mcap"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ray", default=None, metavar="ADDRESS")
    args = ap.parse_args()
    src = Path(args.recording)
    files, one = build_fleet(src, args.ranks)
    layouts = {"files": [str(p) for p in files], "onefile": [str(one)]}
    modes = ["j1", "j2"] + (["ray"] if args.ray else [])
    tmp = Path(tempfile.mkdtemp(prefix="kvfleet-"))
    runs: dict[str, list[Any]] = {}
    outputs: dict[str, Any] = {}
    for i in range(args.runs):
        for layout, paths in layouts.items():
            for mode in modes:
                name = f"{layout}-{mode}"
                out = tmp / f"{name}.json"
                out.unlink(missing_ok=True)
                cmd = [*kvtool_cmd(), "report", *paths, "--format", "json", "-q", "-o", str(out)]
                cmd += ["--ray", args.ray] if mode == "ray" else ["--jobs", mode[1:]]
                r = run_child(cmd, stderr=subprocess.PIPE)
                runs.setdefault(name, []).append(r)
                print(
                    f"run {i + 1} {name:12s} wall {r.wall_s:6.2f} s  cpu {r.cpu_s:6.2f} s  "
                    f"maxrss {r.maxrss_mb:6.1f} MB  rc {r.returncode}",
                    file=sys.stderr,
                )
                if out.exists():
                    outputs[name] = json.loads(out.read_text())
    med = {m: median([r.wall_s for r in rs]) for m, rs in runs.items()}
    cpu = {m: median([r.cpu_s for r in rs]) for m, rs in runs.items()}
    rss = {m: median([r.maxrss_mb for r in rs]) for m, rs in runs.items()}
    checks = {}
    block_events = None
    for layout in layouts:
        base = outputs.get(f"{layout}-j1")
        if base is not None and block_events is None:
            t = base["totals"]
            block_events = t["blocks_stored"] + t["blocks_removed"]
        for mode in modes[1:]:
            other = outputs.get(f"{layout}-{mode}")
            same = (
                base is not None
                and other is not None
                and {k: v for k, v in base.items() if k != "findings"}
                == {k: v for k, v in other.items() if k != "findings"}
                and sorted(base.get("findings", [])) == sorted(other.get("findings", []))
            )
            checks[f"{layout}-{mode}_vs_{layout}-j1"] = "identical" if same else "DIFFERENT"
    result = {
        "source_recording": str(src),
        "ranks": args.ranks,
        "block_events": block_events,
        "runs": runs,
        "median_wall_s": med,
        "median_cpu_s": cpu,
        "median_maxrss_mb": rss,
        "block_events_per_s": {m: block_events / w for m, w in med.items()} if block_events else {},
        "checks": checks,
    }
    save_result("fleet", result)
    print(f"\nblock events (all ranks): {block_events}")
    for m in med:
        rate = block_events / med[m] / 1e6 if block_events else float("nan")
        print(f"{m:12s} median wall {med[m]:6.2f} s  cpu {cpu[m]:6.2f} s  {rate:5.2f} M/s")
    for layout in layouts:
        for mode in modes[1:]:
            print(
                f"{layout}-{mode} / {layout}-j1 = "
                f"{med[f'{layout}-{mode}'] / med[f'{layout}-j1']:.2f}"
            )
    for k, v in checks.items():
        print(f"{k}: {v}")
    return 0 if all(v == "identical" for v in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
