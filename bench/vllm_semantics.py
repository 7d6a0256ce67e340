"""Issue 21 semantics scenarios on vLLM 0.33's real KVCacheManager, with the physical truth.

A sibling of bench/vllm_driver.py (same venv, same workload generator and scheduler rules;
see its docstring for how to build /work/vllmcheck/venv), for what that driver does not
vary: a group block size larger than the hash block size (``prefix_match_unit``), Mamba
hybrids at a large attention block (partial hash hits, prefill checkpoints), and a share of
requests in ``kv_cache_report_mode="full"`` (``SamplingParams.extra_args``; vLLM then
announces each lookup's hit with ``emit_cached_block_events``).

    /work/vllmcheck/venv/bin/python bench/vllm_semantics.py --scenario NAME --out DIR

writes ``DIR/NAME.frames`` (each step's ``take_events()`` as vLLM's ZmqEventPublisher sends
it, ``ts`` = 1767225600.0 + seq * 0.001), ``DIR/groups.json``, ``DIR/truth.json`` and
``DIR/origin.json`` (per batch seq, the places of the events ``emit_cached_block_events``
made: the ``origin="REUSED"`` ones of vllm-project/vllm#51699). The
truth is taken from the live ``BlockPool`` by wrapping its methods (the cause of each hash
insert and remove is the pool method it happens in), never from the events:

- ``stores``: ``physical_blocks_newly_cached`` (a block without a hash got one, not a re-key
  of the same block nor a copy-on-write move), split by the key's history (``new_key``,
  ``second_copy``: key live in another block, ``recompute``: stored before, not live);
  ``extra_hash_keys_on_already_cached_block``; ``same_block_rekeyed_after_promotion_or_replace``;
  ``hit_reannouncements_report_mode_full`` (blocks announced), of which
  ``..._for_admissions_that_then_failed``; ``tokens_stored_real`` / ``tokens_stored_announce``.
- ``removes``: ``physical_evictions`` (keys) and ``physical_blocks_evicted`` (blocks) in
  ``get_new_blocks``; ``physical_blocks_discarded`` (``_maybe_evict_cached_block`` outside
  it: a Mamba checkpoint dropped); promotions (``cache_full_blocks`` / ``cache_partial_block``
  on a hashed block); ``replace_existing_hashes_not_eviction``.
- ``reset``: entries and physical blocks dropped by ``reset_prefix_cache``.
- ``end``: ``cached_entries_end``, ``cached_hash_keys_end``, ``physical_cached_blocks_end``;
  ``peak``: ``peak_physical_cached_blocks`` (per group, and per kind in ``by_kind``).
- ``hits``: per group, blocks and tokens of the looked-up hits of requests then admitted
  (every request, and those in report mode full: the announced length, null positions of a
  sliding window included); a lookup repeated after a failed allocation counts once.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import msgspec
import torch
import vllm_driver as vd
from vllm.distributed.kv_events import KVEventBatch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_group_id, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

LONG = dict(vd.MIX, system_len=[400, 1400], user_len=[32, 400], eval_suffix=[64, 700])


def _fa(bs: int, head: int = 8) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=head, dtype=torch.float16)


def _sw(bs: int, w: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=w
    )


def _mb(bs: int, ckpt: int = 0, align: int | None = None) -> MambaSpec:
    return MambaSpec(
        block_size=bs,
        shapes=((4,),),
        dtypes=(torch.float16,),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=ckpt,
        prefill_checkpoint_alignment=align,
    )


# name -> (description, specs, hash block, num_blocks, share in report mode full, mix, scale
#          [, token budget: a prefill checkpoint needs a chunk past two Mamba blocks])
SCENARIOS: dict[str, tuple] = {
    "e_gemma3_b32_h16": (
        "Gemma-3-like: 1 full + 3 sliding-window (w 128) groups, block 32, hash 16",
        lambda: [_fa(32)] + [_sw(32, 128) for _ in range(3)],
        16,
        260,
        0.0,
        None,
        (0.4, 0.5),
    ),
    "f_full2_b48_h16": (
        "two full-attention groups (head sizes 8 and 16), block 48, hash 16",
        lambda: [_fa(48), _fa(48, 16)],
        16,
        160,
        0.0,
        None,
        (0.5, 0.5),
    ),
    "g_mamba2_b544_h16": (
        "Mamba hybrid: 2 Mamba + 1 full-attention group, block 544, hash 16, partial hash hits",
        lambda: [_mb(544), _mb(544), _fa(544)],
        16,
        100,
        0.0,
        LONG,
        (0.4, 0.5),
    ),
    "h_mamba_b544_h32_ckpt": (
        "Mamba hybrid: 1 Mamba (prefill checkpoints, alignment 32) + 2 full-attention groups,"
        " block 544, hash 32",
        lambda: [_mb(544, 1, 32), _fa(544), _fa(544, 16)],
        32,
        100,
        0.0,
        LONG,
        (0.4, 0.5),
    ),
    "k_mamba2_b544_h32_ckpt": (
        "Mamba hybrid: 2 Mamba (prefill checkpoints, alignment 32) + 1 full-attention group,"
        " block 544, hash 32, token budget 2048 (a chunk past two Mamba blocks exports its"
        " checkpoint)",
        lambda: [_mb(544, 1, 32), _mb(544, 1, 32), _fa(544)],
        32,
        100,
        0.0,
        LONG,
        (0.4, 0.5),
        2048,
    ),
    "i_gemma3_b32_h16_half_full": (
        "Gemma-3-like at block 32 / hash 16 (1 full + 3 sliding-window w 64), 1/2 of the"
        " requests in kv_cache_report_mode='full'",
        lambda: [_fa(32)] + [_sw(32, 64) for _ in range(3)],
        16,
        260,
        0.5,
        None,
        (0.4, 0.5),
    ),
    "j_gemma3_b16_all_full": (
        "Gemma-3-like at block 16 = hash 16 (1 full + 2 sliding-window w 48), EVERY request in"
        " kv_cache_report_mode='full'",
        lambda: [_fa(16)] + [_sw(16, 48) for _ in range(2)],
        16,
        300,
        1.0,
        None,
        (0.4, 0.5),
    ),
}


class Truth:
    """Counts from the live BlockPool: each hash insert and remove by the method it is in."""

    def __init__(self, pool, groups: list[dict]) -> None:
        self.pool, self.ctx = pool, [None]
        self.kind = [g["kind"] for g in groups]
        self.c = [defaultdict(int) for _ in groups]
        self.ever: set = set()
        self.discarded: set = set()  # keys a Mamba checkpoint discard removed
        self.live = [0] * len(groups)
        self.peak = [0] * len(groups)
        self.kind_peak: dict[str, int] = defaultdict(int)
        self.rekeyed: set[int] = set()  # blocks that lost their keys in this re-key call
        ins, rem = pool._insert_block_hash, pool._remove_cached_block_hashes

        def around(name, tag, before=None):
            orig = getattr(pool, name)

            def f(*a, **k):
                self.ctx.append(tag(*a, **k) if callable(tag) else tag)
                saved, self.rekeyed = self.rekeyed, set()
                try:
                    return orig(*a, **k)
                finally:
                    self.ctx.pop()
                    self.rekeyed = saved

            setattr(pool, name, f)

        around("cache_full_blocks", "full")
        around(
            "cache_partial_block",
            lambda *a, **k: "replace" if k.get("replace_existing_hashes") else "partial",
        )
        around("move_block_hashes", "move")
        around("get_new_blocks", "alloc")
        evict = pool._maybe_evict_cached_block

        def maybe_evict(block):
            self.ctx.append("evict" if self.ctx[-1] == "alloc" else "discard")
            try:
                return evict(block)
            finally:
                self.ctx.pop()

        pool._maybe_evict_cached_block = maybe_evict

        def insert(key, block, num_tokens):
            if block.block_hash == key or pool.cached_block_hash_to_block.contain(
                key, block.block_id
            ):
                return ins(key, block, num_tokens)
            g, ctx, c = get_group_id(key), self.ctx[-1], None
            c = self.c[g]
            first = block.block_hash is None
            other = pool.cached_block_hash_to_block.get_one_block(key) is not None
            if ctx == "move":
                c["entries_moved_to_cow_block"] += 1
            elif not first:
                c["extra_hash_keys_on_already_cached_block"] += 1
            elif block.block_id in self.rekeyed:
                c["same_block_rekeyed_after_promotion_or_replace"] += 1
            else:
                c["physical_blocks_newly_cached"] += 1
                if other:
                    c["second_copy"] += 1
                elif key in self.ever:
                    c["recompute"] += 1
                    c["recompute_of_a_discarded_checkpoint_key"] += key in self.discarded
                else:
                    c["new_key"] += 1
            self.ever.add(key)
            out = ins(key, block, num_tokens)
            if first:
                self._live(g, +1)
            return out

        def remove(block):
            had = block.block_hash
            out = rem(block)
            if had is None or not out:
                return out
            g, ctx = get_group_id(had), self.ctx[-1]
            c = self.c[g]
            if ctx == "evict":
                c["physical_evictions"] += len(out)
                c["physical_blocks_evicted"] += 1
            elif ctx == "discard":
                self.discarded.update(out)
                c["discarded_transient_checkpoint_not_eviction"] += len(out)
                c["physical_blocks_discarded"] += 1
            elif ctx == "full":
                c["partial_promotion_to_full_not_eviction"] += len(out)
                self.rekeyed.add(block.block_id)
            elif ctx == "partial":
                c["partial_promotion_to_longer_partial_not_eviction"] += len(out)
                self.rekeyed.add(block.block_id)
            elif ctx == "replace":
                c["replace_existing_hashes_not_eviction"] += len(out)
                self.rekeyed.add(block.block_id)
            elif ctx == "move":
                pass
            else:
                c["unlabelled"] += len(out)
            self._live(g, -1)
            return out

        pool._insert_block_hash = insert
        pool._remove_cached_block_hashes = remove

    def _live(self, g: int, d: int) -> None:
        self.live[g] += d
        self.peak[g] = max(self.peak[g], self.live[g])
        k = self.kind[g]
        self.kind_peak[k] = max(
            self.kind_peak[k], sum(v for i, v in enumerate(self.live) if self.kind[i] == k)
        )

    def reset(self, mgr) -> bool:
        entries = [0] * len(self.live)
        for key, blocks in self.pool.cached_block_hash_to_block._cache.items():
            entries[get_group_id(key)] += 1 if not isinstance(blocks, dict) else len(blocks)
        blocks = [0] * len(self.live)
        for b in self.pool.blocks:
            if b.block_hash is not None:
                blocks[get_group_id(b.block_hash)] += 1
        if not mgr.reset_prefix_cache():
            return False
        for g in range(len(self.live)):
            self.c[g]["entries_cleared_by_reset"] += entries[g]
            self.c[g]["physical_blocks_cleared_by_reset"] += blocks[g]
            self.c[g]["all_blocks_cleared_events"] += 1
            self.live[g] = 0
        return True

    def end(self) -> list[dict]:
        n = len(self.live)
        entries, keys, phys = [0] * n, [0] * n, [0] * n
        for key, blocks in self.pool.cached_block_hash_to_block._cache.items():
            entries[get_group_id(key)] += 1 if not isinstance(blocks, dict) else len(blocks)
            keys[get_group_id(key)] += 1
        for b in self.pool.blocks:
            if b.block_hash is not None:
                phys[get_group_id(b.block_hash)] += 1
        assert phys == self.live, (phys, self.live)
        return [
            {
                "cached_entries_end": entries[g],
                "cached_hash_keys_end": keys[g],
                "physical_cached_blocks_end": phys[g],
            }
            for g in range(n)
        ]


def run(name: str, seed: int, out: Path) -> dict:
    desc, mk, hash_bs, num_blocks, full_share, mix, scale = SCENARIOS[name][:7]
    token_budget = SCENARIOS[name][7] if len(SCENARIOS[name]) > 7 else vd.TOKEN_BUDGET
    sp = mk()
    block = max(s.block_size for s in sp)
    groups = [
        KVCacheGroupSpec(layer_names=[f"layer{i}"], kv_cache_spec=s) for i, s in enumerate(sp)
    ]
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    mgr = KVCacheManager(
        cfg,
        max_model_len=65536,
        scheduler_block_size=block,
        hash_block_size=hash_bs,
        max_in_flight_tokens=token_budget,
        enable_caching=True,
        enable_kv_cache_events=True,
        log_stats=True,  # vLLM's own PrefixCacheStats, recorded at admission as its scheduler
    )
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_bs, hash_fn)
    meta_groups = vd.group_metadata(mgr, cfg)
    truth = Truth(mgr.block_pool, meta_groups)
    mamba = [isinstance(s, MambaSpec) for s in sp]
    is_mamba = any(mamba)
    convs, evals = vd.workload(seed, "full", mix, scale)
    rng = random.Random(seed * 7 + 1)

    # announcements: count them where emitted, per request (taken back if not admitted)
    pending: dict[str, list[int]] = {}
    emit = mgr.block_pool.emit_cached_block_events

    def emit_w(request, num_cached_blocks, block_size, kv_cache_group_id):
        c = truth.c[kv_cache_group_id]
        c["hit_reannouncement_events"] += 1
        c["hit_reannouncements_report_mode_full"] += num_cached_blocks
        c["tokens_announce"] += num_cached_blocks * block_size
        pending.setdefault(request.request_id, [0] * len(sp))[kv_cache_group_id] += (
            num_cached_blocks
        )
        queue = mgr.block_pool.kv_event_queue
        before = len(queue)
        got = emit(request, num_cached_blocks, block_size, kv_cache_group_id)
        announced.update(id(ev) for ev in mgr.block_pool.kv_event_queue[before:])
        return got

    # The events emit_cached_block_events made (vllm-project/vllm#51699 would send them with
    # origin="REUSED", every other BlockStored "NEW"): their places in each batch, by seq.
    announced: set[int] = set()
    origin_reused: dict[str, list[int]] = {}
    mgr.block_pool.emit_cached_block_events = emit_w

    arrivals = vd.arrivals_of(convs, evals, open_loop=False)
    waiting: list[Request] = []
    running: list[Request] = []
    meta: dict[str, tuple] = {}
    cnt: dict[str, int] = defaultdict(int)
    enc = msgspec.msgpack.Encoder()
    frames = bytearray()
    seq = step = finished = 0
    total_req = len(evals) + sum(len(c["turns"]) for c in convs)
    reset_at = vd.MIX["horizon"] // 2
    reset_step = None

    def make(kind, payload) -> Request:
        if kind == "eval":
            rid, prompt, outt = payload["id"], payload["prompt"], payload["out"]
            info = ("eval", None)
        else:
            c, t, hist = payload
            prompt = list(c["system"]) + hist + c["turns"][t]["user"]
            rid, outt = f"c{c['id']}_t{t}", c["turns"][t]["out"]
            info = ("turn", (c, t, prompt))
        full = rng.random() < full_share
        cnt["requests_report_mode_full"] += full
        extra = {"kv_cache_report_mode": "full"} if full else None
        req = Request(
            rid,
            prompt,
            SamplingParams(max_tokens=len(outt), extra_args=extra),
            None,
            arrival_time=float(step),
            block_hasher=hasher,
        )
        meta[rid] = (info, outt)
        return req

    ckpt = next((s for s in sp if isinstance(s, MambaSpec)), None)
    split_self = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block),
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        block_size=block,
        hash_block_size=hash_bs,
        max_num_scheduled_tokens=token_budget,
        use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=bool(
            is_mamba
            and all(s.num_prefill_checkpoint_blocks > 0 for s in sp if isinstance(s, MambaSpec))
        ),
        mamba_prefill_checkpoint_alignment=ckpt.prefill_checkpoint_alignment if ckpt else None,
        mamba_partial_cache_hit=hash_bs < block and mgr.coordinator.enable_partial_hash_hits,
        mamba_shared_prefix_checkpoint=False,
    )

    def aligned(req: Request, n_hit: int, n: int) -> int:
        if not is_mamba:
            return n
        return int(Scheduler._mamba_block_aligned_split(split_self, req, n, n_hit))

    def preempt(req: Request) -> None:
        mgr.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        cnt["preemptions"] += 1
        waiting.insert(0, req)

    def not_admitted(req: Request) -> None:
        got = pending.pop(req.request_id, None)
        if got:
            for g, n in enumerate(got):
                truth.c[g]["hit_reannouncements_for_admissions_that_then_failed"] += n

    while finished < total_req:
        if step > 20000:
            raise RuntimeError(
                f"no progress: {finished}/{total_req} finished, {len(running)} running, "
                f"{len(waiting)} waiting, {mgr.block_pool.get_num_free_blocks()} free; "
                + "; ".join(
                    f"{r.request_id} {r.num_computed_tokens}/{r.num_tokens}"
                    for r in running[:3] + waiting[:3]
                )
                + " held by "
                + str(
                    [
                        sorted((k, len(v)) for k, v in m.req_to_blocks.items() if v)[:6]
                        for m in mgr.coordinator.single_type_managers
                    ]
                )
            )
        if reset_step is None and step >= reset_at and not running and truth.reset(mgr):
            reset_step = step
        mgr.new_step_starts()
        for kind, payload in arrivals.pop(step, []):
            waiting.append(make(kind, payload))
        budget = token_budget
        scheduled: dict[str, int] = {}
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
            while waiting and len(running) < vd.MAX_NUM_SEQS and budget > 0:
                req = waiting[0]
                pending.pop(req.request_id, None)
                computed, n_hit, req.shared_prefix_boundary = mgr.get_computed_blocks(req)
                n = aligned(req, n_hit, min(req.num_tokens - n_hit, budget))
                blocks = mgr.allocate_slots(req, n, n_hit, computed) if n > 0 else None
                if blocks is None:
                    cnt["failed_lookups"] += 1
                    not_admitted(req)
                    break
                waiting.pop(0)
                pending.pop(req.request_id, None)
                cnt["admissions"] += 1
                cnt["prefix_hit_tokens"] += n_hit
                # Scheduler.schedule: "Record at admission so unscheduled lookups are not
                # counted" (vllm:prefix_cache_queries / _hits are these stats' queries / hits).
                mgr.record_prefix_cache_stats(req, n_hit)
                full = req.kv_cache_report_mode == "full"
                cnt["admissions_report_mode_full"] += full
                for g, blist in enumerate(computed.blocks):
                    c, bs = truth.c[g], meta_groups[g]["block_size"]
                    c["hit_blocks_admitted"] += len(blist)
                    c["hit_blocks_admitted_not_null"] += sum(1 for b in blist if not b.is_null)
                    c["hit_tokens_admitted"] += n_hit
                    if full and n_hit > 0:
                        c["hit_blocks_admitted_report_mode_full"] += len(blist)
                        c["hit_tokens_admitted_report_mode_full"] += len(blist) * bs
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = n_hit
                running.append(req)
                scheduled[req.request_id] = n
                budget -= n
        # A partial hit's copy-on-write keeps both blocks until the copy ran (the scheduler's
        # take_kv_cache_block_copies + _free_cow_retained_blocks); this step's ran now.
        copies, retained = mgr.take_kv_cache_block_copies()
        cnt["cow_copies"] += len(copies)
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
        mgr.block_pool.free_blocks(retained[::-1])
        for req in done:
            running.remove(req)
            mgr.free(req)
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            finished += 1
            info, outt = meta.pop(req.request_id)
            if info[0] == "turn":
                c, t, prompt = info[1]
                if t + 1 < len(c["turns"]):
                    hist = prompt[len(c["system"]) :] + list(outt)
                    arrivals[step + 1 + c["turns"][t]["gap"]].append(("turn", (c, t + 1, hist)))
        events = mgr.take_events()
        if events:
            for ev in events:
                gi = getattr(ev, "group_idx", None)
                if type(ev).__name__ == "BlockStored":
                    truth.c[gi]["blocks_stored_total_on_wire"] += len(ev.block_hashes)
                    truth.c[gi]["tokens_on_wire"] += len(ev.token_ids)
                elif type(ev).__name__ == "BlockRemoved":
                    truth.c[gi]["blocks_removed_total_on_wire"] += len(ev.block_hashes)
            cnt["batches"] += 1
            reused = [i for i, ev in enumerate(events) if id(ev) in announced]
            if reused:
                origin_reused[str(seq)] = reused
            announced.clear()
            payload = enc.encode(KVEventBatch(ts=vd.TS0 + seq * 0.001, events=events))
            parts = [b"", seq.to_bytes(8, "big"), payload]
            frames += struct.pack(">I", len(parts))
            for f in parts:
                frames += struct.pack(">I", len(f)) + f
            seq += 1
        step += 1
    (out / f"{name}.frames").write_bytes(bytes(frames))
    (out / "groups.json").write_text(json.dumps(meta_groups, indent=1) + "\n")
    (out / "origin.json").write_text(json.dumps(origin_reused, separators=(",", ":")) + "\n")
    return {
        "scenario": name,
        "vllm_version": "0.33.0",
        "description": desc,
        "seed": seed,
        "config": {
            "num_blocks": num_blocks,
            "usable_blocks": num_blocks - 1,
            "scheduler_block_size": block,
            "hash_block_size": hash_bs,
            "coordinator": type(mgr.coordinator).__name__,
            "enable_partial_hash_hits": bool(mgr.coordinator.enable_partial_hash_hits),
            "report_mode_full_share": full_share,
            "token_budget": token_budget,
            "max_num_seqs": vd.MAX_NUM_SEQS,
            "specs": [repr(s) for s in sp],
        },
        "group_metadata": meta_groups,
        "run": dict(cnt, steps=step, finished=finished, reset_step=reset_step),
        "vllm_prefix_cache_stats": _prefix_cache_stats(mgr),
        "by_group": rows(truth, meta_groups),
        "_kind_peak": dict(truth.kind_peak),
    }


def rows(truth: Truth, groups: list[dict]) -> list[dict]:
    out = []
    for g, (gm, end) in enumerate(zip(groups, truth.end(), strict=True)):
        c = truth.c[g]
        stored = c["physical_blocks_newly_cached"]
        out.append(
            {
                "group_idx": g,
                "kind": gm["kind"],
                "block_size": gm["block_size"],
                "sliding_window": gm["sliding_window"],
                "stores": {
                    "blocks_stored_total_on_wire": c["blocks_stored_total_on_wire"],
                    "physical_blocks_newly_cached": stored,
                    "new_full_block_entries_insert_outcomes": {
                        "new_key": c["new_key"],
                        "second_copy": c["second_copy"],
                        "recompute": c["recompute"],
                    },
                    "recompute_of_a_discarded_checkpoint_key": c[
                        "recompute_of_a_discarded_checkpoint_key"
                    ],
                    "second_physical_copy_of_a_cached_key": c["second_copy"],
                    "extra_hash_keys_on_already_cached_block": c[
                        "extra_hash_keys_on_already_cached_block"
                    ],
                    "same_block_rekeyed_after_promotion_or_replace": c[
                        "same_block_rekeyed_after_promotion_or_replace"
                    ],
                    "hit_reannouncement_events": c["hit_reannouncement_events"],
                    "hit_reannouncements_report_mode_full": c[
                        "hit_reannouncements_report_mode_full"
                    ],
                    "hit_reannouncements_for_admissions_that_then_failed": c[
                        "hit_reannouncements_for_admissions_that_then_failed"
                    ],
                    "tokens_stored_announce": c["tokens_announce"],
                    "tokens_on_wire": c["tokens_on_wire"],
                    "tokens_stored_real": c["tokens_on_wire"] - c["tokens_announce"],
                },
                "removes": {
                    k: c[k]
                    for k in (
                        "blocks_removed_total_on_wire",
                        "physical_evictions",
                        "physical_blocks_evicted",
                        "physical_blocks_discarded",
                        "partial_promotion_to_full_not_eviction",
                        "partial_promotion_to_longer_partial_not_eviction",
                        "replace_existing_hashes_not_eviction",
                        "discarded_transient_checkpoint_not_eviction",
                        "unlabelled",
                    )
                },
                "reset": {
                    k: c[k]
                    for k in (
                        "all_blocks_cleared_events",
                        "entries_cleared_by_reset",
                        "physical_blocks_cleared_by_reset",
                    )
                },
                "pool_internal": {"entries_moved_to_cow_block": c["entries_moved_to_cow_block"]},
                "end": end,
                "peak": {"peak_physical_cached_blocks": truth.peak[g]},
                "hits": {
                    k: c[k]
                    for k in (
                        "hit_blocks_admitted",
                        "hit_blocks_admitted_not_null",
                        "hit_tokens_admitted",
                        "hit_blocks_admitted_report_mode_full",
                        "hit_tokens_admitted_report_mode_full",
                    )
                },
            }
        )
    return out


def _prefix_cache_stats(mgr: KVCacheManager) -> dict[str, int]:
    """vLLM's own PrefixCacheStats of the whole run (``make_prefix_cache_stats``, in tokens):
    ``queries`` / ``hits`` of new requests (vllm:prefix_cache_queries / _hits), and those of
    requests admitted again after a preemption apart (``preempted_*``, no Prometheus
    counter)."""
    st = mgr.make_prefix_cache_stats()
    assert st is not None
    return {
        k: int(getattr(st, k))
        for k in (
            "requests",
            "queries",
            "hits",
            "preempted_requests",
            "preempted_queries",
            "preempted_hits",
        )
    }


def by_kind(by_group: list[dict], kind_peak: dict[str, int]) -> list[dict]:
    out: dict[str, dict] = {}
    for r in by_group:
        k = out.setdefault(r["kind"], {"kind": r["kind"], "groups": []})
        k["groups"].append(r["group_idx"])
        for sec in ("stores", "removes", "reset", "end", "hits", "pool_internal"):
            dst = k.setdefault(sec, {})
            for f, v in r[sec].items():
                if isinstance(v, dict):
                    d2 = dst.setdefault(f, {})
                    for f2, v2 in v.items():
                        d2[f2] = d2.get(f2, 0) + v2
                else:
                    dst[f] = dst.get(f, 0) + v
    for k in out.values():
        k["peak"] = {"peak_physical_cached_blocks": kind_peak[k["kind"]]}
    return list(out.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t = run(a.scenario, a.seed, a.out)
    t["by_kind"] = by_kind(t["by_group"], t.pop("_kind_peak"))
    frames = a.out / f"{a.scenario}.frames"
    t["frames"] = {
        "file": frames.name,
        "messages": t["run"]["batches"],
        "bytes": frames.stat().st_size,
    }
    (a.out / "truth.json").write_text(json.dumps(t, indent=1) + "\n")
    print(json.dumps(t["run"]), flush=True)
    for k in t["by_kind"]:
        print(
            k["kind"], json.dumps({s: k[s] for s in ("stores", "removes", "end", "peak", "hits")})
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
