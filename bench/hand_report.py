#!/usr/bin/env python3
# ruff: noqa
# Copied verbatim from the shared baseline bench/hand_report.py (the loop issue 10 measures against).
"""The hand-written baseline for `kvtool report`: what a user writes to get the same numbers.

Reads an MCAP recording (one message per vLLM batch, data = msgpack payload) with the `mcap`
package, decodes each batch into vLLM's full event structs with msgspec, and keeps, per
(kind, window), the multiset live state keyed by (group_idx, hash), peaks, re-stores, orphan
removes and store->remove lifetimes. Prints one JSON object. Timed as a whole process, like kvtool.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any, Optional, Union

import msgspec
from mcap.reader import make_reader
from mcap.stream_reader import StreamReader
from mcap.records import Message


class Ev(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class BlockStored(Ev):
    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Optional[Union[int, bytes]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str] = None
    extra_keys: Optional[list[Any]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class BlockRemoved(Ev):
    block_hashes: list[Union[int, bytes]]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(Ev):
    pass


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


def payloads(path: str):
    with open(path, "rb") as f:
        try:
            for _, _, m in make_reader(f).iter_messages(log_time_order=False):
                yield m.data
            return
        except Exception:
            pass
    with open(path, "rb") as f:
        for rec in StreamReader(f, skip_magic=False).records:
            if isinstance(rec, Message):
                yield rec.data


def main(path: str) -> None:
    dec = msgspec.msgpack.Decoder(Batch)
    groupkind: dict = {}
    live: dict = {}
    born: dict = {}
    lifetimes: dict = {}
    peak: dict = {}
    cur: dict = {}
    restored: dict = {}
    orphans: dict = {}
    stored: dict = {}
    removed: dict = {}
    for p in payloads(path):
        b = dec.decode(p)
        for e in b.events:
            if isinstance(e, BlockStored):
                k = (e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window)
                groupkind[e.group_idx] = k
                s = stored.setdefault(k, [0, 0, 0])
                s[0] += 1
                s[1] += len(e.block_hashes)
                s[2] += len(e.token_ids)
                for h in e.block_hashes:
                    key = (e.group_idx, h)
                    n = live.get(key, 0)
                    if n:
                        restored[k] = restored.get(k, 0) + 1
                    live[key] = n + 1
                    born.setdefault(key, []).append(b.ts)
                    c = cur[k] = cur.get(k, 0) + 1
                    if c > peak.get(k, 0):
                        peak[k] = c
            elif isinstance(e, BlockRemoved):
                k = groupkind.get(e.group_idx, ("unattributed", None))
                r = removed.setdefault(k, [0, 0])
                r[0] += 1
                r[1] += len(e.block_hashes)
                for h in e.block_hashes:
                    key = (e.group_idx, h)
                    n = live.get(key, 0)
                    if not n:
                        orphans[k] = orphans.get(k, 0) + 1
                        continue
                    live[key] = n - 1
                    lifetimes.setdefault(k, []).append(b.ts - born[key].pop(0))
                    cur[k] -= 1
            else:
                live.clear()
                born.clear()
                cur = {k: 0 for k in cur}
    q = {
        str(k): statistics.quantiles(v, n=100)[49] if len(v) > 1 else None
        for k, v in lifetimes.items()
    }
    print(
        json.dumps(
            {
                "live_end": sum(live.values()),
                "stored": {str(k): v for k, v in stored.items()},
                "removed": {str(k): v for k, v in removed.items()},
                "peak": {str(k): v for k, v in peak.items()},
                "restored": {str(k): v for k, v in restored.items()},
                "orphans": {str(k): v for k, v in orphans.items()},
                "p50": q,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
