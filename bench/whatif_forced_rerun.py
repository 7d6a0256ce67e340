"""Rerun vLLM 0.33's real KVCacheManager at N0 + K with the N0 run's schedule forced (issue 20).

A standalone diagnostic beside bench/vllm_driver.py (same venv, same workload, same scheduler:
token budget, max_num_seqs, preemption of the newest running request, Mamba chunks cut by vLLM's
own ``Scheduler._mamba_block_aligned_split``), never imported by kvtool or its tests:

    /tmp/h20b_vllm/venv/bin/python bench/whatif_forced_rerun.py SHAPE SEED Ks \
        [--closed-loop] [--by-order] [--keep-preempted] [--log OUT.pkl]

It runs the workload at N0 and records each step's schedule (admissions with the tokens they
computed to, the end position of every running request, preemptions, finishes), then, per K,
runs it twice at N0 + K: free (the driver's own scheduler: its counts equal the driver's
truth.json) and *forced* (the N0 schedule replayed: each request admitted, preempted and finished
at the step it was at N0, each step computing up to the same position; a longer hit computes
less). With ``--closed-loop`` a turn arrives after the previous one's finish, as in the driver
without ``--open-loop`` (the forced run keeps N0's finishes, so N0's arrivals too). The forced run
is what kvtool's what-if assumes ("same requests, same order"): where it matches the free run, a
what-if miss is a modelling error of the kernel, not scheduler dynamics. It prints the restores
after eviction (recomputes) per kind, counted from the live BlockPool as the driver's truth.json
does, and how many requests the forced run finished before they had all their output tokens
(``lagged``: a Mamba stop at the larger pool left them behind N0's positions).

For Mamba hybrids forcing N0's *positions* is not what the what-if assumes: vLLM cuts a Mamba
prefill at block boundaries counted from the hit, so a longer hit moves every chunk end (and the
state cached there), and N0's chunk ends forced on it store states no larger pool would (on
mamba_seed11_open +300 that run gives 180 Mamba recomputes, the free run 140, the prediction
144). ``--by-order`` forces N0's order instead: N0's admissions, preemptions and finishes at N0's
steps, each step N0's requests in N0's order, each chunk as the token budget and vLLM's Mamba
split allow (+0 still gives N0's counts exactly). ``--keep-preempted``: a request N0 preempted
keeps its blocks and idles until N0 resumed it (the kernel's view of a resumed request).

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

LAST_LOG: list = []  # the log of the last run(), kept when it raises


def run(
    shape: str,
    seed: int,
    num_blocks: int,
    sched: list | None = None,
    closed: bool = False,
    keep_preempted: bool = False,
    by_order: bool = False,
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
    LAST_LOG[:] = [log]
    finished = step = lagged = 0
    paused: set[str] = set()

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

    is_mamba = shape == "mamba"
    split_self = drv.mamba_split_self(mgr)

    def aligned(req, n_hit: int, n: int) -> int:
        if not is_mamba:
            return n
        return int(drv.Scheduler._mamba_block_aligned_split(split_self, req, n, n_hit))

    def admit(rows: list, req, n_target: int | None, budget: int) -> int | None:
        computed, n_hit, req.shared_prefix_boundary = mgr.get_computed_blocks(req)
        if n_target is None:  # free: what the budget allows
            n = aligned(req, n_hit, min(req.num_tokens - n_hit, budget))
        else:  # forced: up to where the N0 run got (at least a token; Mamba: a block)
            want = min(max(n_target - n_hit, drv.BLOCK if is_mamba else 1), req.num_tokens - n_hit)
            n = aligned(req, n_hit, want) or want
        if n <= 0:
            return None
        blocks = mgr.allocate_slots(req, n, n_hit, computed)
        drain(rows, req.request_id)
        if blocks is None:
            return None
        req.status = drv.RequestStatus.RUNNING
        req.num_computed_tokens = n_hit
        running.append(req)
        rows.append(("adm", req.request_id, n_hit, n_hit + n, req.num_tokens))
        return n

    def preempt(rows: list, req) -> None:
        # As the driver: free, back to the head of the queue, computed again from its hit.
        mgr.free(req)
        drain(rows, req.request_id)
        req.status = drv.RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        waiting.insert(0, req)
        rows.append(("pre", req.request_id))

    while finished < total:
        mgr.new_step_starts()
        rows: list[tuple] = []
        for kind, payload in arrivals.pop(step, []):
            waiting.append(make(kind, payload))
        scheduled: dict[str, int] = {}
        forcing = sched is not None and step < len(sched)
        if not forcing:
            # The driver's scheduler (bench/vllm_driver.py run()), step for step.
            budget = drv.TOKEN_BUDGET
            preempted_now = False
            i = 0
            while i < len(running) and budget > 0:
                req = running[i]
                n = aligned(req, 0, min(req.num_tokens - req.num_computed_tokens, budget))
                if n <= 0:
                    i += 1
                    continue
                while True:
                    blocks = mgr.allocate_slots(req, n)
                    if blocks is not None:
                        break
                    victim = running.pop()
                    preempt(rows, victim)
                    preempted_now = True
                    if victim is req:
                        break
                if blocks is None:
                    break
                drain(rows, req.request_id)
                scheduled[req.request_id] = n
                budget -= n
                i += 1
                rows.append(("sch", req.request_id, req.num_computed_tokens + n))
            while not preempted_now and waiting and len(running) < drv.MAX_NUM_SEQS and budget > 0:
                n = admit(rows, waiting[0], None, budget)
                if n is None:
                    break
                scheduled[waiting.pop(0).request_id] = n
                budget -= n
        else:
            budget = drv.TOKEN_BUDGET
            for ent in sched[step]:
                req = by_id[ent[1]]
                if ent[0] == "fin":
                    continue
                if ent[0] == "pre":
                    if keep_preempted:
                        paused.add(ent[1])  # still running, idle until N0 resumed it
                    elif req in running:
                        running.remove(req)
                        preempt(rows, req)
                    continue
                if ent[0] == "adm" and ent[1] in paused:
                    paused.discard(ent[1])
                    ent = ("sch", ent[1], ent[3])  # resumes where N0's resumption got
                if ent[0] == "adm":
                    waiting.remove(req)
                    n = admit(rows, req, None, max(budget, drv.BLOCK)) if by_order else None
                    n = n or admit(rows, req, ent[3], 0)
                    if n is None:
                        raise RuntimeError(f"{ent[1]}: no room at the larger pool")
                    scheduled[req.request_id] = n
                    budget -= n
                    continue
                if req not in running:
                    continue
                n = ent[2] - req.num_computed_tokens
                if by_order:  # N0's requests in N0's order, each as far as the budget allows
                    n = min(req.num_tokens - req.num_computed_tokens, budget)
                if n <= 0:
                    continue  # a longer hit got there already
                n = aligned(req, 0, n)
                if n <= 0:
                    continue
                if mgr.allocate_slots(req, n) is None:
                    raise RuntimeError(f"{ent[1]}: no room at the larger pool")
                drain(rows, req.request_id)
                scheduled[req.request_id] = n
                budget -= n
                rows.append(("sch", req.request_id, req.num_computed_tokens + n))
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
                if req.num_output_tokens >= len(outt) and not forcing:
                    done.append(req)
        if forcing:
            # N0's finishes, so closed-loop arrivals stay N0's; a request a Mamba stop at the
            # larger pool left behind (a shorter hit, chunk cut at another block boundary)
            # ends there all the same: counted as lagged.
            for ent in sched[step]:
                if ent[0] == "fin" and by_id[ent[1]] in running:
                    req = by_id[ent[1]]
                    lagged += req.num_output_tokens < len(outs[req.request_id])
                    done.append(req)
        for req in done:
            running.remove(req)
            mgr.free(req)
            req.status = drv.RequestStatus.FINISHED_LENGTH_CAPPED
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
    return {"num_blocks": num_blocks, "restores": dict(kinds), "lagged": lagged, "log": log}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(drv.N0))
    ap.add_argument("seed", type=int)
    ap.add_argument("ks", help="K values, comma separated")
    ap.add_argument("--closed-loop", action="store_true", help="a turn arrives after the last")
    ap.add_argument(
        "--keep-preempted",
        action="store_true",
        help="forced: a request N0 preempted keeps its blocks and idles until N0 resumed it",
    )
    ap.add_argument(
        "--by-order",
        action="store_true",
        help="forced: N0's admissions, preemptions and finishes, each step N0's requests in"
        " N0's order, but each chunk as the budget and vLLM's Mamba split allow",
    )
    ap.add_argument("--log", type=Path, default=None, help="pickle every run's step log here")
    a = ap.parse_args()
    n0 = drv.N0[a.shape]
    base = run(a.shape, a.seed, n0, None, a.closed_loop)
    sched = [[e for e in rows if e[0] in ("adm", "sch", "pre", "fin")] for rows in base["log"]]
    print(f"N0={n0} restores {base['restores']}", flush=True)
    out: dict[object, object] = {"base": base}
    for k in (int(x) for x in a.ks.split(",")):
        free = run(a.shape, a.seed, n0 + k, None, a.closed_loop)
        forced = run(a.shape, a.seed, n0 + k, sched, a.closed_loop, a.keep_preempted, a.by_order)
        print(
            f"+{k} free {free['restores']} forced {forced['restores']} (lagged {forced['lagged']})",
            flush=True,
        )
        out[k] = {"free": free, "forced": forced}
    if a.log:
        a.log.write_bytes(pickle.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
