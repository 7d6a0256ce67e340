"""Drive vLLM 0.33's real KVCacheManager on CPU: what-if material for new workloads (issues 20/21).

A standalone script, never imported by kvtool or its tests. It needs vLLM itself, in a venv of
its own OUTSIDE the repo (3 GB):

    python3 -m venv /work/vllmcheck/venv
    /work/vllmcheck/venv/bin/pip install torch==2.13.0          # the CPU build on disk
    /work/vllmcheck/venv/bin/pip install --no-deps vllm==0.33.0
    /work/vllmcheck/venv/bin/pip install packaging regex cachetools psutil numpy msgspec pyzmq \
        cloudpickle pyyaml tqdm blake3 py-cpuinfo pydantic 'transformers>=5.16.1,<5.21.0' \
        urllib3 cbor2 aiohttp requests openai_harmony openai pillow pybase64 uvloop \
        prometheus_client xgrammar fastapi partial_json_parser llguidance
        # (what `from vllm.v1.core.kv_cache_manager import KVCacheManager` asks for; check that
        #  torch stays 2.13.0+cpu)

    /work/vllmcheck/venv/bin/python bench/vllm_driver.py --shape full --seed 11 --out DIR

For one shape and seed it builds the workload (the "base" mix of /work/shared/whatif params.json:
system prompts shared across multi-turn conversations, two eval sets of shared-prefix prompts
asked several times), runs it through a minimal scheduler over vLLM's own ``KVCacheManager``
(``get_computed_blocks`` / ``allocate_slots`` with a token budget and max_num_seqs, chunked
prefill, Mamba chunks cut by vLLM's own ``Scheduler._mamba_block_aligned_split``, preempt the
newest running request when allocation fails, ``free`` on finish) at N0 and
N0 + 10/25/50/100/300 %, and writes:

- ``<shape>_seed<S>_N<N0>.frames``: each step's ``take_events()`` as a ``KVEventBatch`` encoded
  by msgspec's msgpack encoder, framed ``[topic "", seq 8-byte BE, payload]`` as
  ``ZmqEventPublisher`` sends it (``ts`` = 1767225600.0 + seq * 0.001);
- ``groups.json`` (``EngineCore.get_kv_cache_group_metadata()``'s format, from the manager);
- ``params.json`` and ``truth.json`` (``runs[]`` per pool size, counted from the live
  ``BlockPool`` through wrappers of its hash-map inserts, not from the events).

Recording the frames (``kvtool record`` of a replay by /work/shared/tools/replay_frames.py) is
done by the caller; see bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")

import msgspec
import torch
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

BLOCK = 16
HASH_BLOCK = 16
N0 = {"full": 200, "gemma3": 600, "mamba": 300}
SCALE = {"full": (1.0, 1.0), "gemma3": (0.3, 0.5), "mamba": (1.0, 1.0)}
K_FRACTIONS = [0.1, 0.25, 0.5, 1.0, 3.0]
MIX = {
    "n_systems": 6,
    "system_len": [96, 384],
    "conversations": 220,
    "turns": [1, 4],
    "user_len": [16, 128],
    "out_len": [8, 64],
    "turn_gap": [10, 120],
    "eval_sets": [[20, 4], [20, 4]],
    "eval_suffix": [32, 256],
    "eval_out": [4, 32],
    "horizon": 2400,
}
TOKEN_BUDGET = 512
MAX_NUM_SEQS = 8
VOCAB = 32000
TS0 = 1767225600.0


def specs(shape: str) -> list:
    def fa():
        return FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)

    def sw():
        return SlidingWindowSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=64
        )

    def mb():
        return MambaSpec(
            block_size=BLOCK, shapes=((4,),), dtypes=(torch.float16,), mamba_cache_mode="align"
        )

    if shape == "full":
        return [fa()]
    if shape == "gemma3":
        return [fa()] + [sw() for _ in range(5)]
    return [mb(), fa()]


# ---------------------------------------------------------------- workload
def arrivals_of(convs: list, evals: list, *, open_loop: bool) -> dict[int, list]:
    """The steps requests arrive at: step -> [(kind, payload)].

    Every eval item at its arrival. A conversation's first turn at its start; closed loop,
    the scheduler adds each next turn when the previous one finished. Open loop, every turn
    at a fixed step (start + sum of gaps + 40 per turn), whatever the pool size; the history
    holds the earlier turns' outputs all the same.
    """
    arrivals: dict[int, list] = defaultdict(list)
    for e in evals:
        arrivals[e["arrival"]].append(("eval", e))
    for c in convs:
        if not open_loop:
            arrivals[c["start"]].append(("turn", (c, 0, [])))
            continue
        at, hist = c["start"], []
        for t, turn in enumerate(c["turns"]):
            arrivals[at].append(("turn", (c, t, list(hist))))
            hist += turn["user"] + turn["out"]
            at += turn["gap"] + 40
    return arrivals


def workload(
    seed: int, shape: str, mix: dict | None = None, scale: tuple[float, float] | None = None
) -> tuple[list[dict], list[dict]]:
    """Conversations (lists of turns) and one-shot eval requests, all token content fixed.

    ``mix`` and ``scale`` (default: MIX and SCALE[shape]) let bench/vllm_semantics.py
    stretch the prompts for large attention blocks."""
    rng = random.Random(seed)
    scale, eval_scale = scale or SCALE[shape]
    m = mix or MIX

    def toks(n: int) -> list[int]:
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    systems = [toks(rng.randint(*m["system_len"])) for _ in range(m["n_systems"])]
    convs = []
    for c in range(round(m["conversations"] * scale)):
        sysp = systems[rng.randrange(len(systems))]
        turns = []
        for _ in range(rng.randint(*m["turns"])):
            turns.append(
                {
                    "user": toks(rng.randint(*m["user_len"])),
                    "out": toks(rng.randint(*m["out_len"])),
                    "gap": rng.randint(*m["turn_gap"]),
                }
            )
        convs.append(
            {"id": c, "system": sysp, "start": rng.randrange(m["horizon"]), "turns": turns}
        )
    evals = []
    for s, (n_items, repeats) in enumerate(m["eval_sets"]):
        prefix = toks(rng.randint(*m["system_len"]))
        start = rng.randrange(m["horizon"] // 2)
        for i in range(max(1, round(n_items * eval_scale))):
            suffix = toks(rng.randint(*m["eval_suffix"]))
            for r in range(repeats):
                evals.append(
                    {
                        "id": f"e{s}_{i}_{r}",
                        "prompt": prefix + suffix,
                        "out": toks(rng.randint(*m["eval_out"])),
                        "arrival": start + i * 3 + r * 40 + rng.randrange(5),
                    }
                )
    return convs, evals


# ---------------------------------------------------------------- truth wrappers
class Ledger:
    """Stores and evictions seen by the live BlockPool, per group."""

    def __init__(self, pool, n_groups: int) -> None:
        self.pool = pool
        self.ever: set = set()
        self.c = [defaultdict(int) for _ in range(n_groups)]
        ins = pool._insert_block_hash
        rem = pool._remove_cached_block_hashes

        def insert(key, block, num_tokens):
            if block.block_hash == key or pool.cached_block_hash_to_block.contain(
                key, block.block_id
            ):
                return ins(key, block, num_tokens)
            g = key_group(key)
            live = pool.cached_block_hash_to_block.get_one_block(key) is not None
            cnt = self.c[g]
            cnt["blocks_stored"] += 1
            if live:
                cnt["duplicates"] += 1
            elif key in self.ever:
                cnt["restores_after_eviction"] += 1
            else:
                cnt["first_stores"] += 1
            self.ever.add(key)
            return ins(key, block, num_tokens)

        def remove(block):
            out = rem(block)
            for key in out:
                self.c[key_group(key)]["entries_removed"] += 1
            return out

        pool._insert_block_hash = insert
        pool._remove_cached_block_hashes = remove


def key_group(key) -> int:
    from vllm.v1.core.kv_cache_utils import get_group_id

    return get_group_id(key)


# ---------------------------------------------------------------- scheduler
def run(
    shape: str, seed: int, num_blocks: int, frames_path: Path | None, open_loop: bool = False
) -> dict:
    sp = specs(shape)
    groups = [
        KVCacheGroupSpec(layer_names=[f"layer{i}"], kv_cache_spec=s) for i, s in enumerate(sp)
    ]
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    mgr = KVCacheManager(
        cfg,
        max_model_len=16384,
        scheduler_block_size=BLOCK,
        hash_block_size=HASH_BLOCK,
        max_in_flight_tokens=TOKEN_BUDGET,
        enable_caching=True,
        enable_kv_cache_events=True,
    )
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(HASH_BLOCK, hash_fn)
    ledger = Ledger(mgr.block_pool, len(sp))
    is_mamba = shape == "mamba"
    convs, evals = workload(seed, shape)

    arrivals = arrivals_of(convs, evals, open_loop=open_loop)  # step -> [(kind, payload)]

    waiting: list[Request] = []
    running: list[Request] = []
    meta: dict[str, tuple] = {}
    counters = defaultdict(int)
    hit_blocks = [0] * len(sp)
    enc = msgspec.msgpack.Encoder()
    out = bytearray()
    seq = 0
    total_req = len(evals) + sum(len(c["turns"]) for c in convs)
    finished = 0
    step = 0

    def make(kind, payload) -> Request:
        if kind == "eval":
            rid, prompt, outt = payload["id"], payload["prompt"], payload["out"]
            info = ("eval", None)
        else:
            c, t, hist = payload
            prompt = list(c["system"]) + hist + c["turns"][t]["user"]
            rid, outt = f"c{c['id']}_t{t}", c["turns"][t]["out"]
            info = ("turn", (c, t, prompt))
        req = Request(
            rid,
            prompt,
            SamplingParams(max_tokens=len(outt)),
            None,
            arrival_time=float(step),
            block_hasher=hasher,
        )
        meta[rid] = (info, outt)
        return req

    # Mamba chunks are cut by vLLM's own Scheduler._mamba_block_aligned_split (block-aligned
    # chunk ends, the last cacheable boundary, the shared-prefix junction).
    split_self = mamba_split_self(mgr)

    def aligned(req: Request, n_hit: int, n: int) -> int:
        if not is_mamba:
            return n
        return int(Scheduler._mamba_block_aligned_split(split_self, req, n, n_hit))

    def preempt(req: Request) -> None:
        mgr.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        counters["preemptions"] += 1
        waiting.insert(0, req)

    while finished < total_req:
        if step > 200000:
            raise RuntimeError("no progress")
        mgr.new_step_starts()
        for kind, payload in arrivals.pop(step, []):
            waiting.append(make(kind, payload))
        budget = TOKEN_BUDGET
        scheduled: dict[str, int] = {}
        preempted_now = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            n = aligned(req, 0, n)
            if n <= 0:
                i += 1
                continue
            while True:
                blocks = mgr.allocate_slots(req, n)
                if blocks is not None:
                    break
                victim = running.pop()
                preempt(victim)
                preempted_now = True
                if victim is req:
                    break
            if blocks is None:
                break
            scheduled[req.request_id] = n
            budget -= n
            i += 1
        if not preempted_now:
            while waiting and len(running) < MAX_NUM_SEQS and budget > 0:
                req = waiting[0]
                computed, n_hit, req.shared_prefix_boundary = mgr.get_computed_blocks(req)
                n = min(req.num_tokens - n_hit, budget)
                n = aligned(req, n_hit, n)
                if n <= 0:
                    break
                blocks = mgr.allocate_slots(req, n, n_hit, computed)
                if blocks is None:
                    break
                waiting.pop(0)
                counters["admissions"] += 1
                counters["prefix_hit_tokens"] += n_hit
                for g, blist in enumerate(computed.blocks):
                    hit_blocks[g] += sum(1 for b in blist if not b.is_null)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = n_hit
                running.append(req)
                scheduled[req.request_id] = n
                budget -= n
        # "execute" the step
        done = []
        for req in running:
            n = scheduled.get(req.request_id)
            if n is None:
                continue
            req.num_computed_tokens += n
            if req.num_computed_tokens >= req.num_tokens:
                info, outt = meta[req.request_id]
                k = req.num_output_tokens
                if k < len(outt):
                    req.append_output_token_ids(outt[k])
                if req.num_output_tokens >= len(outt):
                    done.append(req)
        for req in done:
            running.remove(req)
            mgr.free(req)
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            finished += 1
            info, outt = meta.pop(req.request_id)
            if info[0] == "turn" and not open_loop:
                c, t, prompt = info[1]
                if t + 1 < len(c["turns"]):
                    hist = prompt[len(c["system"]) :] + list(outt)
                    arrivals[step + 1 + c["turns"][t]["gap"]].append(("turn", (c, t + 1, hist)))
        events = mgr.take_events()
        if events:
            for ev in events:
                if isinstance(ev, BlockRemoved):
                    ledger.c[ev.group_idx]["blocks_removed"] += len(ev.block_hashes)
                    ledger.c[ev.group_idx]["remove_events"] += 1
                elif isinstance(ev, BlockStored):
                    ledger.c[ev.group_idx]["wire_blocks_stored"] += len(ev.block_hashes)
                    ledger.c[ev.group_idx]["store_events"] += 1
                else:
                    counters["all_blocks_cleared"] += 1
            counters["batches"] += 1
            if frames_path:
                payload = enc.encode(KVEventBatch(ts=TS0 + seq * 0.001, events=events))
                frames = [b"", seq.to_bytes(8, "big"), payload]
                out += struct.pack(">I", len(frames))
                for f in frames:
                    out += struct.pack(">I", len(f)) + f
            seq += 1
        step += 1
    if frames_path:
        frames_path.write_bytes(bytes(out))

    # live entries per group at the end: (key, block) pairs in the pool's map
    live = [0] * len(sp)
    for key, blocks in mgr.block_pool.cached_block_hash_to_block._cache.items():
        live[key_group(key)] += 1 if not isinstance(blocks, dict) else len(blocks)
    meta_groups = group_metadata(mgr, cfg)
    by_group = []
    for g, gm in enumerate(meta_groups):
        c = ledger.c[g]
        assert c["wire_blocks_stored"] == c["blocks_stored"], (g, dict(c))
        assert c["entries_removed"] == c["blocks_removed"], (g, dict(c))
        by_group.append(
            {
                "group_idx": g,
                "kind": gm["kind"],
                "sliding_window": gm["sliding_window"],
                "block_size": gm["block_size"],
                "store_events": c["store_events"],
                "blocks_stored": c["blocks_stored"],
                "first_stores": c["first_stores"],
                "restores_after_eviction": c["restores_after_eviction"],
                "duplicates": c["duplicates"],
                "remove_events": c["remove_events"],
                "blocks_removed": c["blocks_removed"],
                "live_blocks_end": live[g],
                "prefix_hit_blocks": hit_blocks[g],
            }
        )
    by_kind: dict[str, dict] = {}
    for row in by_group:
        k = by_kind.setdefault(
            row["kind"],
            {"kind": row["kind"], "sliding_window": row["sliding_window"], "groups": []},
        )
        k["groups"].append(row["group_idx"])
        for f, v in row.items():
            if f not in ("group_idx", "kind", "sliding_window", "block_size"):
                k[f] = k.get(f, 0) + v
    return {
        "num_blocks": num_blocks,
        "usable_blocks": num_blocks - 1,
        "requests": total_req,
        "finished": finished,
        "preemptions": counters["preemptions"],
        "steps": step,
        "batches": counters["batches"],
        "admissions": counters["admissions"],
        "prefix_hit_tokens": counters["prefix_hit_tokens"],
        "all_blocks_cleared": counters["all_blocks_cleared"],
        "by_group": by_group,
        "by_kind": list(by_kind.values()),
        "_groups": meta_groups,
        "_coordinator": type(mgr.coordinator).__name__,
    }


def mamba_split_self(mgr: KVCacheManager) -> SimpleNamespace:
    """The scheduler attributes ``Scheduler._mamba_block_aligned_split`` reads, for ``mgr``."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=BLOCK),
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        block_size=BLOCK,
        hash_block_size=HASH_BLOCK,
        max_num_scheduled_tokens=TOKEN_BUDGET,
        use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None,
        mamba_partial_cache_hit=HASH_BLOCK < BLOCK and mgr.coordinator.enable_partial_hash_hits,
        mamba_shared_prefix_checkpoint=False,
    )


def group_metadata(mgr: KVCacheManager, cfg: KVCacheConfig) -> list[dict]:
    """What EngineCore.get_kv_cache_group_metadata() returns for this manager."""
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

    out = []
    for g, (group, manager) in enumerate(
        zip(cfg.kv_cache_groups, mgr.coordinator.single_type_managers, strict=True)
    ):
        spec = group.kv_cache_spec
        out.append(
            {
                "group_idx": g,
                "kind": get_kv_cache_spec_kind(spec).value,
                "block_size": manager.block_size,
                "sliding_window": getattr(spec, "sliding_window", None),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(N0), required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n0", type=int, default=None)
    ap.add_argument(
        "--open-loop", action="store_true", help="turn arrivals fixed, not after the last"
    )
    a = ap.parse_args()
    n0 = a.n0 or N0[a.shape]
    a.out.mkdir(parents=True, exist_ok=True)
    sizes = [n0] + [n0 + round(n0 * f) for f in K_FRACTIONS]
    runs = []
    frames = a.out / f"{a.shape}_seed{a.seed}_N{n0}.frames"
    for n in sizes:
        r = run(a.shape, a.seed, n, frames if n == n0 else None, a.open_loop)
        r["K_blocks"] = n - n0
        r["K_fraction"] = (n - n0) / n0
        runs.append(r)
        rk = {k["kind"]: k["restores_after_eviction"] for k in r["by_kind"]}
        print(f"N={n} preempt={r['preemptions']} batches={r['batches']} restores={rk}", flush=True)
    groups = runs[0].pop("_groups")
    coord = runs[0].pop("_coordinator")
    for r in runs[1:]:
        r.pop("_groups")
        r.pop("_coordinator")
    (a.out / "groups.json").write_text(json.dumps(groups, indent=1) + "\n")
    params = {
        "shape": a.shape,
        "seed": a.seed,
        "N0": n0,
        "N0_means": "KVCacheConfig.num_blocks (BlockPool(num_gpu_blocks)); block 0 is vLLM's "
        "null block, so N0-1 blocks are usable",
        "K_fractions": K_FRACTIONS,
        "sizes": sizes,
        "K_blocks": [s - n0 for s in sizes[1:]],
        "workload": {
            "mix": "base",
            "mix_params": MIX,
            "scale": SCALE[a.shape][0],
            "eval_scale": SCALE[a.shape][1],
            "token_budget": TOKEN_BUDGET,
            "max_num_seqs": MAX_NUM_SEQS,
            "block_size": BLOCK,
            "hash_block_size": HASH_BLOCK,
        },
        "turn_arrivals": "fixed (open loop)" if a.open_loop else "previous turn's finish + gap",
        "vllm": "0.33.0 (KVCacheManager on CPU, bench/vllm_driver.py)",
    }
    (a.out / "params.json").write_text(json.dumps(params, indent=1) + "\n")
    truth = {
        "shape": a.shape,
        "seed": a.seed,
        "N0": n0,
        "group_metadata": groups,
        "coordinator": coord,
        "pools": 1,
        "runs": runs,
        "frames": {
            "file": frames.name,
            "messages": runs[0]["batches"],
            "bytes": frames.stat().st_size,
            "ts": "fixed: 1767225600.0 + seq * 0.001",
            "topic": "",
            "seq_first": 0,
        },
    }
    (a.out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
