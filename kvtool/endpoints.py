"""ZeroMQ endpoints for ``record`` and ``replay --publish``: parse, normalise, DP-rank offset.

One parser and one data-parallel offset serve both sides, so a recorder given ``--dp-size``
and a publisher replaying several channels agree on where rank ``n`` lives. The offset is
vLLM's (``ZmqEventPublisher.offset_endpoint_port`` in ``vllm/distributed/kv_events.py``):
rank 0 is the endpoint as given; a tcp port grows by the rank; an ``inproc`` name gets a
``_dp{rank}`` suffix; anything else (``ipc``) with a rank above 0 is refused, as vLLM
refuses it ("Invalid endpoint: must contain 'inproc' or 'tcp'").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kvtool.errors import ConnectTimeout, EndpointError
from kvtool.text import printable

DEFAULT_HOST = "127.0.0.1"
"""Where a bare port binds or connects: loopback, never every interface."""

SCHEMES = ("tcp://", "ipc://", "inproc://")

# ASCII only: Python's \d also matches other scripts' digits (Arabic-Indic, fullwidth),
# which int() would quietly turn into a port the user never typed.
_PORT = re.compile(r"^:?(\d{1,5}|\*)$", re.ASCII)
# HOST is a name, an IPv4 address, '*' or a bracketed IPv6 address (with a zone).
_HOST = r"(\[[0-9A-Fa-f:.%\w]+\]|[A-Za-z0-9.\-_*%]+)"
_HOSTPORT = re.compile(rf"^{_HOST}:(\d+|\*)$", re.ASCII)


def parse_endpoint(text: str, *, option: str = "--publish", bind: bool = True) -> str:
    """Turn a command-line endpoint into a full ZeroMQ endpoint.

    A bare port (``5557`` or ``:5557``) means ``tcp://127.0.0.1:PORT``; ``HOST:PORT``
    means ``tcp://HOST:PORT``. The host ``*`` and the port ``*`` (a free port chosen by
    the OS) only make sense for a socket that binds.

    Args:
        text: ``5557``, ``:5557``, ``HOST:PORT``, ``tcp://HOST:PORT``, ``ipc://PATH`` or
            ``inproc://NAME``.
        option: The option or argument the text came from, for the error message.
        bind: The socket will bind (True) or connect (False).

    Returns:
        The endpoint, e.g. ``tcp://127.0.0.1:5557``.

    Raises:
        EndpointError: Not an endpoint, a port outside 1..65535, a wildcard on a socket
            that connects, or control characters.
    """
    shown = printable(text)
    t = text.strip()
    if printable(t) != t:
        raise EndpointError(f"{option} '{shown}': contains control characters")
    for scheme in ("ipc://", "inproc://"):
        if t.startswith(scheme):
            if len(t) == len(scheme):
                raise EndpointError(f"{option} '{shown}': {scheme} needs a name after it")
            return t
    if t.startswith("tcp://"):
        m = _HOSTPORT.match(t[len("tcp://") :])
        if not m:
            raise EndpointError(
                f"{option} '{shown}': expected tcp://HOST:PORT (e.g. tcp://127.0.0.1:5557)"
            )
        host, port = m.group(1), m.group(2)
    elif (pm := _PORT.match(t)) is not None:
        host, port = DEFAULT_HOST, pm.group(1)
    elif (hm := _HOSTPORT.match(t)) is not None and "://" not in t:
        host, port = hm.group(1), hm.group(2)
    else:
        raise EndpointError(
            f"{option} '{shown}': not a ZeroMQ endpoint; expected a port (5557), HOST:PORT, "
            "tcp://HOST:PORT, ipc://PATH or inproc://NAME"
        )
    if port == "*":
        if not bind:
            raise EndpointError(
                f"{option} '{shown}': cannot connect to port '*'; give the publisher's port"
            )
    elif not 1 <= int(port) <= 65535:
        raise EndpointError(f"{option} '{shown}': port {int(port)} is not in 1-65535")
    else:
        port = str(int(port))
    if host == "*" and not bind:
        raise EndpointError(
            f"{option} '{shown}': cannot connect to '*'; give the publisher's host "
            "(e.g. tcp://127.0.0.1:5557) or pass --bind"
        )
    return f"tcp://{host}:{port}"


def normalize_endpoint(text: str, *, bind: bool = False) -> str:
    """Check one ``record`` endpoint and return it in full form (see :func:`parse_endpoint`).

    Args:
        text: ``tcp://HOST:PORT``, ``ipc://PATH``, ``inproc://NAME`` or a bare port.
        bind: The socket will bind rather than connect.

    Returns:
        The endpoint, e.g. ``tcp://127.0.0.1:5557``.

    Raises:
        EndpointError: The text is not a usable endpoint.
    """
    return parse_endpoint(text, option="endpoint", bind=bind)


def offset_endpoint(endpoint: str, rank: int) -> str:
    """Return the endpoint data-parallel ``rank`` uses, exactly as vLLM derives it.

    vLLM's ``ZmqEventPublisher.offset_endpoint_port``: rank 0 keeps the endpoint; a tcp
    port grows by the rank (a ``*`` port stays ``*``: each rank gets its own free port);
    an ``inproc`` name gets ``_dp{rank}``. vLLM refuses any other endpoint with a rank
    above 0, so an ``ipc`` path with rank > 0 is an error here too.

    Args:
        endpoint: The base endpoint (rank 0's), as :func:`parse_endpoint` returns it.
        rank: The data-parallel rank (or the n-th channel of a recording).

    Returns:
        The rank's endpoint.

    Raises:
        EndpointError: The offset port would exceed 65535, or an ``ipc`` endpoint with a
            rank above 0.
    """
    if rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if port == "*":
            return endpoint
        new = int(port) + rank
        if new > 65535:
            raise EndpointError(
                f"endpoint {printable(endpoint)}: port + rank {rank} = {new} exceeds 65535"
            )
        return f"{base}:{new}"
    raise EndpointError(
        f"endpoint {printable(endpoint)}: vLLM offsets only tcp ports and inproc names by "
        f"data-parallel rank, so rank {rank} has no ipc endpoint; use tcp:// or inproc://, "
        "or give each rank's endpoint explicitly"
    )


@dataclass(frozen=True)
class Source:
    """One publisher to subscribe to.

    Attributes:
        endpoint: The PUB endpoint.
        replay: Its replay ROUTER endpoint, if any.
        dp_rank: The data-parallel rank it serves, when ``dp_size`` was given.
    """

    endpoint: str
    replay: str | None = None
    dp_rank: int | None = None


def expand_endpoints(
    endpoints: Sequence[str],
    *,
    replay: Sequence[str] = (),
    dp_size: int | None = None,
    bind: bool = False,
) -> list[Source]:
    """Validate endpoints and expand data-parallel ranks into one :class:`Source` each.

    Args:
        endpoints: Publisher endpoints (or bare ports).
        replay: No replay endpoint, one (for a single endpoint), or one per endpoint.
        dp_size: Subscribe to ranks ``0..dp_size-1`` of each endpoint (port + rank).
        bind: The SUB sockets bind instead of connecting.

    Returns:
        The sources, in order.

    Raises:
        EndpointError: A malformed endpoint, a replay/endpoint count mismatch, a bad
            ``dp_size`` or the same endpoint twice.
    """
    if not endpoints:
        raise EndpointError("no endpoint given (e.g. tcp://127.0.0.1:5557)")
    eps = [normalize_endpoint(e, bind=bind) for e in endpoints]
    reps = [parse_endpoint(r, option="--replay", bind=False) for r in replay]
    if reps and len(reps) != len(eps):
        raise EndpointError(
            f"{len(reps)} replay endpoints for {len(eps)} endpoints; give one --replay per "
            "endpoint, in the same order"
        )
    if dp_size is not None and dp_size < 1:
        raise EndpointError(f"--dp-size {dp_size}: must be at least 1")
    _check_socket_budget(eps, bool(reps), dp_size)
    out: list[Source] = []
    for i, ep in enumerate(eps):
        rep = reps[i] if reps else None
        if dp_size is None:
            out.append(Source(ep, rep, None))
            continue
        for rank in range(dp_size):
            out.append(
                Source(
                    offset_endpoint(ep, rank),
                    offset_endpoint(rep, rank) if rep else None,
                    rank,
                )
            )
    seen: set[str] = set()
    for s in out:
        if s.endpoint in seen:
            raise EndpointError(f"endpoint {printable(s.endpoint)} given twice")
        seen.add(s.endpoint)
    # A replay endpoint that is also a publisher endpoint (typically --dp-size N with
    # --replay at base port + 1: rank 1 publishes where rank 0 replays) would subscribe to
    # a ROUTER and send replay requests to a PUB socket; nothing works and nothing says why.
    replays: set[str] = set()
    for s in out:
        if s.replay is None:
            continue
        if s.replay in seen:
            which = f" (rank {s.dp_rank})" if s.dp_rank is not None else ""
            raise EndpointError(
                f"replay endpoint {printable(s.replay)}{which} is also a publisher endpoint; "
                "give the replay socket a port no rank publishes on"
            )
        if s.replay in replays:
            raise EndpointError(f"replay endpoint {printable(s.replay)} given twice")
        replays.add(s.replay)
    return out


SOCKETS_PER_SOURCE = 3
"""ZeroMQ sockets one subscribed endpoint costs the recorder: its SUB and the two ends of
its connection monitor (one more with a replay DEALER)."""
FDS_PER_SOCKET = 2
"""File descriptors per ZeroMQ socket, about: its mailbox and its connection."""
FD_RESERVE = 64
"""File descriptors kept for everything else (the recording, Python, the terminal)."""
ZMQ_MAX_SOCKETS = 65_535
"""The most sockets kvtool asks one ZeroMQ context for (its default is 1,023)."""


def sockets_needed(n_sources: int, replay: bool) -> int:
    """ZeroMQ sockets a recorder of ``n_sources`` endpoints opens.

    Args:
        n_sources: Endpoints (ranks included).
        replay: Each has a replay endpoint.

    Returns:
        The count.
    """
    return n_sources * (SOCKETS_PER_SOURCE + (1 if replay else 0))


def socket_budget() -> int:
    """ZeroMQ sockets one kvtool process can hold: by its open-files limit, and ZeroMQ's.

    Returns:
        The count.
    """
    soft = _open_files_limit()
    return max(0, min(ZMQ_MAX_SOCKETS, (soft - FD_RESERVE) // FDS_PER_SOCKET))


def _open_files_limit() -> int:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 1024
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):  # pragma: no cover
        return 1024
    return 1 << 20 if soft == resource.RLIM_INFINITY or soft < 0 else soft


def _check_socket_budget(eps: Sequence[str], replay: bool, dp_size: int | None) -> None:
    """Refuse, before any socket, more endpoints than one process can hold (issue 23)."""
    n = len(eps) * (dp_size or 1)
    need = sockets_needed(n, replay)
    budget = socket_budget()
    if need <= budget:
        return
    per = SOCKETS_PER_SOURCE + (1 if replay else 0)
    most = budget // per // max(1, len(eps))
    what = f"--dp-size {dp_size}" if dp_size is not None else f"{n} endpoints"
    raise EndpointError(
        f"{what}{' with replay endpoints' if replay else ''} needs {need:,} ZeroMQ sockets; "
        f"this process can hold {budget:,} (open files limit {_open_files_limit():,}): "
        f"at most {most:,} ranks per endpoint here; raise `ulimit -n` or record the ranks "
        "in several processes"
    )


__all__ = [
    "DEFAULT_HOST",
    "SCHEMES",
    "ConnectTimeout",
    "Source",
    "expand_endpoints",
    "normalize_endpoint",
    "offset_endpoint",
    "parse_endpoint",
    "socket_budget",
    "sockets_needed",
]
