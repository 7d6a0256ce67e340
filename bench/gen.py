"""Generate big, realistic hybrid-model KV-event streams shaped like vLLM 0.33's.

A small simulation of vLLM's scheduler and block pool drives the events (PROTOCOL.md
"What vLLM emits"):

- G KV cache groups share one pool of physical blocks; a request's newly full blocks are
  stored once per group, with the same hashes (``--model gemma3``: 1 full attention + 5
  sliding window; ``--model mla-mamba``: MLA, sliding-window MLA and Mamba groups).
- Prompts share prefixes (a Zipf-popular set of system prompts) and hit the prefix cache;
  some hits are re-announced as ``BlockStored`` (restored blocks).
- Chunked prefill; sliding-window groups store only the blocks inside the window of a
  chunk (a store can carry zero hashes) and free the blocks that slide out (cached, no
  event); Mamba stores at most the last block of a chunk.
- Some stores are partial (``block_size`` = the tokens in the block).
- Eviction is lazy: a cached free block emits ``BlockRemoved`` (one hash per event) only
  when it is reallocated, in LRU order, so removes come in bursts of hundreds under
  memory pressure; two requests computing the same block concurrently hold two physical
  blocks with one hash (each evicted with its own event).
- One prefix-cache reset (``AllBlocksCleared``) after draining the running requests.
- The recording starts after a warm-up (seq does not start at 0; orphan removes appear).

Output (under ``bench/data/``, git-ignored): ``NAME.mcap`` (a kvtool recording written with
:class:`kvtool.recording.RecordingWriter`), optionally ``NAME.frames`` (vLLM framing, for the
publisher benches), and ``NAME.truth.json``: the report numbers computed by a plain
reference computation over the generated event objects, before encoding.

Usage::

    python3 bench/gen.py --scale 1 --name big1        # >= 1.2 M block events, ~90 MB payload
    python3 bench/gen.py --scale 10 --name big10 --no-frames
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import struct
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
sys.path.insert(0, str(HERE.parent))

from kvtool.recording import RecordingWriter  # noqa: E402

BLOCK = 16
ENDPOINT = "tcp://127.0.0.1:5557"


# --- vLLM 0.33 wire structs (vllm/distributed/kv_events.py) --------------------------------


class MapStored(msgspec.Struct, tag="BlockStored", tag_field="type", omit_defaults=True):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class MapRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type", omit_defaults=True):
    block_hashes: list[Any]
    medium: str | None
    group_idx: int | None = None


class MapCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", omit_defaults=True):
    pass


# The last array layout (vLLM ~0.22-0.23): 12-element stores, 4-element removes.
class ArrStored(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None
    group_idx: int | None
    kv_cache_spec_kind: str | None
    kv_cache_spec_sliding_window: int | None


class ArrRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[Any]
    medium: str | None
    group_idx: int | None


class ArrCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


class Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None


MODELS: dict[str, list[tuple[str, int | None]]] = {
    # (kind, sliding window in tokens)
    "gemma3": [("full_attention", None)] + [("sliding_window", 1024)] * 5,
    "mla-mamba": [
        ("mla_attention", None),
        ("sliding_window_mla", 512),
        ("mamba", None),
        ("mamba", None),
    ],
    "full": [("full_attention", None)],
}


class Block:
    """One physical block of the pool."""

    __slots__ = ("group", "hash", "id", "ref")

    def __init__(self, bid: int) -> None:
        self.id = bid
        self.group = -1
        self.hash: int | None = None
        self.ref = 0


class Request:
    __slots__ = (
        "blocks",
        "done_blocks",
        "hashes",
        "left",
        "pos",
        "prompt_blocks",
        "slid",
        "tokens",
    )

    def __init__(
        self, hashes: list[int], tokens: list[int], prompt_blocks: int, out_tokens: int, groups: int
    ) -> None:
        self.hashes = hashes  # hash of every (future) full block
        self.tokens = tokens  # token ids (prompt + output) backing them
        self.prompt_blocks = prompt_blocks
        self.pos = 0  # tokens computed so far
        self.left = out_tokens
        self.blocks: list[list[Block | None]] = [[] for _ in range(groups)]
        self.slid = [0] * groups  # sliding window: blocks below this index are released
        self.done_blocks = 0  # full blocks already stored


class Sim:
    """The scheduler and block pool (a small model of vLLM's, enough for the event shape)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.rng = random.Random(args.seed)
        self.groups = MODELS[args.model]
        self.G = len(self.groups)
        self.num_blocks = args.pool_blocks
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)
        self.cached: dict[tuple[int, int], list[Block]] = {}
        self.running: list[Request] = []
        self.events: list[Any] = []
        self.max_running = args.max_running
        self.prefill_budget = args.prefill_tokens
        self.reannounce = args.reannounce
        self.partial = args.partial
        # Blocks a group keeps behind the newest one (None: all of them).
        self.keep: list[int | None] = []
        for kind, window in self.groups:
            if window is not None:
                self.keep.append(window // BLOCK + 1)
            elif kind == "mamba":
                self.keep.append(1)
            else:
                self.keep.append(None)
        r = self.rng
        self.token_pool = [r.randrange(1, 150_000) for _ in range(1 << 16)]
        # Shared prefixes: system prompts of 4..160 blocks, Zipf popularity.
        self.prefixes: list[tuple[list[int], list[int]]] = []
        for _ in range(args.prefixes):
            n = r.randint(4, 160)
            self.prefixes.append(self._fresh_blocks(n))
        weights = [1.0 / (i + 1) ** 1.1 for i in range(len(self.prefixes))]
        total = sum(weights)
        acc = 0.0
        self.cum: list[float] = []
        for w in weights:
            acc += w / total
            self.cum.append(acc)
        self.cum[-1] = 1.0
        self.draining = False

    def _tokens(self, n: int) -> list[int]:
        off = self.rng.randrange(0, len(self.token_pool) - n)
        return self.token_pool[off : off + n]

    def _fresh_blocks(self, n: int) -> tuple[list[int], list[int]]:
        getrandbits = self.rng.getrandbits
        return [getrandbits(64) for _ in range(n)], self._tokens(n * BLOCK)

    def new_request(self) -> Request:
        r = self.rng
        hashes: list[int] = []
        tokens: list[int] = []
        if r.random() < 0.85:
            p = self.prefixes[bisect.bisect_left(self.cum, r.random())]
            k = len(p[0]) if r.random() < 0.7 else r.randint(1, len(p[0]))
            hashes += p[0][:k]
            tokens += p[1][: k * BLOCK]
        h, t = self._fresh_blocks(r.randint(2, 48))
        hashes += h
        tokens += t
        prompt_blocks = len(hashes)
        out = r.randint(16, 400)
        out_h, out_t = self._fresh_blocks(out // BLOCK + 2)
        return Request(hashes + out_h, tokens + out_t, prompt_blocks, out, self.G)

    # --- pool ----------------------------------------------------------------------------

    def alloc(self) -> Block:
        _, b = self.free.popitem(last=False)
        if b.hash is not None:  # lazy eviction: the event is sent now, on reuse
            key = (b.group, b.hash)
            lst = self.cached[key]
            lst.remove(b)
            if not lst:
                del self.cached[key]
            self.events.append(("R", b.group, b.hash))
            b.hash = None
        b.ref = 1
        return b

    def release(self, b: Block) -> None:
        b.ref -= 1
        if b.ref == 0:
            self.free[b.id] = b

    def touch(self, b: Block) -> None:
        if b.ref == 0:
            del self.free[b.id]
        b.ref += 1

    def cache(self, b: Block, g: int, h: int) -> None:
        if b.hash is not None:
            return
        b.group = g
        b.hash = h
        self.cached.setdefault((g, h), []).append(b)

    # --- one engine step -------------------------------------------------------------------

    def store(
        self,
        g: int,
        req: Request,
        first: int,
        last: int,
        tok_from: int,
        tok_to: int,
        block_size: int = BLOCK,
    ) -> None:
        hashes = req.hashes[first:last]
        parent = req.hashes[first - 1] if first > 0 else None
        self.events.append(("S", g, hashes, parent, req.tokens[tok_from:tok_to], block_size))

    def hit_length(self, req: Request) -> int:
        """The longest prefix every group can serve from the cache (vLLM's hybrid hit)."""
        cached = self.cached
        full = 0
        for i in range(req.prompt_blocks - 1):
            if all((g, req.hashes[i]) in cached for g, k in enumerate(self.keep) if k is None):
                full = i + 1
            else:
                break
        for n in range(full, 0, -1):
            ok = True
            for g, k in enumerate(self.keep):
                if k is not None and not all(
                    (g, req.hashes[i]) in cached for i in range(max(0, n - k), n)
                ):
                    ok = False
                    break
            if ok:
                return n
        return 0

    def admit(self) -> None:
        r = self.rng
        while (
            not self.draining
            and len(self.running) < self.max_running
            and len(self.free) > self.num_blocks // 3
        ):
            req = self.new_request()
            hit = self.hit_length(req)
            reannounce = hit > 0 and r.random() < self.reannounce
            for g, k in enumerate(self.keep):
                lo = 0 if k is None else max(0, hit - k)
                req.blocks[g].extend([None] * lo)
                req.slid[g] = lo
                for i in range(lo, hit):
                    b = self.cached[(g, req.hashes[i])][0]
                    self.touch(b)
                    req.blocks[g].append(b)
                if reannounce:  # prefix-cache hit re-announced as BlockStored
                    self.store(g, req, lo, hit, 0, hit * BLOCK)
            req.pos = hit * BLOCK
            req.done_blocks = hit
            self.running.append(req)

    def step(self) -> None:
        budget = self.prefill_budget
        finished: list[Request] = []
        progressed = False
        for req in self.running:
            prompt_tokens = req.prompt_blocks * BLOCK
            if req.pos < prompt_tokens:
                n = min(budget, prompt_tokens - req.pos)
                if n <= 0:
                    continue
                new_pos = req.pos + n
            else:
                n = 0
                new_pos = req.pos + 1
            need = (new_pos + BLOCK - 1) // BLOCK
            missing = sum(need - len(bl) for bl in req.blocks)
            if missing > len(self.free):
                continue  # the pool is full: this request waits
            progressed = True
            budget -= n
            if n == 0:
                req.left -= 1
            for bl in req.blocks:
                while len(bl) < need:
                    bl.append(self.alloc())
            full = new_pos // BLOCK
            if full > req.done_blocks:
                a, z = req.done_blocks, full
                for g, k in enumerate(self.keep):
                    bl = req.blocks[g]
                    lo = a if k is None else max(a, z - k)
                    if self.groups[g][0] == "mamba" and self.rng.random() < 0.2:
                        lo = z  # align mode: nothing cached for this chunk
                    # Blocks skipped as null are not stored, but their tokens are.
                    self.store(g, req, lo, z, a * BLOCK, z * BLOCK)
                    for i in range(lo, z):
                        b = bl[i]
                        assert b is not None
                        self.cache(b, g, req.hashes[i])
                    if k is not None:  # out of the window: freed, but stays cached
                        for i in range(req.slid[g], max(req.slid[g], z - k)):
                            b = bl[i]
                            if b is not None:
                                self.release(b)
                                bl[i] = None
                        req.slid[g] = max(req.slid[g], z - k)
                req.done_blocks = full
            req.pos = new_pos
            if req.pos >= prompt_tokens and req.left <= 0:
                finished.append(req)
        for req in finished:
            self.finish(req)
        if not progressed and self.running:
            # Out of blocks: preempt the newest request, as vLLM's scheduler does.
            self.finish(self.running[-1], preempted=True)
        self.admit()

    def finish(self, req: Request, preempted: bool = False) -> None:
        self.running.remove(req)
        partial_tokens = req.pos - req.done_blocks * BLOCK
        i = req.done_blocks
        if not preempted and partial_tokens > 0 and self.rng.random() < self.partial:
            # A partial store: block_size is the number of tokens in the block.
            for g in range(self.G):
                b = req.blocks[g][i]
                if b is not None:
                    self.store(
                        g,
                        req,
                        i,
                        i + 1,
                        i * BLOCK,
                        i * BLOCK + partial_tokens,
                        block_size=partial_tokens,
                    )
                    self.cache(b, g, req.hashes[i])
        for bl in req.blocks:
            # vLLM frees in reverse order so tail blocks are evicted first.
            for b in reversed(bl):
                if b is not None:
                    self.release(b)

    def clear(self) -> None:
        for b in self.blocks:
            b.hash = None
        self.cached.clear()
        self.events.append(("C",))


def hash_bytes(h: int) -> bytes:
    m = 0xFFFFFFFFFFFFFFFF
    return (
        ((h * 0x9E3779B97F4A7C15) & m).to_bytes(8, "big")
        + ((h ^ 0xDEADBEEFCAFEF00D) & m).to_bytes(8, "big")
        + ((h * 0xC2B2AE3D27D4EB4F + 1) & m).to_bytes(8, "big")
        + h.to_bytes(8, "big")
    )


class Truth:
    """The reference computation: DESIGN.md's report semantics over the event objects."""

    COLS = (
        "store_events",
        "blocks_stored",
        "tokens_stored",
        "remove_events",
        "blocks_removed",
        "blocks_cleared",
        "restored_blocks",
        "orphan_removes",
    )

    def __init__(self, groups: list[tuple[str, int | None]]) -> None:
        self.groups = groups
        self.rows = [dict.fromkeys(self.COLS, 0) for _ in groups]
        self.live: dict[tuple[int, int], int] = {}
        self.live_per_group = [0] * len(groups)
        self.peak_per_group = [0] * len(groups)
        self.distinct: list[set[int]] = [set() for _ in groups]
        self.kinds = sorted({k for k, _ in groups})
        self.windows = sorted({w for _, w in groups}, key=lambda w: (w is not None, w or 0))
        self.live_kind = dict.fromkeys(self.kinds, 0)
        self.peak_kind = dict.fromkeys(self.kinds, 0)
        self.live_win: dict[int | None, int] = dict.fromkeys(self.windows, 0)
        self.peak_win: dict[int | None, int] = dict.fromkeys(self.windows, 0)
        self.live_total = 0
        self.peak_total = 0
        self.batches = 0
        self.events = 0

    def _bump(self, g: int, d: int) -> None:
        kind, win = self.groups[g]
        self.live_per_group[g] += d
        self.live_kind[kind] += d
        self.live_win[win] += d
        self.live_total += d
        if d > 0:
            self.peak_per_group[g] = max(self.peak_per_group[g], self.live_per_group[g])
            self.peak_kind[kind] = max(self.peak_kind[kind], self.live_kind[kind])
            self.peak_win[win] = max(self.peak_win[win], self.live_win[win])
            self.peak_total = max(self.peak_total, self.live_total)

    def apply(self, ev: tuple[Any, ...]) -> None:
        self.events += 1
        if ev[0] == "S":
            _, g, hashes, _parent, tokens, _bs = ev
            row = self.rows[g]
            row["store_events"] += 1
            row["blocks_stored"] += len(hashes)
            row["tokens_stored"] += len(tokens)
            for h in hashes:
                key = (g, h)
                n = self.live.get(key, 0)
                if n:
                    row["restored_blocks"] += 1
                self.live[key] = n + 1
                self.distinct[g].add(h)
                self._bump(g, 1)
        elif ev[0] == "R":
            _, g, h = ev
            row = self.rows[g]
            row["remove_events"] += 1
            row["blocks_removed"] += 1
            key = (g, h)
            n = self.live.get(key, 0)
            if n == 0:
                row["orphan_removes"] += 1
            else:
                if n == 1:
                    del self.live[key]
                else:
                    self.live[key] = n - 1
                self._bump(g, -1)
        else:
            for g in range(len(self.groups)):
                self.rows[g]["blocks_cleared"] += self.live_per_group[g]
                self._bump(g, -self.live_per_group[g])
            self.live.clear()

    def result(self) -> dict[str, Any]:
        by_group = []
        for g, (kind, win) in enumerate(self.groups):
            row = {
                "group_idx": g,
                "kind": kind,
                "sliding_window": win,
                **self.rows[g],
                "live_blocks_end": self.live_per_group[g],
                "peak_live_blocks": self.peak_per_group[g],
                "distinct_hashes": len(self.distinct[g]),
            }
            by_group.append(row)

        def agg(pred: Any) -> dict[str, Any]:
            sel = [g for g, kw in enumerate(self.groups) if pred(kw)]
            out: dict[str, Any] = {c: sum(self.rows[g][c] for g in sel) for c in self.COLS}
            out["live_blocks_end"] = sum(self.live_per_group[g] for g in sel)
            out["distinct_hashes"] = len(set().union(*(self.distinct[g] for g in sel)))
            return out

        by_kind = [
            {"kind": k, **agg(lambda kw, k=k: kw[0] == k), "peak_live_blocks": self.peak_kind[k]}
            for k in self.kinds
        ]
        by_window = [
            {
                "sliding_window": w,
                **agg(lambda kw, w=w: kw[1] == w),
                "peak_live_blocks": self.peak_win[w],
            }
            for w in self.windows
        ]
        totals = {**agg(lambda kw: True), "peak_live_blocks": self.peak_total}
        return {"totals": totals, "by_kind": by_kind, "by_window": by_window, "by_group": by_group}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default=None, help="output base name (default big<scale>)")
    ap.add_argument("--scale", type=float, default=1.0, help="1 = >= 1.2 M block events")
    ap.add_argument("--block-events", type=int, default=1_250_000, help="block events at scale 1")
    ap.add_argument("--model", choices=sorted(MODELS), default="gemma3")
    ap.add_argument("--layout", choices=["map", "array"], default="map")
    ap.add_argument("--hash", choices=["int", "bytes"], default="int", dest="hash_type")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--pool-blocks", type=int, default=12_000)
    ap.add_argument("--max-running", type=int, default=48)
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument("--prefixes", type=int, default=300)
    ap.add_argument("--reannounce", type=float, default=0.3)
    ap.add_argument("--partial", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=15.0, help="engine step duration")
    ap.add_argument("--no-frames", action="store_true", help="do not write NAME.frames")
    ap.add_argument("--outdir", type=Path, default=DATA)
    args = ap.parse_args(argv)
    name = args.name or f"big{args.scale:g}"
    args.outdir.mkdir(parents=True, exist_ok=True)
    mcap_path = args.outdir / f"{name}.mcap"
    frames_path = args.outdir / f"{name}.frames"
    truth_path = args.outdir / f"{name}.truth.json"
    for p in (mcap_path, frames_path, truth_path):
        if p.exists():
            p.unlink()
    target = int(args.block_events * args.scale)

    sim = Sim(args)
    truth = Truth(sim.groups)
    enc = msgspec.msgpack.Encoder()
    use_map = args.layout == "map"
    medium = "GPU"
    group_meta = [
        {"group_idx": g, "kind": k, "block_size": BLOCK, "sliding_window": w}
        for g, (k, w) in enumerate(sim.groups)
    ]
    hb = hash_bytes if args.hash_type == "bytes" else None

    def encode_event(ev: tuple[Any, ...]) -> Any:
        if ev[0] == "S":
            _, g, hashes, parent, tokens, bs = ev
            kind, win = sim.groups[g]
            if hb is not None:
                hashes = [hb(h) for h in hashes]
                parent = hb(parent) if parent is not None else None
            extra = [None] * len(hashes)
            cls = MapStored if use_map else ArrStored
            return cls(hashes, parent, tokens, bs, None, medium, None, extra, g, kind, win)
        if ev[0] == "R":
            _, g, h = ev
            cls2 = MapRemoved if use_map else ArrRemoved
            return cls2([hb(h) if hb is not None else h], medium, g)
        return MapCleared() if use_map else ArrCleared()

    t0 = time.time()
    ts0 = 1_767_225_600.0  # 2026-01-01, like the captures
    step = 0
    seq = 0
    payload_bytes = 0
    block_events = 0
    clear_at = target * 0.6
    cleared = False
    frames = None if args.no_frames else open(frames_path, "wb")  # noqa: SIM115
    writer = RecordingWriter(
        mcap_path,
        force=True,
        context={"generator": "bench/gen.py", "args": vars(args) | {"outdir": str(args.outdir)}},
    )
    try:
        ch = writer.add_channel(ENDPOINT, "", 0)
        writer.add_groups(group_meta, source="bench/gen.py")
        while block_events < target:
            sim.events = []
            if not cleared and block_events >= clear_at:
                sim.draining = True
                if not sim.running:
                    sim.clear()
                    cleared = True
                    sim.draining = False
            sim.step()
            step += 1
            if not sim.events:
                continue
            if step <= args.warmup_steps:
                seq += 1  # published before the recorder joined
                continue
            ts = ts0 + step * args.step_ms / 1000.0
            for ev in sim.events:
                truth.apply(ev)
                if ev[0] == "S":
                    block_events += len(ev[2])
                elif ev[0] == "R":
                    block_events += 1
            payload = enc.encode(Batch(ts, [encode_event(e) for e in sim.events], 0))
            payload_bytes += len(payload)
            truth.batches += 1
            log_time = int(ts * 1e9) + 350_000
            writer.write(ch, seq, payload, log_time, int(ts * 1e9))
            if frames is not None:
                frames.write(
                    struct.pack(">II", 3, 0)
                    + struct.pack(">I", 8)
                    + seq.to_bytes(8, "big")
                    + struct.pack(">I", len(payload))
                    + payload
                )
            seq += 1
    finally:
        writer.close()
        if frames is not None:
            frames.close()
    result = truth.result()
    result["generator"] = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "batches": truth.batches,
        "events": truth.events,
        "block_events": block_events,
        "payload_bytes": payload_bytes,
        "seq_first": seq - truth.batches,
        "seq_last": seq - 1,
        "group_metadata": group_meta,
        "mcap_bytes": os.path.getsize(mcap_path),
        "seconds": round(time.time() - t0, 1),
    }
    truth_path.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{mcap_path}: {truth.batches} batches, {truth.events} events, {block_events} block "
        f"events, {payload_bytes / 1e6:.1f} MB payload, {os.path.getsize(mcap_path) / 1e6:.1f}"
        f" MB file, {time.time() - t0:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
