"""The one flat columnar table of a recording: one row per block event, built chunk by chunk.

A chunk is decoded by the numba scanner (:mod:`kvtool.scan`) straight into columns; a
payload it refuses (an error code) takes the msgspec path, which stays the reference
(``decode_chunk(raw, decoder="msgspec")`` or ``KVTOOL_DECODER=msgspec`` take it alone):
both give the same rows and findings (tests/test_scan.py).

The package is cut along its jobs, each module importing only those above it:

- :mod:`~kvtool.columns.base`: the schema, the codes, :class:`ReadStats`, and the two
  forms of a chunk (:class:`RawChunk` read, :class:`DecodedChunk` decoded);
- :mod:`~kvtool.columns.hashes`: raw msgpack hash and token lists parsed with numpy;
- :mod:`~kvtool.columns.lean`: the msgspec path's lean decoder, a block of payloads at a
  time;
- :mod:`~kvtool.columns.build`: rows of the table from decoded columns;
- :mod:`~kvtool.columns.annotation`: kinds and windows for table chunks (the columnar
  adapter of :mod:`kvtool.annotate`);
- :mod:`~kvtool.columns.decode`: :func:`decode_chunk`, one chunk of payloads to rows;
- :mod:`~kvtool.columns.read`: recordings to table chunks, in stream order.

This module only gathers their public names (and the few private ones other modules and
tests read); nothing in the package imports it.

Rows (see :data:`TABLE_SCHEMA`): one per hash of a ``BlockStored`` or ``BlockRemoved``,
one per ``AllBlocksCleared``, and one (with a null ``hash``) per ``BlockStored`` with
zero hashes, so that such a store still counts as a store event and its tokens.
``tokens`` holds the event's ``len(token_ids)`` on its first row (``block_index`` 0)
and 0 on the others, so summing it counts every token once.
"""

from __future__ import annotations

try:  # numpy, as the modules below import it (report modules take it from here)
    import numpy as np
except ImportError:  # pragma: no cover - exercised by tests that hide numpy
    np = None  # type: ignore[assignment]

from kvtool.columns.annotation import (
    TableAnnotator,
    annotate_table,
    learn_table,
    make_annotator,
    recording_groups,
)
from kvtool.columns.annotation import (
    _annotate_dense as _annotate_dense,
)
from kvtool.columns.annotation import (
    _annotate_join as _annotate_join,
)
from kvtool.columns.annotation import (
    _annotation_rows as _annotation_rows,
)
from kvtool.columns.annotation import (
    _rank_expr as _rank_expr,
)
from kvtool.columns.base import (
    CLEARED,
    DEFAULT_CHUNK_BYTES,
    EVENT_TYPE,
    EXTRA_SCHEMA,
    NO_KEY,
    ORIGIN_CODES,
    REMOVED,
    STORED,
    TABLE_SCHEMA,
    UNANNOTATED,
    UNATTRIBUTED,
    ChannelRef,
    DecodedChunk,
    DecodeMap,
    MergeKey,
    Progress,
    RawChunk,
    ReadStats,
)
from kvtool.columns.build import _finish as _finish
from kvtool.columns.decode import DECODER_ENV, Decoder, decode_chunk
from kvtool.columns.hashes import hash_series, raw_hashes, raw_token_counts, token_counts
from kvtool.columns.lean import _LEAN_STRUCTS as _LEAN_STRUCTS
from kvtool.columns.lean import _VOCAB_STRUCTS as _VOCAB_STRUCTS
from kvtool.columns.lean import LeanBatch, decode_lean
from kvtool.columns.lean import _Removed as _Removed
from kvtool.columns.lean import _RemovedArrayLayout as _RemovedArrayLayout
from kvtool.columns.lean import _Stored as _Stored
from kvtool.columns.lean import _StoredArrayLayout as _StoredArrayLayout
from kvtool.columns.read import (
    add_decoded,
    empty_table,
    iter_annotated,
    iter_raw_chunks,
    iter_tables,
    prefetch,
    read_table,
)
from kvtool.errors import KvtoolError

__all__ = [
    "CLEARED",
    "DECODER_ENV",
    "DEFAULT_CHUNK_BYTES",
    "EVENT_TYPE",
    "EXTRA_SCHEMA",
    "NO_KEY",
    "ORIGIN_CODES",
    "REMOVED",
    "STORED",
    "TABLE_SCHEMA",
    "UNANNOTATED",
    "UNATTRIBUTED",
    "ChannelRef",
    "DecodeMap",
    "DecodedChunk",
    "Decoder",
    "KvtoolError",
    "LeanBatch",
    "MergeKey",
    "Progress",
    "RawChunk",
    "ReadStats",
    "TableAnnotator",
    "add_decoded",
    "annotate_table",
    "decode_chunk",
    "decode_lean",
    "empty_table",
    "hash_series",
    "iter_annotated",
    "iter_raw_chunks",
    "iter_tables",
    "learn_table",
    "make_annotator",
    "np",
    "prefetch",
    "raw_hashes",
    "raw_token_counts",
    "read_table",
    "recording_groups",
    "token_counts",
]
