"""The columnar msgpack decoder: a numba kernel scanning payload bytes into column arrays.

:func:`scan` reads one chunk's payloads (their bytes joined, with offsets) straight into
preallocated numpy columns -- per batch: ts, the payload's rank, event count, an error
code; per event: type, hash count, ``group_idx``, medium, kind, window, token count; all
the hash keys -- with no Python object per event. It accepts exactly what the lean
msgspec projection of :mod:`kvtool.columns` accepts *and* reads the same way; anything
else (a malformed, truncated or overlong value, an unknown tag, a value of an unexpected
type, nesting deeper than :data:`MAX_DEPTH`, a list that is not hashes, a mixture of
event encodings, an int outside int64 …) gives that payload an error code (``ERR_*``)
and the caller decodes it with the msgspec path, which stays the reference: so the two
give the same columns and the same findings. Every read is bounds-checked against the
payload's end; skipping is iterative with an explicit depth limit.

Strings (medium, kind) come back as codes into a small per-chunk vocabulary of byte
ranges (only ASCII values are taken, so they decode to the same ``str`` msgspec makes).
Field names and array positions come from the one field table, :mod:`kvtool.schema`.

The kernels (:mod:`kvtool.scankernel`) compile on first use (numba, cached on disk:
:mod:`kvtool._jit`); a kvtool command that compiles says so once on stderr
(:data:`kvtool._jit.COMPILE_NOTICE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtool._jit import COMPILE_NOTICE
from kvtool._msgpack import (  # the primitives and the error codes (re-exported)
    ERR_BATCH,
    ERR_CAPACITY,
    ERR_DEPTH,
    ERR_EVENTS,
    ERR_FIELD,
    ERR_HASHES,
    ERR_INVALID,
    ERR_KEY,
    ERR_MIXED,
    ERR_RANGE,
    ERR_RANK,
    ERR_TAG,
    ERR_TRAILING,
    ERR_TRUNCATED,
    ERR_TS,
    ERR_VOCAB,
    ERROR_NAMES,
    MAX_DEPTH,
    OK,
)
from kvtool.scankernel import MAX_VOCAB, N_CODES, NULL, _scan


@dataclass
class Scanned:
    """The columns of one scanned chunk (numpy arrays).

    Attributes:
        ts: Per payload: the batch ``ts``.
        rank: Per payload: the payload's ``data_parallel_rank`` (-1: none).
        err: Per payload: an error code (0: decoded here; else decode it with msgspec).
        n_events: Per payload: events.
        type_code: Per event: 0 stored, 1 removed, 2 cleared.
        n_hashes: Per event: hashes.
        group_idx: Per event (:data:`NULL`: nil or absent).
        medium: Per event: vocabulary code (-1: nil).
        kind: Per event: vocabulary code (-1: nil).
        window: Per event (:data:`NULL`: nil or absent).
        tokens: Per event: ``len(token_ids)``.
        parent: Per event: the key of ``parent_block_hash`` (0 where ``has_parent`` is 0).
        has_parent: Per event: 1 when ``parent_block_hash`` is a hash (int or bytes).
        origin: Per event: vocabulary code of ``origin`` (vllm-project/vllm#51699; -1: nil).
        block_size: Per event: ``block_size`` when it is an int (:data:`NULL`: anything else).
        keys: Every hash key, in event order.
        vocab: The strings of the codes.
    """

    ts: Any
    rank: Any
    err: Any
    n_events: Any
    type_code: Any
    n_hashes: Any
    group_idx: Any
    medium: Any
    kind: Any
    window: Any
    tokens: Any
    parent: Any
    has_parent: Any
    origin: Any
    block_size: Any
    keys: Any
    vocab: list[str]


_EVENT_DTYPES = (
    np.uint8,
    np.int64,
    np.int64,
    np.int32,
    np.int32,
    np.int64,
    np.int64,
    np.int64,
    np.uint8,
    np.int32,
    np.int64,
)


def scan(buf: Any, offs: Any) -> Scanned:
    """Scan joined payloads into columns (see the module docstring).

    Args:
        buf: The payloads' bytes joined (a uint8 numpy array).
        offs: int64 offsets: payload ``i`` is ``buf[offs[i]:offs[i+1]]``.

    Returns:
        The columns; payloads with ``err != 0`` have no events in them.
    """
    n_pay = len(offs) - 1
    size = int(offs[-1] - offs[0]) if n_pay > 0 else 0
    b_ts = np.zeros(n_pay, dtype=np.float64)
    b_rank = np.zeros(n_pay, dtype=np.int64)
    b_err = np.zeros(n_pay, dtype=np.int64)
    b_nev = np.zeros(n_pay, dtype=np.int64)
    # First guesses (real streams: ~160 bytes an event, ~95 a hash); full columns grow.
    ev_cap = max(16, size // 64)
    key_cap = max(16, size // 32)
    ev = [np.empty(ev_cap, dtype=t) for t in _EVENT_DTYPES]
    keys = np.empty(key_cap, dtype=np.int64)
    voc_off = np.zeros(MAX_VOCAB, dtype=np.int64)
    voc_len = np.zeros(MAX_VOCAB, dtype=np.int64)
    counts = np.zeros(3, dtype=np.int64)
    scratch = _scratch()
    at = 0
    while True:
        t, nh, g, med, kind, w, tok, par, has_par, org, bsz = ev
        at = _scan(
            buf, offs, at, b_ts, b_rank, b_err, b_nev, t, nh, g, med, kind, w, tok,
            par, has_par, org, bsz, keys, voc_off, voc_len, counts, *scratch,
        )  # fmt: skip
        if at >= n_pay:
            break
        # The columns were full at payload ``at``: grow and resume there.
        ev = [np.concatenate([a, np.empty(len(a), dtype=a.dtype)]) for a in ev]
        keys = np.concatenate([keys, np.empty(len(keys), dtype=np.int64)])
    n_ev, n_keys, n_voc = (int(x) for x in counts)
    vocab = [
        bytes(buf[int(o) : int(o) + int(n)]).decode("ascii")
        for o, n in zip(voc_off[:n_voc], voc_len[:n_voc], strict=True)
    ]
    t, nh, g, med, kind, w, tok, par, has_par, org, bsz = (a[:n_ev] for a in ev)
    return Scanned(
        b_ts, b_rank, b_err, b_nev, t, nh, g, med, kind, w, tok, par, has_par, org, bsz,
        keys[:n_keys], vocab,
    )  # fmt: skip


def _scratch() -> tuple[Any, ...]:
    """The kernel's scratch arrays: depth stack, field and batch positions, float bytes."""
    s8 = np.zeros(8, dtype=np.uint8)
    s4 = np.zeros(4, dtype=np.uint8)
    return (
        np.zeros(MAX_DEPTH, dtype=np.int64),
        np.zeros(N_CODES, dtype=np.int64),
        np.zeros(3, dtype=np.int64),
        s8,
        s4,
        s8.view(np.float64),
        s4.view(np.float32),
    )


__all__ = [
    "COMPILE_NOTICE",
    "ERROR_NAMES",
    "ERR_BATCH",
    "ERR_CAPACITY",
    "ERR_DEPTH",
    "ERR_EVENTS",
    "ERR_FIELD",
    "ERR_HASHES",
    "ERR_INVALID",
    "ERR_KEY",
    "ERR_MIXED",
    "ERR_RANGE",
    "ERR_RANK",
    "ERR_TAG",
    "ERR_TRAILING",
    "ERR_TRUNCATED",
    "ERR_TS",
    "ERR_VOCAB",
    "MAX_DEPTH",
    "MAX_VOCAB",
    "NULL",
    "OK",
    "Scanned",
    "scan",
]
