"""Live capture: subscribe to vLLM KV-event publishers and record them, recovering gaps.

``recorder`` owns the sockets, the poll loop and the writer; ``sequencer`` holds every
seq decision, pure and socket-free (gaps, replay requests, restarts, strays, which
replies to accept, what is lost), answering with actions the recorder carries out. Every public name
the rest of kvtool used from the old ``kvtool.capture`` module is re-exported here.
"""

from __future__ import annotations

from kvtool.capture.recorder import (
    END_SEQ,
    LEDGER_LIST_CAP,
    MAX_HELD_BYTES,
    MEMORY_BOUND_BYTES,
    CaptureResult,
    CaptureStats,
    ConnectTimeout,
    MetadataError,
    Recorder,
    Source,
    build_ledger,
    capture,
    expand_endpoints,
    load_groups,
    normalize_endpoint,
    offset_endpoint,
)
from kvtool.capture.sequencer import DEFAULT_QUIET_NS, DEFAULT_REPLAY_TIMEOUT_NS

__all__ = [
    "DEFAULT_QUIET_NS",
    "DEFAULT_REPLAY_TIMEOUT_NS",
    "END_SEQ",
    "LEDGER_LIST_CAP",
    "MAX_HELD_BYTES",
    "MEMORY_BOUND_BYTES",
    "CaptureResult",
    "CaptureStats",
    "ConnectTimeout",
    "MetadataError",
    "Recorder",
    "Source",
    "build_ledger",
    "capture",
    "expand_endpoints",
    "load_groups",
    "normalize_endpoint",
    "offset_endpoint",
]
