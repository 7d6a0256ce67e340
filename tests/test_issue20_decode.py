"""Issues 20/19 (one decoder): the what-if reads THE numba scanner's columns
(:func:`kvtool.scan.scan`, parents and block sizes too) off the report's own read, and
gets what its msgspec reference (:mod:`kvtool.report.whatif.lean`) gets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtool.annotate import event_rank
from kvtool.columns import ReadStats, iter_raw_chunks
from kvtool.errors import ProtocolError
from kvtool.recording.format import channel_topic
from kvtool.report import build_report
from kvtool.report.whatif import PoolFeed, lean
from kvtool.report.whatif.extract import PoolStream, _Columns, extract_pools, input_annotation

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = [
    *sorted((ROOT / "recordings").glob("*.mcap")),
    *sorted((ROOT / "tests" / "data" / "whatif").glob("*/*.mcap")),
]


def _by_msgspec(path: Path, chunk_bytes: int) -> list[PoolStream]:
    """The reference: every payload through the msgspec lean decoder, batch by batch."""
    cols: dict[tuple[str, int | None], _Columns] = {}
    for raw in iter_raw_chunks([path], stats=ReadStats(), chunk_bytes=chunk_bytes):
        for i, data in enumerate(raw.data):
            try:
                rank, events = lean.decode(bytes(data), raw.seq[i])
            except ProtocolError:
                continue
            endpoint, topic = raw.streams[raw.channel_id[i]]
            key = (channel_topic(endpoint, topic), event_rank(raw.dp_rank[i], rank))
            c = cols.get(key) or cols.setdefault(key, _Columns(*key))
            c.batch(raw.seq[i], events)
    ann = input_annotation([path])
    return [c.finish(ann.rule(c.channel, c.rank)) for c in cols.values()]


def _same(a: list[PoolStream], b: list[PoolStream]) -> None:
    assert [(p.channel, p.rank, p.n_keys, p.batches) for p in a] == [
        (p.channel, p.rank, p.n_keys, p.batches) for p in b
    ]
    for pa, pb in zip(a, b, strict=True):
        assert pa.groups == pb.groups
        assert pa.seq_regressions == pb.seq_regressions
        for name in pa.arrays:
            assert np.array_equal(pa.arrays[name], pb.arrays[name]), name


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_numba_decoder_gives_the_msgspec_arrays(path: Path) -> None:
    for chunk_bytes in (1 << 24, 4096):
        _same(extract_pools([path], chunk_bytes=chunk_bytes), _by_msgspec(path, chunk_bytes))


def test_the_reports_own_read_feeds_the_what_if() -> None:
    path = ROOT / "recordings" / "gemma3.mcap"
    feed = PoolFeed()
    build_report([str(path)], raw_tap=feed)
    assert feed.chunks > 0
    _same(feed.finish(input_annotation([path])), extract_pools([path]))


def test_malformed_and_restarted_streams_take_the_msgspec_path(tmp_path: Path) -> None:
    import msgspec

    from kvtool.recording import RecordingWriter
    from tests.test_report import removed, stored

    enc = msgspec.msgpack.Encoder()
    fa = {"group": 0, "kind": "full_attention"}
    payloads = [
        (0, enc.encode([1.0, [stored([1, 2, 3], **fa)], 0])),
        (1, b"\xc1not a batch"),  # undecodable: skipped by both paths
        (2, enc.encode([2.0, [removed([3], 0), {"type": "BlockInactive"}], 0])),  # unknown tag
        (3, enc.encode({"ts": 3.0, "events": [stored([3], **fa)], "data_parallel_rank": 0})),
        (1, enc.encode([4.0, [stored([1], **fa)], 0])),  # restart
    ]
    path = tmp_path / "odd.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for i, (seq, data) in enumerate(payloads):
            w.write(ch, seq, data, log_time=1_000_000_000 * (i + 1))
    got = extract_pools([path])
    _same(got, _by_msgspec(path, 1 << 24))
    assert got[0].seq_regressions == 1


def _feed_raw(datas: list[bytes]) -> tuple[list[PoolStream], list[PoolStream]]:
    """The same payloads through the numba feed and through msgspec one by one."""
    from kvtool.columns import RawChunk

    n = len(datas)
    raw = RawChunk(
        log_time=list(range(n)),
        seq=list(range(n)),
        channel_id=[0] * n,
        dp_rank=[0] * n,
        data=datas,
        streams={0: ("tcp://127.0.0.1:5557", "")},
    )
    feed = PoolFeed()
    feed(raw)
    ref = _Columns("tcp://127.0.0.1:5557", 0)
    for i, d in enumerate(datas):
        try:
            _rank, events = lean.decode(d, i)
        except ProtocolError:
            continue
        ref.batch(i, events)
    ann = input_annotation([ROOT / "recordings" / "gemma3.mcap"])
    got = feed.finish(ann)
    want = [ref.finish(ann.rule(ref.channel, ref.rank))] if ref.batches else []
    return got, want


def test_mutated_payloads_decode_as_msgspec_decodes_them() -> None:
    import random

    from kvtool.recording import open_recording

    with open_recording(ROOT / "recordings" / "gemma3.mcap") as r:
        payloads = [m.data for m in r.messages()][:40]
    rng = random.Random(20)
    for _ in range(60):
        datas = []
        for p in payloads:
            b = bytearray(p)
            what = rng.random()
            if what < 0.3 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)  # one byte changed
            elif what < 0.4 and b:
                del b[rng.randrange(len(b)) :]  # truncated
            datas.append(bytes(b))
        got, want = _feed_raw(datas)
        _same(got, want)


def test_odd_parents_and_block_sizes_decode_as_msgspec_decodes_them() -> None:
    import msgspec

    enc = msgspec.msgpack.Encoder()
    odd: list[object] = [None, "x", True, -3, 1 << 63, -(1 << 63), 1.5, [1], 0, 7, 1 << 40]
    datas = []
    for i, v in enumerate(odd):
        events = [
            {"type": "BlockStored", "block_hashes": [10 * i + 1], "parent_block_hash": v,
             "token_ids": [0] * 16, "block_size": v, "group_idx": 0,
             "kv_cache_spec_kind": "full_attention"},
            {"type": "BlockStored", "block_hashes": [10 * i + 2], "parent_block_hash": 10 * i + 1,
             "token_ids": [0] * 16, "block_size": 16 if i % 2 else v, "group_idx": 0},
        ]  # fmt: skip
        datas.append(enc.encode([float(i), events, 0]))
    got, want = _feed_raw(datas)
    assert got
    _same(got, want)
