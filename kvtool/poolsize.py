"""The engine's pool size (``num_gpu_blocks``): from ``--pool-blocks``, a groups file, a recording.

vLLM gives each engine one block pool of ``num_gpu_blocks`` blocks (``vllm:cache_config_info``),
shared by all its KV cache groups. kvtool learns it from, in this order:

1. ``--pool-blocks N`` on the command line (it wins);
2. a ``--groups`` file written as an object: ``{"groups": [...], "num_gpu_blocks": N}``
   (``pool_blocks`` is accepted as the same key);
3. the recording's ``kvtool.recording`` metadata record, key ``pool_blocks``, which
   ``kvtool record --pool-blocks N`` (or a groups file that carries it) writes.

Where sources disagree the first one in that order is used and a finding says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvtool.errors import KvtoolError, MetadataError
from kvtool.poolbounds import MAX_POOL_BLOCKS, MIN_POOL_BLOCKS
from kvtool.text import printable

POOL_KEYS = ("num_gpu_blocks", "pool_blocks")
"""Keys of a groups file object that give the pool size."""
__all__ = [
    "MAX_POOL_BLOCKS",
    "MIN_POOL_BLOCKS",
    "POOL_KEYS",
    "PoolSize",
    "groups_file_pool_blocks",
    "pool_blocks_of",
    "read_groups_json",
    "recording_pool_blocks",
    "resolve_pool_blocks",
    "valid_pool_blocks",
]


def valid_pool_blocks(value: object) -> bool:
    """True for an int pool size in ``[MIN_POOL_BLOCKS, MAX_POOL_BLOCKS]`` (not a bool)."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and MIN_POOL_BLOCKS <= value <= MAX_POOL_BLOCKS
    )


def pool_blocks_of(obj: object, *, source: str) -> int | None:
    """Return the pool size a decoded groups file carries, or None.

    Args:
        obj: The decoded JSON: a list of groups carries none; an object may carry
            ``num_gpu_blocks`` (or ``pool_blocks``) next to its ``groups``.
        source: Names the file in errors.

    Returns:
        The pool size, or None when the file gives none.

    Raises:
        MetadataError: The key is present but not an integer >= 2, or the two keys disagree.
    """
    if not isinstance(obj, Mapping):
        return None
    found: dict[str, int] = {}
    for key in POOL_KEYS:
        if key not in obj or obj[key] is None:
            continue
        v = obj[key]
        if not valid_pool_blocks(v):
            raise MetadataError(
                f'{source}: "{key}" must be an integer from {MIN_POOL_BLOCKS} to '
                f"{MAX_POOL_BLOCKS:,} (the engine's num_gpu_blocks), got {v!r}"
            )
        assert isinstance(v, int)
        found[key] = v
    if len(set(found.values())) > 1:
        raise MetadataError(
            f'{source}: "num_gpu_blocks" ({found["num_gpu_blocks"]}) and "pool_blocks" '
            f"({found['pool_blocks']}) disagree"
        )
    return next(iter(found.values()), None)


def read_groups_json(path: str | os.PathLike[str]) -> object:
    """Read and parse a ``--groups`` file, unvalidated.

    The one reader both the group table and the pool size use, so a file that cannot be
    parsed says so the same way for both.

    Args:
        path: The groups file.

    Returns:
        The parsed JSON value.

    Raises:
        MetadataError: The file cannot be read or is not JSON (including a number past
            Python's digit limit and nesting past the recursion limit).
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except OSError as err:
        raise MetadataError(f"{name}: cannot read groups file: {err.strerror}") from err
    try:
        return json.loads(data)
    # ValueError covers JSONDecodeError and int's digit limit; RecursionError deep nesting.
    except (ValueError, RecursionError) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise MetadataError(f"{name}: groups file is not JSON: {reason}") from err


def groups_file_pool_blocks(path: str | os.PathLike[str]) -> int | None:
    """Return the pool size a ``--groups`` file carries, or None.

    Args:
        path: The groups file (already validated as a group table by the caller, or not).

    Returns:
        The pool size, or None.

    Raises:
        MetadataError: The file cannot be read, is not JSON, or carries a bad pool size.
    """
    name = os.fspath(path)
    return pool_blocks_of(read_groups_json(name), source=name)


def recording_pool_blocks(path: str | os.PathLike[str]) -> int | None:
    """Return the pool size stored in a recording's metadata, or None.

    Only the metadata is read; a file that cannot be opened gives None (the command
    that reads it says why).

    Args:
        path: The recording.

    Returns:
        The stored ``pool_blocks``, or None.
    """
    from kvtool.recording.reader import open_recording

    try:
        with open_recording(path) as reader:
            ctx = reader.recording_context
    except (KvtoolError, OSError):
        return None
    return ctx.pool_blocks if ctx is not None else None


@dataclass
class PoolSize:
    """The pool size a command uses, where it came from, and disagreements.

    Attributes:
        blocks: ``num_gpu_blocks``, or None when no source gives it.
        source: ``--pool-blocks``, the groups file or the recording that gave it.
        findings: One line per source that disagrees with the one used.
    """

    blocks: int | None = None
    source: str | None = None
    findings: list[str] = field(default_factory=list)


def resolve_pool_blocks(
    flag: int | None,
    groups_file: str | os.PathLike[str] | None,
    recordings: Sequence[str | os.PathLike[str]],
) -> PoolSize:
    """Pick the pool size: ``--pool-blocks``, else the groups file, else the recordings.

    Args:
        flag: ``--pool-blocks N``, or None.
        groups_file: ``--groups FILE``, or None.
        recordings: The input recordings.

    Returns:
        The size, its source, and a finding per source that disagrees with it.

    Raises:
        MetadataError: The groups file carries a bad pool size.
    """
    sources: list[tuple[str, int]] = []
    if flag is not None:
        sources.append((f"--pool-blocks {flag}", flag))
    if groups_file is not None:
        g = groups_file_pool_blocks(groups_file)
        if g is not None:
            sources.append((f"{printable(os.fspath(groups_file))} (num_gpu_blocks)", g))
    for path in recordings:
        r = recording_pool_blocks(path)
        if r is not None:
            sources.append((f"{printable(os.fspath(path))} (recording metadata)", r))
    if not sources:
        return PoolSize()
    used_from, used = sources[0]
    out = PoolSize(used, used_from)
    for where, n in sources[1:]:
        if n != used:
            out.findings.append(
                f"pool size: {where} says {n:,} blocks but {used_from} gives {used:,}; "
                f"using {used:,}"
            )
    return out
