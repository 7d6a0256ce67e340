"""Rerun vLLM 0.33's real KVCacheManager at N0 + K with the N0 run's schedule forced (issue 20).

A standalone diagnostic beside bench/vllm_driver.py (same venv, same workload; full and gemma3
shapes: the driver's Mamba chunk split is not applied), never imported by kvtool or its tests:

    /work/vllmcheck3/venv/bin/python bench/whatif_forced_rerun.py gemma3 11 60,150,300,600,1800 \
        [--closed-loop] [--log OUT.pkl]

It runs the workload at N0 and records each step's schedule (admissions with the tokens they
computed to, and the end position of every running request), then, per K, runs it twice at
N0 + K: free (the driver's own scheduler) and *forced* (the N0 schedule replayed: each request
admitted at the step it was admitted at N0, each step computing up to the same position; a longer
hit computes less). With ``--closed-loop`` a turn arrives after the previous one's finish, as in
the driver without ``--open-loop`` (the forced run keeps N0's finishes, so N0's arrivals too).
The forced run is what kvtool's what-if assumes ("same requests, same order"): where it matches
the free run, a what-if miss is a modelling error of the kernel, not scheduler dynamics. It
prints the restores after eviction (recomputes) per kind, counted from the
live BlockPool as the driver's truth.json does.

With ``--log`` it pickles every run's per-step log: ``("adm", rid, hit_tokens, end, num_tokens)``,
``("sch", rid, end)``, ``("fin", rid)``, and each ``take_events()`` event as
``("S", group, hashes, parent, rid)`` / ``("R", group, hashes, rid)`` with the request whose
``allocate_slots`` emitted it (None: outside one), for step-by-step comparison with the kernel.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_driver as drv  # needs vLLM: see its docstring
from vllm.distributed.kv_events import BlockRemoved, BlockStored


def run(
    shape: str, seed: int, num_blocks: int, sched: list | None = None, closed: bool = False
) -> dict:
    sp = drv.specs(shape)
    groups = [
        drv.KVCacheGroupSpec(layer_names=[f"layer{i}"], kv_cache_spec=s) for i, s in enumerate(sp)
    ]
    cfg = drv.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    mgr = drv.KVCacheManager(
        cfg,
        max_model_len=16384,
        scheduler_block_size=drv.BLOCK,
        hash_block_size=drv.HASH_BLOCK,
        max_in_flight_tokens=drv.TOKEN_BUDGET,
        enable_caching=True,
        enable_kv_cache_events=True,
    )
    hash_fn = drv.get_hash_fn_by_name("sha256")
    drv.init_none_hash(hash_fn)
    hasher = drv.get_request_block_hasher(drv.HASH_BLOCK, hash_fn)
    ledger = drv.Ledger(mgr.block_pool, len(sp))
    convs, evals = drv.workload(seed, shape)
    arrivals = drv.arrivals_of(convs, evals, open_loop=not closed)
    total = len(evals) + sum(len(c["turns"]) for c in convs)
    waiting: list = []
    running: list = []
    outs: dict[str, list[int]] = {}
    by_id: dict[str, object] = {}
    turns: dict[str, tuple | None] = {}
    log: list[list[tuple]] = []
    finished = step = 0

    def make(kind: str, payload) -> object:
        if kind == "eval":
            rid, prompt, outt = payload["id"], payload["prompt"], payload["out"]
        else:
            c, t, hist = payload
            prompt = list(c["system"]) + hist + c["turns"][t]["user"]
            rid, outt = f"c{c['id']}_t{t}", c["turns"][t]["out"]
        req = drv.Request(
            rid,
            prompt,
            drv.SamplingParams(max_tokens=len(outt)),
            None,
            arrival_time=float(step),
            block_hasher=hasher,
        )
        outs[rid] = outt
        turns[rid] = None if kind == "eval" else (payload[0], payload[1], prompt)
        by_id[rid] = req
        return req

    def drain(rows: list, rid: str | None) -> None:
        for ev in mgr.take_events():
            if isinstance(ev, BlockRemoved):
                rows.append(("R", ev.group_idx, list(ev.block_hashes), rid))
            elif isinstance(ev, BlockStored):
                rows.append(("S", ev.group_idx, list(ev.block_hashes), ev.parent_block_hash, rid))

    def admit(rows: list, req, n_target: int | None, budget: int) -> int | None:
        computed, n_hit, req.shared_prefix_boundary = mgr.get_computed_blocks(req)
        # Free: what the budget allows; forced: up to where the N0 run got (at least a token).
        n = min(req.num_tokens - n_hit, budget) if n_target is None else max(n_target - n_hit, 1)
        blocks = mgr.allocate_slots(req, n, n_hit, computed)
        drain(rows, req.request_id)
        if blocks is None:
            return None
        req.num_computed_tokens = n_hit
        running.append(req)
        rows.append(("adm", req.request_id, n_hit, n_hit + n, req.num_tokens))
        return n

    while finished < total:
        mgr.new_step_starts()
        rows: list[tuple] = []
        for kind, payload in arrivals.pop(step, []):
            waiting.append(make(kind, payload))
        scheduled: dict[str, int] = {}
        if sched is None:
            budget = drv.TOKEN_BUDGET
            for req in list(running):
                if budget <= 0:
                    break
                n = min(req.num_tokens - req.num_computed_tokens, budget)
                if n <= 0:
                    continue
                if mgr.allocate_slots(req, n) is None:
                    raise RuntimeError("preemption: the forced rerun needs a run without")
                drain(rows, req.request_id)
                scheduled[req.request_id] = n
                budget -= n
                rows.append(("sch", req.request_id, req.num_computed_tokens + n))
            while waiting and len(running) < drv.MAX_NUM_SEQS and budget > 0:
                n = admit(rows, waiting[0], None, budget)
                if n is None:
                    break
                scheduled[waiting.pop(0).request_id] = n
                budget -= n
        else:
            for ent in sched[step]:
                req = by_id[ent[1]]
                if ent[0] == "adm":
                    waiting.remove(req)
                    n = admit(rows, req, ent[3], 0)
                    if n is None:
                        raise RuntimeError(f"{ent[1]}: no room at the larger pool")
                    scheduled[req.request_id] = n
                    continue
                n = ent[2] - req.num_computed_tokens
                if n <= 0:
                    continue  # a longer hit got there already
                if mgr.allocate_slots(req, n) is None:
                    raise RuntimeError(f"{ent[1]}: no room at the larger pool")
                drain(rows, req.request_id)
                scheduled[req.request_id] = n
                rows.append(("sch", req.request_id, ent[2]))
        done = []
        for req in running:
            n = scheduled.get(req.request_id)
            if n is None:
                continue
            req.num_computed_tokens += n
            if req.num_computed_tokens >= req.num_tokens:
                outt = outs[req.request_id]
                if req.num_output_tokens < len(outt):
                    req.append_output_token_ids(outt[req.num_output_tokens])
                if req.num_output_tokens >= len(outt):
                    done.append(req)
        for req in done:
            running.remove(req)
            mgr.free(req)
            finished += 1
            rows.append(("fin", req.request_id))
            info = turns[req.request_id]
            if closed and info is not None and info[1] + 1 < len(info[0]["turns"]):
                c, t, prompt = info
                hist = prompt[len(c["system"]) :] + list(outs[req.request_id])
                arrivals[step + 1 + c["turns"][t]["gap"]].append(("turn", (c, t + 1, hist)))
        drain(rows, None)
        log.append(rows)
        step += 1
    kinds: dict[str, int] = defaultdict(int)
    for g, gm in enumerate(drv.group_metadata(mgr, cfg)):
        kinds[gm["kind"]] += ledger.c[g]["restores_after_eviction"]
    return {"num_blocks": num_blocks, "restores": dict(kinds), "log": log}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=["full", "gemma3"])
    ap.add_argument("seed", type=int)
    ap.add_argument("ks", help="K values, comma separated")
    ap.add_argument("--closed-loop", action="store_true", help="a turn arrives after the last")
    ap.add_argument("--log", type=Path, default=None, help="pickle every run's step log here")
    a = ap.parse_args()
    n0 = drv.N0[a.shape]
    base = run(a.shape, a.seed, n0, None, a.closed_loop)
    sched = [[e for e in rows if e[0] in ("adm", "sch")] for rows in base["log"]]
    print(f"N0={n0} restores {base['restores']}", flush=True)
    out: dict[object, object] = {"base": base}
    for k in (int(x) for x in a.ks.split(",")):
        free = run(a.shape, a.seed, n0 + k, None, a.closed_loop)
        forced = run(a.shape, a.seed, n0 + k, sched, a.closed_loop)
        print(f"+{k} free {free['restores']} forced {forced['restores']}", flush=True)
        out[k] = {"free": free, "forced": forced}
    if a.log:
        a.log.write_bytes(pickle.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
