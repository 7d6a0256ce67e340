"""Issue 19: the numba columnar decoder (kvtool.scan) against the msgspec reference path.

Every comparison decodes the same chunk twice, ``decode_chunk(raw, decoder="numba")`` and
``decoder="msgspec"``, and asserts the same table and the same findings (counts and
problem messages): on every capture, on every sample recording, on hypothesis-generated
batches in every layout, and on truncated and byte-flipped payloads. Each error code the
scanner can return is reached by a payload of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtool import _jit, scan
from kvtool.columns import DecodedChunk, RawChunk, decode_chunk, iter_raw_chunks
from tests.conftest import CAPTURES, capture_messages
from tests.test_issue10_decode import _chunk, with_extras

ENC = msgspec.msgpack.Encoder()
ROOT = Path(__file__).parent.parent
RECORDINGS = sorted((ROOT / "recordings").glob("*.mcap")) + sorted(
    (ROOT / "tests" / "data" / "recordings").glob("*.mcap")
)


def _both(raw: RawChunk) -> tuple[DecodedChunk, DecodedChunk]:
    # Every column, the ones made only on request (parent, origin: issue 21; block_size)
    # included.
    if raw.keep is None:
        raw = with_extras(raw)
    return decode_chunk(raw, decoder="numba"), decode_chunk(raw, decoder="msgspec")


def _same(raw: RawChunk) -> DecodedChunk:
    a, b = _both(raw)
    assert a.table.schema == b.table.schema
    assert a.table.equals(b.table), (a.table, b.table)
    for f in ("events", "rows", "bad_batches", "skipped_events", "unselected", "problems"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.problem_keys == b.problem_keys
    return a


def _errors(payloads: list[bytes]) -> list[int]:
    buf = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    offs = np.zeros(len(payloads) + 1, dtype=np.int64)
    offs[1:] = np.cumsum([len(p) for p in payloads])
    return scan.scan(buf, offs).err.tolist()


@pytest.mark.parametrize("name", CAPTURES)
def test_issue19_every_capture_decodes_the_same_and_entirely_in_numba(name: str) -> None:
    payloads = [p for _t, _s, p in capture_messages(name)]
    assert _errors(payloads) == [0] * len(payloads)  # no payload of a real capture falls back
    got = _same(_chunk(payloads))
    assert got.events > 0 and got.table.height == got.rows
    _same(_chunk(payloads, ranks=frozenset({1})))


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_issue19_every_sample_recording_decodes_the_same(path: Path) -> None:
    chunks = list(iter_raw_chunks([path], chunk_bytes=1 << 16))
    assert chunks
    for raw in chunks:
        _same(raw)


# -- hypothesis: batches in every layout ------------------------------------------------------

_int64 = st.integers(-(1 << 63), (1 << 63) - 1)
_hash = st.one_of(
    st.integers(0, (1 << 64) - 1),
    _int64,
    st.integers(-40, 200),
    st.binary(min_size=0, max_size=40),
    st.binary(min_size=32, max_size=32),
)
_opt_int = st.one_of(st.none(), st.integers(-5, 300), _int64, st.integers(0, (1 << 64) - 1))
_str = st.sampled_from(["GPU", "CPU", "cpu", "full_attention", "sliding_window", "é", "x" * 40])
_opt_str = st.one_of(st.none(), _str)
_odd = st.one_of(
    st.none(),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.text(max_size=3),
    st.booleans(),
    st.floats(),
)


@st.composite
def _event(draw: st.DrawFn, encoding: str) -> object:
    tag = draw(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Moved"]))
    fields: dict[str, object] = {
        "block_hashes": draw(st.one_of(st.lists(_hash, max_size=6), _odd)),
        "parent_block_hash": draw(st.one_of(st.none(), _hash)),
        "token_ids": draw(st.one_of(st.lists(st.integers(0, 9), max_size=20), _odd)),
        "block_size": draw(st.one_of(st.just(16), _opt_int, _odd)),
        "lora_id": None,
        "medium": draw(st.one_of(_opt_str, _odd)),
        "lora_name": draw(st.one_of(st.none(), st.just({"cache_salt": "s"}))),
        "extra_keys": None,
        "group_idx": draw(st.one_of(_opt_int, _odd)),
        "kv_cache_spec_kind": draw(st.one_of(_opt_str, _odd)),
        "kv_cache_spec_sliding_window": draw(_opt_int),
    }
    if encoding == "array":
        order = {
            "BlockStored": list(fields),
            "BlockRemoved": ["block_hashes", "medium", "group_idx"],
        }.get(tag, [])
        length = draw(st.integers(0, len(order) + 2))
        values = [fields[k] for k in order] + [None, 7]
        return [tag, *values[:length]]
    keys = draw(st.lists(st.sampled_from([*fields, "locality", "x"]), unique=True, max_size=14))
    ev: dict[str, object] = {"type": tag} if draw(st.booleans()) or tag == "Moved" else {}
    for k in keys:
        ev[k] = fields.get(k, "LOCAL")
    if "type" not in ev and draw(st.booleans()):
        ev["type"] = tag  # the tag last
    return ev


@st.composite
def _payload(draw: st.DrawFn) -> bytes:
    enc = draw(st.sampled_from(["map", "array"]))
    events = draw(st.lists(_event(enc), max_size=5))
    if draw(st.integers(0, 9)) == 0:
        events.append(draw(_event("array" if enc == "map" else "map")))
    ts = draw(st.one_of(st.floats(allow_nan=False), st.integers(-(1 << 60), 1 << 60)))
    rank = draw(_opt_int)
    shape = draw(st.integers(0, 3))
    if shape == 0:
        obj: object = [ts, events]
    elif shape == 1:
        obj = [ts, events, rank]
    elif shape == 2:
        obj = [ts, events, rank, "extra"]
    else:
        obj = {"ts": ts, "events": events, "data_parallel_rank": rank, "other": 1}
    return ENC.encode(obj)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_payload(), min_size=1, max_size=8))
def test_issue19_generated_batches_decode_the_same(payloads: list[bytes]) -> None:
    _same(_chunk(payloads))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payload(), st.data())
def test_issue19_truncated_and_flipped_payloads_decode_the_same(
    payload: bytes, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(payload)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(payload) - 1), st.integers(0, 255))))
    flipped = bytearray(payload)
    for at, v in flips:
        flipped[at] = v
    _same(_chunk([payload[:cut], bytes(flipped), payload, payload + b"\x00"]))


def test_issue19_mutated_real_payloads_decode_the_same() -> None:
    payloads = [p for _t, _s, p in capture_messages("gemma3")][:20]
    rng = np.random.default_rng(19)
    mutated = []
    for p in payloads:
        b = bytearray(p)
        for at in rng.integers(0, len(b), size=3):
            b[int(at)] = int(rng.integers(0, 256))
        mutated += [bytes(b), p[: int(rng.integers(0, len(p)))]]
    _same(_chunk(mutated))


# -- every error code ---------------------------------------------------------------------------

_S = {"type": "BlockStored", "block_hashes": [1, 2], "token_ids": [1, 2, 3], "medium": "GPU"}
_DEEP = b"\x92\xcb" + bytes(8) + b"\x91\x82\xa4type\xabBlockStored\xa1x" + b"\x91" * 80 + b"\xc0"

ERROR_CASES = {
    scan.ERR_TRUNCATED: ENC.encode([1.0, [_S]])[:-3],
    scan.ERR_INVALID: ENC.encode([1.0, [{**_S, "x": None}]])[:-1] + b"\xc1",
    scan.ERR_DEPTH: _DEEP,
    scan.ERR_BATCH: ENC.encode([1.0]),
    scan.ERR_TRAILING: ENC.encode([1.0, [_S]]) + b"\xc0",
    scan.ERR_TS: ENC.encode(["now", [_S]]),
    scan.ERR_RANK: ENC.encode([1.0, [_S], -1]),
    scan.ERR_EVENTS: ENC.encode([1.0, [7]]),
    scan.ERR_MIXED: ENC.encode([1.0, [_S, ["AllBlocksCleared"]]]),
    scan.ERR_TAG: ENC.encode([1.0, [{**_S, "type": "BlockMoved"}]]),
    scan.ERR_KEY: ENC.encode([1.0, [{**_S, "é": 1}]]),
    scan.ERR_HASHES: ENC.encode([1.0, [{**_S, "block_hashes": [1, None]}]]),
    scan.ERR_FIELD: ENC.encode([1.0, [{**_S, "medium": 7}]]),
    scan.ERR_RANGE: ENC.encode([1.0, [{**_S, "group_idx": 1 << 63}]]),
}


@pytest.mark.parametrize("code", sorted(ERROR_CASES), ids=lambda c: scan.ERROR_NAMES[c])
def test_issue19_every_error_code_falls_back_to_msgspec(code: int) -> None:
    good = ENC.encode([0.5, [_S], 0])
    bad = ERROR_CASES[code]
    assert _errors([good, bad, good]) == [0, code, 0]
    _same(_chunk([good, bad, good]))


def test_issue19_vocabulary_overflow_falls_back() -> None:
    payloads = [ENC.encode([1.0, [{**_S, "medium": f"M{i}"}]]) for i in range(scan.MAX_VOCAB + 5)]
    errs = _errors(payloads)
    assert errs[: scan.MAX_VOCAB] == [0] * scan.MAX_VOCAB
    assert set(errs[scan.MAX_VOCAB :]) == {scan.ERR_VOCAB}
    _same(_chunk(payloads))


def test_issue19_columns_grow_when_a_chunk_holds_more_than_estimated() -> None:
    # Tiny payloads with many one-byte hashes: more keys than the first allocation holds.
    many_keys = [ENC.encode([1.0, [{"type": "BlockRemoved", "block_hashes": list(range(999))}]])]
    many_events = [ENC.encode([1, [["AllBlocksCleared"]] * 10])]
    for payloads in (many_keys * 30, many_events * 300):
        assert set(_errors(payloads)) == {0}
        got = _same(_chunk(payloads))
        assert got.rows == (999 if payloads[0] is many_keys[0] else 10) * len(payloads)


def test_issue19_bounds_checked_never_reads_past_a_payload() -> None:
    # A count that promises more than the payload holds, at every level: each is an
    # error of its own payload, and the next payload decodes (NUMBA_BOUNDSCHECK=1 in CI).
    good = ENC.encode([1.0, [_S]])
    liars = [
        b"\xdd\xff\xff\xff\xff",
        b"\x92\xcb" + bytes(8) + b"\xdd\xff\xff\xff\xff",
        b"\x92\xcb" + bytes(8) + b"\x91\x81\xa4type\xdb\xff\xff\xff\xff",
        b"\x92\xcb" + bytes(8) + b"\x91\x81\xacblock_hashes\xc6\x7f\xff\xff\xff",
        b"\x92\xca\x00",
    ]
    errs = _errors([*liars, good])
    assert errs[-1] == 0 and all(e != 0 for e in errs[:-1])
    _same(_chunk([*liars, good]))


def test_issue19_env_var_forces_the_msgspec_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = scan.scan

    def counting(buf: object, offs: object) -> object:
        calls.append(1)
        return real(buf, offs)  # type: ignore[arg-type]

    monkeypatch.setattr(scan, "scan", counting)
    raw = _chunk([ENC.encode([1.0, [_S]])])
    decode_chunk(raw)
    assert calls == [1]
    monkeypatch.setenv("KVTOOL_DECODER", "msgspec")
    decode_chunk(raw)
    assert calls == [1]


# -- the cold compile ---------------------------------------------------------------------------

_RUN = """
import msgspec, numpy as np
from kvtool import _jit, scan
_jit.say_when_compiling()  # as the console entry does
p = msgspec.msgpack.encode([1.0, [["AllBlocksCleared"]]])
s = scan.scan(np.frombuffer(p, dtype=np.uint8), np.array([0, len(p)], dtype=np.int64))
assert s.err.tolist() == [0] and s.type_code.tolist() == [2]
print("ok")
"""


def _run_on_a_terminal(
    env: dict[str, str], cwd: Path, prefix: tuple[str, ...] = ()
) -> tuple[str, str]:
    """Run ``_RUN`` with stderr on a pseudo-terminal: (stdout, stderr)."""
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", _RUN],
            stdout=subprocess.PIPE,
            stderr=slave,
            env=env,
            cwd=cwd,
            timeout=600,
            check=True,
        )
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            got = os.read(master, 4096)
        except OSError:
            break
        if not got:
            break
        chunks.append(got)
    os.close(master)
    return proc.stdout.decode(), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_issue19_cold_compile_says_so_once_and_the_cache_is_used(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    out, err = _run_on_a_terminal(env, tmp_path)
    assert out.strip() == "ok"
    assert err.count(scan.COMPILE_NOTICE) == 1
    assert any((tmp_path / "cache").rglob("*.nbi"))  # numba's cache index, in our folder
    out, err = _run_on_a_terminal(env, tmp_path)
    assert out.strip() == "ok"
    assert scan.COMPILE_NOTICE not in err


@pytest.mark.slow
def test_issue19_a_cold_report_says_it_compiles_once_and_a_warm_one_nothing(
    tmp_path: Path,
) -> None:
    """The notice is printed whenever a command compiles, stderr a pipe (not a terminal).

    No NUMBA_CACHE_DIR: the console's own cache folder, in the user cache, named by the
    digest of kvtool's sources.
    """
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    cmd = [sys.executable, "-m", "kvtool", "report", str(ROOT / "recordings" / "gemma3.mcap")]

    def report() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, "--format", "json"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=900,
            check=False,
        )

    def notices(stderr: str) -> list[str]:
        # the report's own findings (gemma3: R8's copy_choice) go to stderr too
        return [ln for ln in stderr.splitlines() if not ln.startswith("kvtool: finding:")]

    cold = report()
    warm = report()
    assert cold.returncode == 0, cold.stderr
    assert notices(cold.stderr) == [scan.COMPILE_NOTICE]  # one line, said once
    assert warm.returncode == 0, warm.stderr
    assert notices(warm.stderr) == []  # every kernel loaded from the cache: nothing compiled
    assert cold.stderr.replace(scan.COMPILE_NOTICE + "\n", "") == warm.stderr
    assert warm.stdout == cold.stdout
    (folder,) = (tmp_path / "xdg" / "kvtool" / "numba").iterdir()
    assert folder.name == _jit.source_digest() and any(folder.rglob("*.nbi"))


@pytest.mark.slow
def test_issue19_read_only_package_caches_in_the_user_folder() -> None:
    import shutil
    import tempfile

    import kvtool

    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root writes into read-only folders: run the child as nobody
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a folder read-only")
        prefix = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--")
    top = Path(tempfile.mkdtemp(prefix="kvtool-ro-"))
    try:
        top.chmod(0o755)
        pkg = top / "site" / "kvtool"
        shutil.copytree(
            Path(kvtool.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__")
        )
        for p in [top / "site", pkg, *pkg.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        home = top / "home"
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        env = {
            k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")
        }
        env.update(PYTHONPATH=str(top / "site"), HOME=str(home))
        out, err = _run_on_a_terminal(env, top, prefix)
        assert out.strip() == "ok", err
        assert not any(pkg.rglob("*.nbi"))  # nothing written beside the read-only package
        assert any(home.rglob("*.nbi"))  # numba's user cache folder (~/.cache/numba)
        out, err = _run_on_a_terminal(env, top, prefix)
        assert out.strip() == "ok" and scan.COMPILE_NOTICE not in err
    finally:
        for p in [top, *top.rglob("*")]:
            if not p.is_symlink():
                p.chmod(0o755 if p.is_dir() else 0o644)
        shutil.rmtree(top, ignore_errors=True)
