"""Issue 10: the block-wise lean decode gives the same table whichever path a block takes."""

from __future__ import annotations

import dataclasses

import msgspec
import polars as pl
import pytest

from kvtool import columns
from kvtool.columns import DecodedChunk, RawChunk, decode, decode_chunk, lean, raw_hashes
from kvtool.protocol import hash_key
from tests.conftest import CAPTURES, capture_messages

ENC = msgspec.msgpack.Encoder()


def _chunk(payloads: list[bytes], ranks: frozenset[int | None] | None = None) -> RawChunk:
    n = len(payloads)
    return RawChunk(
        log_time=[10**9 + i for i in range(n)],
        seq=list(range(n)),
        channel_id=[i % 2 for i in range(n)],
        dp_rank=[None if i % 3 == 0 else i % 2 for i in range(n)],
        data=payloads,
        where={0: "a.mcap: ch0", 1: "a.mcap: ch1"},
        ranks=ranks,
    )


def _store(hashes: object, **kw: object) -> dict[str, object]:
    ev: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(16 * len(hashes))) if isinstance(hashes, list) else [],
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    ev.update(kw)
    return ev


def _remove(hashes: list[object], **kw: object) -> dict[str, object]:
    ev: dict[str, object] = {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
    ev.update(kw)
    return ev


def _same(a: DecodedChunk, b: DecodedChunk) -> None:
    assert a.table.schema == b.table.schema
    assert a.table.equals(b.table)
    assert (a.events, a.rows, a.bad_batches, a.skipped_events, a.unselected) == (
        b.events,
        b.rows,
        b.bad_batches,
        b.skipped_events,
        b.unselected,
    )
    assert a.problems == b.problems


def with_extras(raw: RawChunk) -> RawChunk:
    """``raw`` asking for every column, those made only on request (issue 21) too."""
    cols = [c for c in columns.TABLE_SCHEMA if c not in ("recording", "channel", "type")]
    return dataclasses.replace(raw, keep=(*cols, "type_code", *columns.EXTRA_SCHEMA))


def _paths(raw: RawChunk, monkeypatch: pytest.MonkeyPatch) -> list[DecodedChunk]:
    """The chunk decoded by each path: the numba scanner (issue 19), then msgspec's:
    vocabulary, str decoder, payload by payload, tiny blocks (every column, the ones made
    only on request too)."""
    raw = with_extras(raw) if raw.keep is None else raw
    out = [decode_chunk(raw, decoder="msgspec"), decode_chunk(raw, decoder="numba")]
    with monkeypatch.context() as m:
        m.setattr(lean, "_vocab_skip", [10**9])
        out.append(decode_chunk(raw, decoder="msgspec"))
    with monkeypatch.context() as m:
        m.setattr(lean._VOCAB, "decode_all", lambda _raws: None)
        m.setattr(lean._LEAN, "decode_all", lambda _raws: None)
        out.append(decode_chunk(raw, decoder="msgspec"))
    with monkeypatch.context() as m:
        m.setattr(decode, "_BLOCK", 3)
        out.append(decode_chunk(raw, decoder="msgspec"))
        out.append(decode_chunk(raw, decoder="numba"))  # its refused payloads in tiny blocks
    return out


@pytest.mark.parametrize("name", CAPTURES)
def test_issue10_decode_paths_agree_on_every_capture(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = [p for _t, _s, p in capture_messages(name)]
    for raw in (_chunk(payloads), _chunk(payloads, frozenset({0, None}))):
        first, *others = _paths(raw, monkeypatch)
        assert first.events > 0
        for other in others:
            _same(first, other)


def test_issue10_decode_unknown_medium_and_kind_keep_their_strings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = ENC.encode([1.0, [_store([1], group_idx=0, kv_cache_spec_kind="mamba")], 0])
    odd = ENC.encode(
        [2.0, [_store([2], medium="NVME", kv_cache_spec_kind="new_kind"), _remove([2])], 0]
    )
    monkeypatch.setattr(decode, "_BLOCK", 1)
    monkeypatch.setattr(lean, "_vocab_skip", [0])
    d = decode_chunk(_chunk([known, odd, known]), decoder="msgspec")
    want = [(1, "GPU", "mamba"), (2, "NVME", "new_kind"), (2, "GPU", None), (1, "GPU", "mamba")]
    assert d.table.select("hash", "medium", "kind").rows() == want
    assert lean._vocab_skip[0] == lean._VOCAB_BACKOFF - 1  # backs off, then retries
    d = decode_chunk(_chunk([known, odd, known]), decoder="numba")
    assert d.table.select("hash", "medium", "kind").rows() == want


def test_issue10_decode_block_size_is_an_int64_or_null(monkeypatch: pytest.MonkeyPatch) -> None:
    odd: list[object] = [16, None, "16", True, -3, 1 << 63, -(1 << 63), 300, 1.5, [16]]
    stores = [_store([i + 1], block_size=v) for i, v in enumerate(odd)]
    raw = _chunk([ENC.encode([1.0, [*stores, _remove([1])], 0])])
    first, *others = _paths(raw, monkeypatch)
    for other in others:
        _same(first, other)
    want = [16, None, None, None, -3, None, -(1 << 63), 300, None, None, None]
    assert first.table["block_size"].to_list() == want
    assert "block_size" not in decode_chunk(dataclasses.replace(raw, keep=None)).table.columns


def test_issue10_decode_bad_input_inside_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    good = ENC.encode([1.0, [_store([1, 2]), _remove([1], group_idx=3)], 0])
    mixed = ENC.encode(
        [2.0, [_store([3]), {"type": "BlockMoved", "x": 1}, _store([4], medium=7)], 1]
    )
    bad_hashes = ENC.encode([3.0, [_store("nope"), _store([5]), {"type": "AllBlocksCleared"}], 1])
    zero = ENC.encode([4.0, [_store([], token_ids=[1, 2, 3]), _remove([])], None])
    payloads = [good, mixed, b"\xc1not msgpack", good, bad_hashes, b"", zero, good] * 3
    for ranks in (None, frozenset({0}), frozenset({1, None})):
        first, *others = _paths(_chunk(payloads, ranks), monkeypatch)
        for other in others:
            _same(first, other)
    d = decode_chunk(_chunk(payloads))
    assert d.bad_batches == 6
    assert d.skipped_events == 9  # per round: BlockMoved, medium=7, block_hashes "nope"
    assert any("block_hashes is not a list of hashes" in p for p in d.problems)
    # per round: the cleared event, the store and the remove without hashes
    assert d.table.filter(pl.col("hash").is_null()).height == 9


def test_issue10_decode_lists_that_only_fit_by_length_are_parsed_exactly() -> None:
    big = (1 << 64) - 5
    lists: list[list[object]] = [
        [big, 1 << 40, -(1 << 40)],  # 9-byte ints: read by stride
        [70000, b"\x02" * 11],  # 5 + 13 bytes: the length of two 9-byte ints, not them
        list(range(1 << 40, (1 << 40) + 20)),  # 3-byte header
        [],
    ]
    for chosen in (lists, [lists[0], lists[2], lists[3]], [[bytes(range(32))] * 2, []]):
        raws: list[object] = [msgspec.Raw(ENC.encode(x)) for x in chosen]
        n, keys, bad = raw_hashes(raws)
        assert bad == []
        assert n.to_list() == [len(x) for x in chosen]
        assert keys.to_list() == [hash_key(h) for x in chosen for h in x]  # type: ignore[arg-type]
