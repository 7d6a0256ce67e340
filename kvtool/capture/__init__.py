"""Live capture: subscribe to vLLM KV-event publishers and record them, recovering gaps.

``recorder`` owns the sockets and the poll loop; ``sequencer`` holds the pure, socket-free
per-channel decisions (restart or stray, which replies to accept). Every public name
the rest of kvtool used from the old ``kvtool.capture`` module is re-exported here.
"""

from __future__ import annotations

from kvtool.capture.recorder import (
    DEFAULT_QUIET_NS,
    DEFAULT_REPLAY_TIMEOUT_NS,
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
