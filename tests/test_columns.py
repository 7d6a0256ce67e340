"""The flat columnar table: lean decoder vs the protocol decoder, rows, hashes, tokens."""

from __future__ import annotations

from pathlib import Path

import msgspec
import polars as pl
import pytest

from kvtool import columns
from kvtool.columns import (
    TABLE_SCHEMA,
    ReadStats,
    decode_lean,
    hash_series,
    raw_hashes,
    raw_token_counts,
    read_table,
    token_counts,
)
from kvtool.protocol import decode_batch, event_type, hash_key
from kvtool.recording import RecordingWriter
from tests.conftest import CAPTURES, capture_messages, capture_truth

ENC = msgspec.msgpack.Encoder()
_TYPES = {"BlockStored": 0, "BlockRemoved": 1, "AllBlocksCleared": 2}


def _lean_views(events: list) -> list[tuple]:
    """What the table takes from lean events (hashes and tokens decoded in bulk)."""
    toks = raw_token_counts([e.token_ids for e in events]).to_list()
    n, keys, bad = raw_hashes([e.block_hashes for e in events])
    assert not bad
    flat = keys.to_list()
    out = []
    pos = 0
    for e, k, t in zip(events, n.to_list(), toks, strict=True):
        out.append(
            (
                type(e).__struct_config__.tag,
                flat[pos : pos + k],
                t,
                e.medium,
                e.group_idx,
                e.kv_cache_spec_kind,
                e.kv_cache_spec_sliding_window,
            )
        )
        pos += k
    return out


def _full_view(ev: object) -> tuple:
    t = event_type(ev)  # type: ignore[arg-type]
    if t == "AllBlocksCleared":
        return (t, [], 0, None, None, None, None)
    return (
        t,
        [hash_key(h) for h in ev.block_hashes],  # type: ignore[attr-defined]
        len(getattr(ev, "token_ids", [])),
        ev.medium,  # type: ignore[attr-defined]
        ev.group_idx,  # type: ignore[attr-defined]
        getattr(ev, "kv_cache_spec_kind", None),
        getattr(ev, "kv_cache_spec_sliding_window", None),
    )


@pytest.mark.parametrize("name", CAPTURES)
def test_lean_decoder_agrees_with_protocol(name: str) -> None:
    for _t, seq, payload in capture_messages(name):
        lean = decode_lean(payload, seq=seq)
        full = decode_batch(payload, seq=seq)
        assert lean.ts == full.ts
        assert lean.data_parallel_rank == full.data_parallel_rank
        assert _lean_views(lean.events) == [_full_view(e) for e in full.events]


def _record(path: Path, payloads: list[bytes]) -> Path:
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 3)
        for seq, p in enumerate(payloads):
            w.write(ch, seq, p, log_time=10**9 + seq)
    return path


@pytest.mark.parametrize("name", CAPTURES)
def test_table_rows_of_every_capture(name: str, tmp_path: Path) -> None:
    msgs = capture_messages(name)
    rec = _record(tmp_path / "r.mcap", [p for _t, _s, p in msgs])
    stats = ReadStats()
    df = read_table([rec], stats=stats)
    truth = capture_truth(name)
    assert df.schema == {**TABLE_SCHEMA, "type_code": pl.UInt8()}
    events = [e for _t, s, p in msgs for e in decode_batch(p, seq=s).events]
    assert stats.events == len(events) == truth["num_events"]
    assert df.height == sum(max(1, len(getattr(e, "block_hashes", []))) for e in events)
    stores = df.filter(pl.col("type") == "BlockStored")
    assert stores["tokens"].sum() == truth["block_stored"]["total"]["tokens"]
    assert stores["hash"].null_count() == truth["block_stored"]["events_with_zero_block_hashes"]
    assert stores.height == truth["block_stored"]["total"]["blocks"] + stores["hash"].null_count()
    want = [hash_key(h) for e in events for h in getattr(e, "block_hashes", [])]
    assert df["hash"].drop_nulls().to_list() == want
    assert df["event_index"].n_unique() == len(events)
    # Issue 24: the channel's rank (3) is every row's; a payload naming 0 keeps it aside.
    assert (df["dp_rank"] == 3).all()
    named = truth["wire"]["data_parallel_rank"]
    assert df["payload_rank"].to_list() == [named if named not in (None, 3) else None] * df.height
    if named not in (None, 3):
        assert stats.payload_ranks == {(0, named): len(msgs)}
        (line,) = stats.rank_findings()
        assert "is data-parallel rank 3" in line and f"data_parallel_rank {named} in " in line
    assert df.filter(pl.col("type") == "AllBlocksCleared").height == truth["all_blocks_cleared"]
    assert df["seq"].to_list() == sorted(df["seq"].to_list())


def test_hash_series_every_hash_type() -> None:
    big = (1 << 64) - 5
    assert hash_series([big, 7]).to_list() == [hash_key(big), 7]
    assert hash_series([-3, 7]).to_list() == [-3, 7]
    raw = bytes(range(32))
    assert hash_series([raw, b"\xff" * 32]).to_list() == [hash_key(raw), -1]
    mixed = [big, -1, raw, b"\x01\x02"]
    assert hash_series(mixed).to_list() == [hash_key(h) for h in mixed]
    assert hash_series([]).dtype == pl.Int64


def test_token_counts_read_the_msgpack_header() -> None:
    lists = [[], list(range(15)), list(range(16)), list(range(70000))]
    raws = [ENC.encode(x) for x in lists] + [ENC.encode(None), ENC.encode([[1, 2], [3, 4]])]
    assert token_counts(raws).to_list() == [0, 15, 16, 70000, 0, 2]
    assert raw_token_counts([msgspec.Raw(r) for r in raws]).to_list() == [0, 15, 16, 70000, 0, 2]


@pytest.mark.parametrize("numpy", [True, False])
def test_raw_hashes_every_encoding(numpy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not numpy:
        monkeypatch.setattr(columns.hashes, "np", None)
    big = (1 << 64) - 5
    lists = [
        [big, 1 << 40],  # uint64: 0xcf, vectorised
        [-(1 << 40), 1 << 50],  # int64 and uint64 mixed: 9 bytes each, vectorised
        [bytes(range(32))] * 3,  # 32-byte hashes, vectorised
        [],
        [5, -3, 300, 1 << 20],  # small ints: msgspec path
        [b"\x01\x02", big],  # short bytes and ints: msgspec path
        list(range(1 << 40, (1 << 40) + 20)),  # 0xdc header (>= 16 elements)
    ]
    raws = [msgspec.Raw(ENC.encode(x)) for x in lists] + [msgspec.Raw(ENC.encode("nope"))]
    n, keys, bad = raw_hashes(raws)
    assert bad == [7]
    assert n.to_list()[:7] == [len(x) for x in lists]
    assert keys.to_list() == [hash_key(h) for x in lists for h in x]
    toks = [msgspec.Raw(ENC.encode(x)) for x in ([], list(range(20)), None)]
    assert raw_token_counts(toks).to_list() == [0, 20, 0]


def _store_map(hashes, **kw):
    ev = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    ev.update(kw)
    return ev


def test_zero_hash_store_is_one_row(tmp_path: Path) -> None:
    rec = _record(
        tmp_path / "r.mcap",
        [
            ENC.encode(
                [
                    1.0,
                    [
                        _store_map(
                            [], token_ids=[1, 2, 3], group_idx=1, kv_cache_spec_kind="mamba"
                        ),
                        _store_map([5, 6], group_idx=0),
                    ],
                    0,
                ]
            )
        ],
    )
    df = read_table([rec])
    assert df.select("hash", "tokens", "block_index", "block_count", "kind").rows() == [
        (None, 3, 0, 0, "mamba"),
        (5, 32, 0, 2, None),
        (6, 0, 1, 2, None),
    ]


@pytest.mark.parametrize("length", [6, 7, 8, 9, 10, 12])
def test_every_array_layout(length: int, tmp_path: Path) -> None:
    fields = [
        "BlockStored",
        [11, 12],
        None,
        list(range(20)),
        16,
        None,
        "CPU",
        None,
        None,
        2,
        "sliding_window",
        128,
    ]
    removed = ["BlockRemoved", [11], "CPU", 2][: {6: 2, 7: 3, 8: 3, 9: 3, 10: 4, 12: 4}[length]]
    payload = ENC.encode([2.5, [fields[:length], removed, ["AllBlocksCleared"]]])
    lean = decode_lean(payload)
    full = decode_batch(payload)
    assert _lean_views(lean.events) == [_full_view(e) for e in full.events]
    rec = _record(tmp_path / "r.mcap", [payload])
    df = read_table([rec])
    assert df["type"].to_list() == [
        "BlockStored",
        "BlockStored",
        "BlockRemoved",
        "AllBlocksCleared",
    ]
    assert df["tokens"].to_list() == [20, 0, 0, 0]
    assert df["medium"][0] == ("CPU" if length >= 7 else None)
    assert df["group_idx"][0] == (2 if length >= 10 else None)
    assert df["kind"][0] == ("sliding_window" if length >= 12 else None)
    assert df["dp_rank"][0] == 3  # the batch names none: the channel's rank


def test_map_batch_and_bytes_hashes(tmp_path: Path) -> None:
    payload = ENC.encode(
        {
            "ts": 3.0,
            "events": [_store_map([b"\x00" * 24 + b"\x00" * 7 + b"\x09"])],
            "data_parallel_rank": 5,
        }
    )
    rec = _record(tmp_path / "r.mcap", [payload])
    df = read_table([rec])
    # Issue 24: the channel's rank (3), not the payload's (5), which is kept aside.
    assert df.select("hash", "dp_rank", "payload_rank", "ts").rows() == [(9, 3, 5, 3.0)]


def test_bad_event_and_bad_payload_are_skipped_and_counted(tmp_path: Path) -> None:
    good = ENC.encode([1.0, [_store_map([1])], 0])
    mixed = ENC.encode(
        [2.0, [_store_map([2]), {"type": "BlockMoved", "x": 1}, _store_map([3], medium=7)], 0]
    )
    garbage = b"\xc1not msgpack"
    rec = _record(tmp_path / "r.mcap", [good, mixed, garbage, good])
    stats = ReadStats()
    df = read_table([rec], stats=stats)
    assert df["hash"].to_list() == [1, 2, 1]
    assert stats.skipped_events == 2
    assert stats.bad_batches == 1
    assert any("unknown event type 'BlockMoved'" in p for p in stats.problems)
    assert any("seq 2" in p for p in stats.problems)
