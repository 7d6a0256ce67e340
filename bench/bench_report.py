"""Report throughput: ``kvtool report --format json`` against the decode floor and a hand loop.

Each of the three is run ``--runs`` times as its own process (same conditions: a fresh
interpreter, imports included), interleaved, and the medians compared:

- physical: the physical floor, read the file and decompress every chunk (no decoding);
- floor: read every payload with ``kvtool.recording.open_recording`` and decode it once
  with a minimal typed msgspec decoder (only the fields a report needs: hashes, token
  ids, group, kind, window), nothing else;
- hand: a straightforward Python loop computing the report's numbers (decode each batch
  into kvtool's structs with ``decode_batch``; dict updates per event and per hash for
  the multiset live state; FIFO lifetimes; peaks per group/kind/window/total);
- hand-user: ``bench/hand_report.py`` (the loop issue 10 measured against: the ``mcap``
  reader, full vLLM structs, per-hash dict updates, FIFO lifetimes, peaks; kept as a
  user would write it, unoptimised and unpessimised);
- report: ``python -m kvtool report FILE --format json -q`` (``--jobs`` as the CLI defaults);
- report-jN (``--jobs 1,2``): the same with ``--jobs N``;
- report-ray (``--ray ADDRESS``): the same with ``--ray ADDRESS`` (``local`` starts a
  Ray instance inside the kvtool process: its start-up is part of the time);
- ``--imports``: the import cost, ``python -c pass`` (python) against
  ``python -c "import kvtool.cli, typer.main, kvtool.commands.report, kvtool.report.api"``
  (import-report: what ``kvtool report`` imports before it reads a byte);
- ``--cold N``: N cold runs (report-cold: the report with an empty ``NUMBA_CACHE_DIR`` of
  its own, so every kernel compiles), each followed by a warm run (report-warm: the same
  cache, now filled); stderr is a pseudo-terminal, and the lines it shows are kept (a cold
  run says once that it is compiling).

The report's counts are checked against the hand loop's and against the generator's
truth file. Goals (issue 5): report <= 3x floor, <= 0.3x hand, >= 2 M block events/s.

    python3 bench/bench_report.py bench/data/big1.mcap --runs 5 [--cpus 1] \
        [--jobs 1,2] [--ray local] [--no-hand] [--imports] [--cold 2]

Peak RSS is that of the measured process (for ``--jobs`` > 1 and Ray: the driver only).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
from _common import ROOT, median, refuse_failed, report_cmd, run_child, run_child_tty, save_result

COUNT_COLUMNS = (
    "store_events",
    "blocks_stored",
    "tokens_stored",
    "remove_events",
    "blocks_removed",
    "blocks_cleared",
    "live_blocks_end",
    "peak_live_blocks",
    "distinct_hashes",
    "restored_blocks",
    "orphan_removes",
)


# --- floor: the cheapest decode that still looks at every field a report needs -----------


class _FStored(msgspec.Struct, tag="BlockStored", tag_field="type"):
    block_hashes: list[int | bytes] = []
    token_ids: list[int | list[int]] = []
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _FRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type"):
    block_hashes: list[int | bytes] = []
    group_idx: int | None = None


class _FCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


class _FStoredA(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[int | bytes] = []
    parent_block_hash: int | bytes | None = None
    token_ids: list[int | list[int]] = []
    block_size: int | None = None
    lora_id: int | None = None
    medium: str | None = None
    lora_name: object = None
    extra_keys: object = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _FRemovedA(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[int | bytes] = []
    medium: str | None = None
    group_idx: int | None = None


class _FClearedA(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


class _FBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_FStored | _FRemoved | _FCleared]
    data_parallel_rank: int | None = None


class _FBatchA(msgspec.Struct, array_like=True):
    ts: float
    events: list[_FStoredA | _FRemovedA | _FClearedA]
    data_parallel_rank: int | None = None


def floor(path: str) -> dict[str, Any]:
    from kvtool.recording import open_recording

    dec_map = msgspec.msgpack.Decoder(_FBatch)
    dec_arr = msgspec.msgpack.Decoder(_FBatchA)
    dec = dec_map
    batches = events = 0
    with open_recording(path) as rec:
        for m in rec.messages():
            try:
                b = dec.decode(m.data)
            except msgspec.ValidationError:
                dec = dec_arr if dec is dec_map else dec_map
                b = dec.decode(m.data)
            batches += 1
            events += len(b.events)
    return {"batches": batches, "events": events}


def physical(path: str) -> dict[str, Any]:
    """The physical floor: read the file and decompress every chunk, nothing else."""
    import zstandard
    from mcap.records import Chunk
    from mcap.stream_reader import StreamReader

    unzstd = zstandard.ZstdDecompressor()
    chunks = size = 0
    with open(path, "rb") as f:
        for record in StreamReader(f, emit_chunks=True, validate_crcs=False).records:
            if isinstance(record, Chunk):
                data = (
                    unzstd.decompress(record.data, max_output_size=record.uncompressed_size)
                    if record.compression == "zstd"
                    else record.data
                )
                chunks += 1
                size += len(data)
    return {"chunks": chunks, "bytes": size}


# --- hand loop -----------------------------------------------------------------------------


def _pct(sorted_xs: list[float], q: float) -> float | None:
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def hand(path: str) -> dict[str, Any]:
    from kvtool.protocol import AllBlocksCleared, BlockStored, decode_batch
    from kvtool.recording import open_recording

    with open_recording(path) as rec:
        meta = {
            int(g["group_idx"]): (g["kind"], g.get("sliding_window"))  # type: ignore[call-overload]
            for g in (rec.groups or [])
        }
        rows: dict[int, dict[str, int]] = {}
        live: dict[tuple[int, Any], int] = {}
        stores: dict[tuple[int, Any], deque[float]] = {}
        live_g: dict[int, int] = {}
        peak_g: dict[int, int] = {}
        live_k: dict[Any, int] = {}
        peak_k: dict[Any, int] = {}
        live_w: dict[Any, int] = {}
        peak_w: dict[Any, int] = {}
        total = [0, 0]
        distinct: dict[int, set[Any]] = {}
        lifetimes: dict[int, list[float]] = {}
        learned: dict[int, tuple[str | None, int | None]] = {}

        def kw(g: int) -> tuple[Any, Any]:
            if g in meta:
                return meta[g]
            return learned.get(g, ("unannotated", None))

        def row(g: int) -> dict[str, int]:
            r = rows.get(g)
            if r is None:
                r = rows[g] = dict.fromkeys(COUNT_COLUMNS, 0)
                distinct[g] = set()
                lifetimes[g] = []
                live_g[g] = peak_g[g] = 0
            return r

        def bump(g: int, d: int) -> None:
            k, w = kw(g)
            live_g[g] += d
            live_k[k] = live_k.get(k, 0) + d
            live_w[w] = live_w.get(w, 0) + d
            total[0] += d
            if d > 0:
                if live_g[g] > peak_g[g]:
                    peak_g[g] = live_g[g]
                if live_k[k] > peak_k.get(k, 0):
                    peak_k[k] = live_k[k]
                if live_w[w] > peak_w.get(w, 0):
                    peak_w[w] = live_w[w]
                if total[0] > total[1]:
                    total[1] = total[0]

        for m in rec.messages():
            batch = decode_batch(m.data, seq=m.seq)
            ts = batch.ts
            for ev in batch.events:
                if isinstance(ev, BlockStored):
                    g = ev.group_idx if ev.group_idx is not None else -1
                    if g not in meta and ev.kv_cache_spec_kind is not None:
                        learned[g] = (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window)
                    r = row(g)
                    r["store_events"] += 1
                    r["blocks_stored"] += len(ev.block_hashes)
                    r["tokens_stored"] += len(ev.token_ids)
                    dset = distinct[g]
                    for h in ev.block_hashes:
                        key = (g, h)
                        n = live.get(key, 0)
                        if n:
                            r["restored_blocks"] += 1
                            stores[key].append(ts)
                        else:
                            stores[key] = deque((ts,))
                        live[key] = n + 1
                        dset.add(h)
                        bump(g, 1)
                elif isinstance(ev, AllBlocksCleared):
                    for g, n in live_g.items():
                        rows[g]["blocks_cleared"] += n
                        bump(g, -n)
                    live.clear()
                    stores.clear()
                else:
                    g = ev.group_idx if ev.group_idx is not None else -1
                    r = row(g)
                    r["remove_events"] += 1
                    r["blocks_removed"] += len(ev.block_hashes)
                    lts = lifetimes[g]
                    for h in ev.block_hashes:
                        key = (g, h)
                        n = live.get(key, 0)
                        if n == 0:
                            r["orphan_removes"] += 1
                            continue
                        if n == 1:
                            del live[key]
                        else:
                            live[key] = n - 1
                        lts.append(ts - stores[key].popleft())
                        bump(g, -1)

    def agg(groups: list[int], peak: int) -> dict[str, Any]:
        out: dict[str, Any] = {c: sum(rows[g][c] for g in groups) for c in COUNT_COLUMNS}
        out["live_blocks_end"] = sum(live_g[g] for g in groups)
        out["peak_live_blocks"] = peak
        out["distinct_hashes"] = len(set().union(*(distinct[g] for g in groups)))
        lts = sorted(x for g in groups for x in lifetimes[g])
        for q in (50, 90, 99):
            out[f"lifetime_p{q}_s"] = _pct(lts, q / 100)
        return out

    by_group = [{"group_idx": g, **agg([g], peak_g[g])} for g in sorted(rows)]
    kinds = sorted({kw(g)[0] for g in rows}, key=str)
    wins = sorted({kw(g)[1] for g in rows}, key=lambda w: (w is not None, w or 0))
    by_kind = [
        {"kind": k, **agg([g for g in rows if kw(g)[0] == k], peak_k.get(k, 0))} for k in kinds
    ]
    by_window = [
        {"sliding_window": w, **agg([g for g in rows if kw(g)[1] == w], peak_w.get(w, 0))}
        for w in wins
    ]
    return {
        "totals": agg(list(rows), total[1]),
        "by_kind": by_kind,
        "by_window": by_window,
        "by_group": by_group,
    }


# --- comparison ----------------------------------------------------------------------------


def compare(
    a: dict[str, Any],
    b: dict[str, Any],
    a_name: str,
    b_name: str,
    columns: tuple[str, ...] = COUNT_COLUMNS,
) -> list[str]:
    """Differences between two report dicts in the count columns (and lifetimes, 1 %)."""
    diffs: list[str] = []

    def cmp(where: str, ra: dict[str, Any], rb: dict[str, Any]) -> None:
        for c in columns:
            if c in ra and c in rb and ra[c] != rb[c]:
                diffs.append(f"{where}.{c}: {a_name}={ra[c]} {b_name}={rb[c]}")
        for c in ("lifetime_p50_s", "lifetime_p90_s", "lifetime_p99_s"):
            va, vb = ra.get(c), rb.get(c)
            if not (isinstance(va, float) and isinstance(vb, float)):
                continue
            lo, hi = ra.get(f"{c}_bound_low"), ra.get(f"{c}_bound_high")
            if isinstance(lo, float) and isinstance(hi, float):
                # a's lifetimes pair evictions by vLLM's rule (R8) where b's are FIFO: b's
                # quantile must lie in a's bound (the oldest-first and newest-first rules).
                if not lo * 0.99 - 1e-3 <= vb <= hi * 1.01 + 1e-3:
                    diffs.append(
                        f"{where}.{c}: {b_name}={vb:.4f} outside {a_name}'s bound "
                        f"[{lo:.4f}, {hi:.4f}]"
                    )
            elif not math.isclose(va, vb, rel_tol=0.01, abs_tol=1e-3):
                diffs.append(f"{where}.{c}: {a_name}={va:.4f} {b_name}={vb:.4f}")

    cmp("totals", a["totals"], b["totals"])
    for table, key in (
        ("by_kind", "kind"),
        ("by_window", "sliding_window"),
        ("by_group", "group_idx"),
    ):
        ia = {r[key]: r for r in a.get(table, [])}
        ib = {r[key]: r for r in b.get(table, [])}
        for k in sorted(set(ia) | set(ib), key=str):
            if k not in ia or k not in ib:
                diffs.append(f"{table}[{k}]: only in {a_name if k in ia else b_name}")
                continue
            cmp(f"{table}[{k}]", ia[k], ib[k])
    return diffs


def wire_literal(rec: Path, tmp: Path) -> dict[str, Any] | None:
    """``kvtool report REC --report-mode incremental`` (one untimed run), for the checks.

    gen.py re-announces prefix-cache hits as stores and its truth (like the hand loops)
    counts every store on the wire. By default (``--report-mode auto``) kvtool reads the
    stores it finds to be hit announcements as hits, not stores (issue 21): blocks_stored,
    live, peak, cleared and restored differ from the truth by those announcements. With
    ``--report-mode incremental`` every store is a store, which is what the truth counts.
    Lifetimes: kvtool pairs an eviction with the copy vLLM evicts (R8), the hand loops with
    the oldest (FIFO); ``--lifetime-bounds`` gives the bound the FIFO quantiles must lie in.
    """
    out = tmp / "wire-literal.json"
    out.unlink(missing_ok=True)
    cmd = report_cmd(rec, out, "--report-mode", "incremental", "--lifetime-bounds")
    subprocess.run(cmd, check=False, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text()) if out.exists() else None


def _child(mode: str, path: str, out: str) -> None:
    res = {"floor": floor, "physical": physical, "hand": hand}[mode](path)
    Path(out).write_text(json.dumps(res))


# What `kvtool report` imports before it reads a byte (the console script, the command,
# the report library: numba, polars, numpy, msgspec).
IMPORT_REPORT = "import kvtool.cli, typer.main, kvtool.commands.report, kvtool.report.api"


def _cold_runs(rec: Path, n: int, tmp: Path) -> dict[str, Any]:
    """N cold reports (each with an empty JIT cache of its own), each followed by a warm one."""
    out: dict[str, Any] = {"report-cold": [], "report-warm": [], "stderr_lines": []}
    for i in range(n):
        cache = Path(tempfile.mkdtemp(prefix="kvbench-jit-"))
        env = {"NUMBA_CACHE_DIR": str(cache)}
        cmd = report_cmd(rec, tmp / "cold.json", "--force")
        for kind in ("report-cold", "report-warm"):
            r, err = run_child_tty(cmd, env=env)
            out[kind].append(r)
            if kind == "report-cold":
                out["stderr_lines"].append(err.splitlines())
            print(
                f"cold {i + 1} {kind} wall {r.wall_s:7.2f} s  cpu {r.cpu_s:7.2f} s  "
                f"maxrss {r.maxrss_mb:7.1f} MB  rc {r.returncode}",
                file=sys.stderr,
            )
        subprocess.run(["rm", "-rf", str(cache)], check=False)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description="report throughput vs floor and hand loop")
    ap.add_argument("recording", nargs="?", default=str(ROOT / "bench/data/big1.mcap"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cpus", default=None, help="taskset CPU list, e.g. 1 (one core)")
    ap.add_argument("--no-hand", action="store_true", help="skip the (slow) hand loops")
    ap.add_argument(
        "--jobs", default=None, help="comma list of --jobs values to time as report-jN (e.g. 1,2)"
    )
    ap.add_argument(
        "--ray", default=None, metavar="ADDRESS", help="also time report --ray ADDRESS (e.g. local)"
    )
    ap.add_argument(
        "--imports",
        action="store_true",
        help="also time python -c pass against the report's imports",
    )
    ap.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="N",
        help="also N cold runs (empty NUMBA_CACHE_DIR), each with a warm run after",
    )
    ap.add_argument("--child", nargs=3, metavar=("MODE", "PATH", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return 0
    rec = Path(args.recording)
    truth_path = rec.with_suffix(".truth.json")
    truth = json.loads(truth_path.read_text()) if truth_path.exists() else None
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-"))
    jobs = [int(j) for j in args.jobs.split(",")] if args.jobs else []
    modes = (
        ["physical", "floor", "report"]
        + [f"report-j{j}" for j in jobs]
        + (["report-ray"] if args.ray else [])
        + ([] if args.no_hand else ["hand", "hand-user"])
        + (["python", "import-report"] if args.imports else [])
    )
    runs: dict[str, list[Any]] = {m: [] for m in modes}
    outputs: dict[str, Any] = {}
    for i in range(args.runs):
        for mode in modes:
            out = tmp / f"{mode}.json"
            if mode.startswith("report"):
                cmd = report_cmd(rec, out)
                if mode.startswith("report-j"):
                    cmd += ["--jobs", mode.removeprefix("report-j")]
                elif mode == "report-ray":
                    cmd += ["--ray", args.ray]
                if out.exists():
                    out.unlink()
            elif mode == "hand-user":
                cmd = [sys.executable, str(Path(__file__).with_name("hand_report.py")), str(rec)]
            elif mode == "python":
                cmd = [sys.executable, "-c", "pass"]
            elif mode == "import-report":
                cmd = [sys.executable, "-c", IMPORT_REPORT]
            else:
                cmd = [sys.executable, __file__, "--child", mode, str(rec), str(out)]
            if mode == "hand-user":
                with out.open("w") as sink:
                    r = run_child(cmd, cpus=args.cpus, stdout=sink, stderr=subprocess.PIPE)
            else:
                r = run_child(cmd, cpus=args.cpus, stderr=subprocess.PIPE)
            if r.returncode not in (0,):
                print(f"{mode}: exit status {r.returncode}", file=sys.stderr)
            runs[mode].append(r)
            print(
                f"run {i + 1} {mode:6s} wall {r.wall_s:7.2f} s  cpu {r.cpu_s:7.2f} s  "
                f"maxrss {r.maxrss_mb:7.1f} MB  rc {r.returncode}",
                file=sys.stderr,
            )
            if out.exists():
                outputs[mode] = json.loads(out.read_text())
    if refuse_failed("bench_report", runs):  # a failed run's figures are not the report's
        return 1
    cold = _cold_runs(rec, args.cold, tmp) if args.cold else None
    med = {m: median([r.wall_s for r in runs[m]]) for m in modes}
    block_events = (truth or {}).get("generator", {}).get("block_events")
    if block_events is None and "report" in outputs:
        t = outputs["report"]["totals"]
        block_events = t["blocks_stored"] + t["blocks_removed"]
    result: dict[str, Any] = {
        "recording": str(rec),
        "recording_bytes": rec.stat().st_size,
        "block_events": block_events,
        "runs": {m: runs[m] for m in modes},
        "median_wall_s": med,
        "ratio_report_over_floor": med["report"] / med["floor"],
        "ratio_report_over_physical": med["report"] / med["physical"],
        "report_block_events_per_s": block_events / med["report"] if block_events else None,
        "floor_block_events_per_s": block_events / med["floor"] if block_events else None,
    }
    if "hand" in med:
        result["ratio_report_over_hand"] = med["report"] / med["hand"]
    if args.imports:
        result["median_cpu_s"] = {m: median([r.cpu_s for r in runs[m]]) for m in modes}
        result["import_report_cpu_s"] = (
            result["median_cpu_s"]["import-report"] - result["median_cpu_s"]["python"]
        )
    if cold is not None:
        result["cold"] = cold
    if "hand-user" in med:
        result["ratio_report_over_hand_user"] = med["report"] / med["hand-user"]
    for m in modes:
        if m.startswith("report-") and block_events:
            result[f"{m}_block_events_per_s"] = block_events / med[m]
    reports = {m: outputs[m] for m in modes if m.startswith("report") and m in outputs}
    checks: dict[str, list[str]] = {}
    rep = outputs.get("report")
    literal = wire_literal(rec, tmp) if "hand" in outputs or truth is not None else None
    if literal is not None and "hand" in outputs:
        checks["report_incremental_vs_hand"] = compare(literal, outputs["hand"], "report", "hand")
    if literal is not None and truth is not None:
        checks["report_incremental_vs_truth"] = compare(literal, truth, "report", "truth")
    if rep is not None:
        result["hit_announced_blocks"] = rep["totals"].get("hit_announced_blocks")
    for m, other in reports.items():
        if m != "report" and rep is not None:
            # Every --jobs value and Ray must give the very same report.
            same = {k: v for k, v in other.items() if k != "source"} == {
                k: v for k, v in rep.items() if k != "source"
            }
            checks[f"{m}_vs_report"] = [] if same else [f"{m} differs from report"]
    if "hand" in outputs and truth is not None:
        checks["hand_vs_truth"] = compare(outputs["hand"], truth, "hand", "truth")
    result["checks"] = checks
    save_result("report", result)
    print(f"\nblock events: {block_events}")
    for m in modes:
        print(f"{m:7s} median wall {med[m]:.2f} s")
    print(f"report / floor = {result['ratio_report_over_floor']:.2f}")
    print(f"report / physical floor = {result['ratio_report_over_physical']:.2f}  (goal <= 10)")
    if "hand" in med:
        print(f"report / hand (bench loop)    = {result['ratio_report_over_hand']:.2f}")
    if "hand-user" in med:
        print(
            f"report / hand (hand_report.py) = {result['ratio_report_over_hand_user']:.2f}"
            "  (goal <= 0.3)"
        )
    for m in modes:
        if m.startswith("report-"):
            print(f"{m} / report = {med[m] / med['report']:.2f}")
    if args.imports:
        cpu = result["median_cpu_s"]
        print(
            f"imports of the report path: {result['import_report_cpu_s']:.2f} s CPU "
            f"(import-report {cpu['import-report']:.2f} s, python -c pass {cpu['python']:.2f} s)"
            f"; report {cpu['report']:.2f} s CPU in all"
        )
    if cold is not None:
        for kind, goal in (("report-cold", "  (goal <= 10 s)"), ("report-warm", "")):
            rs = cold[kind]
            print(
                f"{kind}: median wall {median([r.wall_s for r in rs]):.2f} s, "
                f"CPU {median([r.cpu_s for r in rs]):.2f} s{goal}"
            )
        print(f"cold runs' stderr lines: {cold['stderr_lines']}")
    if block_events:
        print(
            f"report: {result['report_block_events_per_s'] / 1e6:.2f} M block events/s "
            f"(goal: >= 5 on the 10x recording, bench_memory.py)"
        )
    for name, diffs in checks.items():
        print(f"{name}: {'equal' if not diffs else f'{len(diffs)} differences'}")
        for d in diffs[:20]:
            print(f"  {d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
