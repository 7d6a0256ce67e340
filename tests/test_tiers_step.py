"""The numba tier-transition step equals the Python step it replaced, row for row.

``report --by medium``'s tier transitions were walked by a Python loop per block row
(kvtool/report/tiers.py before this change; kept here, verbatim, as
:class:`ReferenceTierSplit`). The step is now one numba loop (kvtool/report/tierstep.py).
Both run inside the real report (``build_report(split=["medium"])``) on real MCAP
recordings: random tiered streams (two channels; GPU, CPU, CPU_PINNED, STORAGE, DISK, an
unknown medium and none; grouped and ungrouped copies; evictions, clears, restarts;
small chunks so the state crosses chunks; a stream big enough to grow the step's
tables), and the sample recordings and SGLang captures. ``by_medium`` and
``tier_transitions`` must be identical.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pytest

import kvtool.report.run as run_mod
from kvtool.annotate import kind_label
from kvtool.columns import CLEARED, REMOVED, STORED
from kvtool.recording import RecordingWriter
from kvtool.report import attribution, build_report, kernel
from kvtool.report.builder import ReportBuilder
from kvtool.report.tiers import _NULL, TIER_RANKS, TierSplit, _medium
from tests.recutil import BASE_NS, STEP_NS, write_capture

NDArray = np.ndarray
_ADDED = (kernel.FIRST, kernel.WHILE_LIVE, kernel.RECOMPUTED)
_NEW_HERE = (kernel.FIRST, kernel.RECOMPUTED)
_Copy = tuple[str, "int | None"]


def _same_group(a: int | None, b: int | None) -> bool:
    return a is None or b is None or a == b


def _nearest(target: str | None, candidates: list[str | None]) -> str | None:
    """The candidate medium nearest ``target``'s tier (ties: the higher tier, then name)."""
    t = TIER_RANKS.get(target) if target is not None else None

    def key(m: str | None) -> tuple[int, int, str]:
        r = TIER_RANKS.get(m) if m is not None else None
        if r is None or t is None:
            return (99, 99, m or "")
        return (abs(r - t), r, m or "")

    return min(candidates, key=key)


class ReferenceTierSplit(TierSplit):
    """The Python step this branch replaced (main at 191f4ca), verbatim: the reference."""

    def __init__(self, group_kind: attribution.GroupKind | None) -> None:
        self.group_kind = group_kind
        self.builders: dict[str, ReportBuilder] = {}
        # Per channel: the media seen; per active channel (two media or more), per hash
        # the live copies per (medium, group or None), and the (medium, group) whose last
        # copy of a hash went in the current batch (seq); the kind of each group's stores.
        self.media: dict[int, set[str]] = {}
        self.live: dict[int, dict[int, dict[_Copy, int]]] = {}
        self.gone: dict[int, tuple[int, dict[int, set[_Copy]]]] = {}
        self.last_seq: dict[int, int] = {}
        self.group_kinds: dict[tuple[int, int | None], str] = {}
        self.transitions: dict[tuple[str, str | None, str | None], int] = {}

    def add(self, df: pl.DataFrame) -> None:
        """Feed one annotated chunk (with its ``medium`` column), in stream order.

        Args:
            df: The chunk (:func:`kvtool.report.run.run_builder`'s, ``medium`` kept).
        """
        if df.height == 0:
            return
        tc = df["type_code"].to_numpy()
        is_clear = tc == CLEARED
        med = df["medium"].fill_null(_NULL)
        chan = np.asarray(df["channel_id"].to_numpy(), dtype=np.int64)
        blocks = pl.Series(~is_clear)
        if blocks.any():
            pairs = pl.DataFrame({"c": chan[~is_clear], "m": med.filter(blocks)}).unique()
            for c, m in pairs.iter_rows():
                self.media.setdefault(int(c), set()).add(m)
        for m in sorted(med.filter(blocks).unique().to_list()):
            if m not in self.builders:
                self.builders[m] = ReportBuilder(None, self.group_kind, media_apart=False)
        active = [c for c, ms in self.media.items() if len(ms) > 1]
        for c in active:
            if c not in self.live:
                self._seed(c)
        whats: dict[str, tuple[NDArray[Any], NDArray[Any]]] = {}
        med_np = med.to_numpy()
        for m, b in self.builders.items():
            mine = (med_np == m) | is_clear
            if not mine.any():
                continue
            b.add(df.filter(pl.Series(mine)))
            whats[m] = (np.flatnonzero(mine), b.row_what)
        if active:
            self._track(df, med_np, chan, tc, whats, set(active))

    def _seed(self, c: int) -> None:
        """Start tracking channel ``c`` from the media's kernels' live entries now."""
        live: dict[int, dict[_Copy, int]] = {}
        for m, b in self.builders.items():
            if c not in b._kchan:
                continue
            now = b._kchan[c]
            kchan, group, no_group, h, _ts, _gkey = b.kstate.live_entries()
            for k, g, ng, hh in zip(
                kchan.tolist(), group.tolist(), no_group.tolist(), h.tolist(), strict=True
            ):
                if k == now:
                    copies = live.setdefault(hh, {})
                    key = (m, None if ng else g)
                    copies[key] = copies.get(key, 0) + 1
        self.live[c] = live

    def _track(
        self,
        df: pl.DataFrame,
        med: NDArray[Any],
        chan: NDArray[Any],
        tc: NDArray[Any],
        whats: dict[str, tuple[NDArray[Any], NDArray[Any]]],
        active: set[int],
    ) -> None:
        """Walk the active channels' rows in stream order: liveness and transitions."""
        n = df.height
        what = np.zeros(n, dtype=np.int64)
        for m, (idx, w) in whats.items():
            sel = med[idx] == m  # a clear row is in every medium's part: keep its own
            what[idx[sel]] = w[sel]
        rows = np.flatnonzero(np.isin(chan, np.asarray(sorted(active), dtype=np.int64)))
        if not len(rows):
            return
        g_s, h_s = df["group_idx"], df["hash"]
        no_group = g_s.is_null().to_numpy()
        no_hash = h_s.is_null().to_numpy()
        group = np.asarray(g_s.fill_null(0).to_numpy(), dtype=np.int64)
        h = np.asarray(h_s.fill_null(0).to_numpy(), dtype=np.int64)
        seq = np.asarray(df["seq"].to_numpy(), dtype=np.int64)
        kinds = df["kind"].to_list()
        for i in rows.tolist():
            c = int(chan[i])
            s = int(seq[i])
            last = self.last_seq.get(c)
            self.last_seq[c] = s
            live = self.live[c]
            if last is not None and s < last:  # a publisher restart: a new cache
                live.clear()
            batch_seq, gone = self.gone.get(c, (s, {}))
            if batch_seq != s:
                gone = {}
            self.gone[c] = (s, gone)
            t = int(tc[i])
            if t == CLEARED:
                live.clear()
                gone.clear()
                continue
            if no_hash[i]:
                continue
            g = None if no_group[i] else int(group[i])
            m = str(med[i])
            hh = int(h[i])
            verdict = int(what[i])
            if t == STORED and verdict in _ADDED:
                if kinds[i] is not None and g is not None:
                    self.group_kinds[(c, g)] = kinds[i]
                copies = live.setdefault(hh, {})
                if verdict in _NEW_HERE:
                    # A copy elsewhere of the same group; an ungrouped side (an offloading
                    # connector's CPU events carry no group_idx) matches any group.
                    others = [k for k in copies if k[0] != m and _same_group(k[1], g)]
                    if not others:
                        others = [k for k in gone.get(hh, ()) if k[0] != m and _same_group(k[1], g)]
                    if others:
                        self._count(c, m, g, kinds[i], others)
                key = (m, g)
                copies[key] = copies.get(key, 0) + 1
            elif t == REMOVED and verdict == kernel.EVICTED:
                # Only media with live copies are kept: memory follows the live keys.
                held = live.get(hh)
                key = (m, g)
                if held is None or key not in held:
                    continue
                held[key] -= 1
                if held[key] <= 0:
                    del held[key]
                    if not held:
                        del live[hh]
                    gone.setdefault(hh, set()).add(key)

    def _count(self, c: int, m: str, g: int | None, kind: str | None, others: list[_Copy]) -> None:
        """Count one transition into ``m`` from the nearest medium of ``others``."""
        src = _nearest(_medium(m), [_medium(k[0]) for k in others])
        if kind is None:
            # An ungrouped store takes its source copies' kind when they agree on one.
            src_key = _NULL if src is None else src
            seen = {self.group_kinds.get((c, k[1])) for k in others if k[0] == src_key}
            seen.discard(None)
            kind = seen.pop() if len(seen) == 1 else None
        k = (kind_label(kind), src, _medium(m))
        self.transitions[k] = self.transitions.get(k, 0) + 1


# -- streams --------------------------------------------------------------------------------

TS = 1_767_225_600.0
MEDIA = ["GPU", "GPU", "CPU", "CPU_PINNED", "STORAGE", "DISK", "weird", None]
GROUPS: list[int | None] = [0, 1, None]


def _event(rng: np.random.Generator, pool: int) -> dict[str, object]:
    r = rng.random()
    hashes = [int(h) for h in rng.integers(1, pool + 1, size=int(rng.integers(1, 4)))]
    medium = MEDIA[int(rng.integers(len(MEDIA)))]
    group = GROUPS[int(rng.integers(len(GROUPS)))]
    if r < 0.02:
        return {"type": "AllBlocksCleared"}
    if r < 0.6:
        ev: dict[str, object] = {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": None,
            "token_ids": list(range(16 * len(hashes))),
            "block_size": 16,
            "lora_id": None,
            "medium": medium,
            "lora_name": None,
        }
        if group is not None:
            ev["group_idx"] = group
            if rng.random() < 0.8:  # some grouped stores carry no kind (learned or none)
                ev["kv_cache_spec_kind"] = "full_attention" if group == 0 else "sliding_window"
                if group == 1:
                    ev["kv_cache_spec_sliding_window"] = 64
        return ev
    ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group is not None:
        ev["group_idx"] = group
    return ev


def write_stream(path: Path, seed: int, *, batches: int = 120, pool: int = 24) -> Path:
    """A random tiered stream on two channels, with restarts (seq back to 0)."""
    rng = np.random.default_rng(seed)
    with RecordingWriter(path) as w:
        chans = [w.add_channel(f"tcp://127.0.0.1:{5557 + i}", "", i) for i in range(2)]
        seqs = [0, 0]
        for i in range(batches):
            k = int(rng.integers(2))
            if rng.random() < 0.03:
                seqs[k] = 0  # a publisher restart
            events = [_event(rng, pool) for _ in range(int(rng.integers(1, 5)))]
            payload = msgspec.msgpack.encode([TS + i * 0.01, events, k])
            w.write(chans[k], seqs[k], payload, BASE_NS + i * STEP_NS)
            seqs[k] += 1
    return path


def _tables(path: Path, *, reference: bool, chunk_bytes: int | None = None) -> dict[str, Any]:
    kw: dict[str, Any] = {"split": ["medium"]}
    if chunk_bytes is not None:
        kw["chunk_bytes"] = chunk_bytes
    saved = run_mod.TierSplit
    run_mod.TierSplit = ReferenceTierSplit if reference else TierSplit  # type: ignore[misc]
    try:
        rep = build_report([path], **kw)
    finally:
        run_mod.TierSplit = saved  # type: ignore[misc]
    assert rep.by_medium is not None and rep.tier_transitions is not None
    return {
        "by_medium": rep.by_medium.to_dicts(),
        "tier_transitions": rep.tier_transitions.to_dicts(),
        "findings": [str(f) for f in rep.findings],
    }


@pytest.mark.parametrize("seed", range(12))
def test_tiers_step_equals_the_python_step_on_random_streams(tmp_path: Path, seed: int) -> None:
    rec = write_stream(tmp_path / f"s{seed}.mcap", seed)
    want = _tables(rec, reference=True)
    assert want["tier_transitions"] or seed > 3  # the first streams do have transitions
    assert _tables(rec, reference=False) == want
    if seed % 3:
        return
    # The state carries across chunks (one batch or so per chunk) as the Python step's did
    # (every third stream: ~120 chunks a report are most of this test's time).
    small = _tables(rec, reference=True, chunk_bytes=256)
    assert _tables(rec, reference=False, chunk_bytes=256) == small


def test_tiers_step_grows_its_tables(tmp_path: Path) -> None:
    """Thousands of distinct keys: the key table and the node pool grow (and prune)."""
    rec = write_stream(tmp_path / "big.mcap", 99, batches=1500, pool=1500)
    want = _tables(rec, reference=True)
    assert sum(t["blocks"] for t in want["tier_transitions"]) > 50
    seen: list[TierSplit] = []

    class Watched(TierSplit):
        def __init__(self, group_kind: attribution.GroupKind | None) -> None:
            super().__init__(group_kind)
            seen.append(self)

    saved = run_mod.TierSplit
    run_mod.TierSplit = Watched  # type: ignore[misc]
    try:
        rep = build_report([rec], split=["medium"])
    finally:
        run_mod.TierSplit = saved  # type: ignore[misc]
    assert rep.tier_transitions is not None and rep.by_medium is not None
    assert rep.tier_transitions.to_dicts() == want["tier_transitions"]
    assert rep.by_medium.to_dicts() == want["by_medium"]
    (split,) = seen
    assert split.state is not None
    assert len(split.state.tab_c) > 1024 and len(split.state.node_m) > 1024  # grown
    small = _tables(rec, reference=True, chunk_bytes=4096)
    assert _tables(rec, reference=False, chunk_bytes=4096) == small


DATA = Path(__file__).parent / "data"


def _samples(tmp_path: Path) -> list[Path]:
    paths = [Path(p) for p in sorted(glob.glob(str(DATA / "**" / "*.mcap"), recursive=True))]
    for name in ("sglang_full", "sglang_swa", "gemma3"):
        p = tmp_path / f"{name}.mcap"
        write_capture(p, name)
        paths.append(p)
    return paths


def test_tiers_step_equals_the_python_step_on_samples_and_sglang(tmp_path: Path) -> None:
    for path in _samples(tmp_path):
        assert _tables(path, reference=False) == _tables(path, reference=True), path


def test_tiers_step_makes_no_python_object_per_row() -> None:
    """The per-row walk is the numba step: no Python loop over rows is left in tiers.py."""
    src = (Path(run_mod.__file__).parent / "tiers.py").read_text()
    assert ".tolist()" not in src.split("def _chan_index")[0]
    assert "for i in rows" not in src
    assert "to_list()" not in src.split("def _track")[1].split("def _count")[0]
