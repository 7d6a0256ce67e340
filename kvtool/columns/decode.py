"""One chunk of payloads to table rows: :func:`decode_chunk` (pure; runs in any thread).

The numba scanner (:mod:`kvtool.scan`) reads the payloads into columns; a payload it
refuses takes the msgspec path (:mod:`kvtool.columns.lean`, the reference), so both give
the same rows and findings; ``KVTOOL_DECODER=msgspec`` takes the msgspec path alone.
"""

from __future__ import annotations

import itertools
import os
from typing import Literal

import polars as pl

try:  # optional: numpy makes the byte-level parsing of hashes and token counts faster
    import numpy as np
except ImportError:  # pragma: no cover - exercised by tests that hide numpy
    np = None  # type: ignore[assignment]
from kvtool.columns.annotation import _ANNOTATE_INPUT, annotate_table
from kvtool.columns.base import DecodedChunk, RawChunk, ReadStats
from kvtool.columns.build import _build, _Pending
from kvtool.columns.lean import _count_payload_ranks, _decode_block, _decode_each, _ranks

_BLOCK = 64
"""Payloads decoded and taken apart together: their event objects are still in the CPU
cache while their fields are read and when they are freed (a whole chunk's are not)."""

DECODER_ENV = "KVTOOL_DECODER"
"""``msgspec`` in the environment makes :func:`decode_chunk` take the msgspec path alone."""

Decoder = Literal["numba", "msgspec"]


def _use_numba(decoder: Decoder | None) -> bool:
    if decoder is None:
        decoder = "msgspec" if os.environ.get(DECODER_ENV) == "msgspec" else "numba"
    return decoder == "numba" and np is not None


def decode_chunk(raw: RawChunk, *, decoder: Decoder | None = None) -> DecodedChunk:
    """Decode one chunk of payloads into table rows (pure; runs in any process).

    The numba scanner (:mod:`kvtool.scan`) reads the payloads into columns; a payload it
    refuses goes through the msgspec path (:func:`decode_lean`, the reference), so both
    give the same rows and the same findings.

    Args:
        raw: The payloads.
        decoder: ``numba`` (the scanner, msgspec for what it refuses) or ``msgspec``
            alone; default: ``numba`` unless :data:`DECODER_ENV` says ``msgspec``.

    Returns:
        The rows, ``event_index`` counted from 0 within the chunk.
    """
    st = ReadStats()
    pending = _Pending(media=raw.keep is None or "medium" in raw.keep)
    n = len(raw.data)
    if not len(raw.log_time) == len(raw.seq) == len(raw.channel_id) == len(raw.dp_rank) == n:
        raise ValueError("RawChunk columns differ in length")
    if _use_numba(decoder) and n:
        _decode_scanned(raw, st, pending)
    else:
        for i in range(0, n, _BLOCK):
            pending.add(*_decode_block(raw, slice(i, i + _BLOCK), st))
    keep = raw.keep
    if keep is not None and raw.annotation is not None:
        keep = (*keep, *_ANNOTATE_INPUT)
    table = _build(pending, 0, st, keep, raw.streams) if len(pending) else pl.DataFrame()
    out_of_range: dict[int, int] | None = None
    if raw.annotation is not None:
        out_of_range = {}
        if table.height:
            table = annotate_table(table, raw.annotation, raw.channels or {}, out_of_range)
    if raw.keep is not None and table.width:
        table = table.select([c for c in table.columns if c in raw.keep])
    return DecodedChunk(
        table,
        st.events,
        st.rows,
        st.bad_batches,
        st.skipped_events,
        st.problems,
        st.unselected,
        out_of_range,
        st.problem_keys,
        st.payload_ranks,
        st.unknown_tags,
    )


def _decode_scanned(raw: RawChunk, st: ReadStats, pending: _Pending) -> None:
    """Decode a chunk with the numba scanner; payloads it refuses take the msgspec path.

    The chunk is cut into runs of payloads the scanner decoded (appended as columns),
    payloads ``--rank`` leaves out, and payloads it refused (:func:`_decode_each`), kept
    in stream order.
    """
    from kvtool import scan

    data = raw.data
    n = len(data)
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, data), dtype=np.int64, count=n), out=offs[1:])
    buf = np.frombuffer(b"".join(data), dtype=np.uint8)
    sc = scan.scan(buf, offs)
    ev_at = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.where(sc.err == 0, sc.n_events, 0), out=ev_at[1:])
    key_at_ev = np.zeros(len(sc.type_code) + 1, dtype=np.int64)
    np.cumsum(sc.n_hashes, out=key_at_ev[1:])
    key_at = key_at_ev[ev_at]
    own = [r if r >= 0 else None for r in sc.rank.tolist()]
    kept, differ = _ranks(own, raw.dp_rank)
    # Per payload: 0 decoded, 1 refused (msgspec decodes it), 2 left out by --rank.
    cat = (sc.err != 0).astype(np.int8)
    ranks = raw.ranks
    if ranks is not None:
        out = np.array([r not in ranks for r in kept], dtype=bool) & (cat == 0)
        st.unselected += int(out.sum())
        cat[out] = 2
    cuts = [0, *(np.flatnonzero(np.diff(cat)) + 1).tolist(), n]
    for a, b in itertools.pairwise(cuts):
        kind = cat[a]
        if kind == 0:
            pending.add_scanned(
                sc,
                slice(a, b),
                slice(int(ev_at[a]), int(ev_at[b])),
                slice(int(key_at[a]), int(key_at[b])),
                raw.log_time[a:b],
                raw.seq[a:b],
                raw.channel_id[a:b],
                kept[a:b],
                differ[a:b],
            )
            _count_payload_ranks(st, raw.channel_id[a:b], differ[a:b])
        elif kind == 1:
            for i in range(a, b, _BLOCK):
                pending.add(*_decode_each(raw, slice(i, min(b, i + _BLOCK)), st))
