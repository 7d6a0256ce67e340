"""The HTTP side of ``kvtool serve``: ``/metrics`` on 127.0.0.1 (by default), bounded clients."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import re
import socket
import threading
from typing import TYPE_CHECKING, Any

from kvtool.errors import UsageError
from kvtool.text import printable

if TYPE_CHECKING:
    from kvtool.serve import Exporter

DEFAULT_BIND = "127.0.0.1:9400"
"""Where ``/metrics`` is served unless ``--metrics`` says otherwise: loopback."""


def parse_bind(text: str, *, option: str = "--metrics") -> tuple[str, int]:
    """Parse ``HOST:PORT``, ``[V6]:PORT`` or a bare ``PORT`` (on 127.0.0.1).

    Args:
        text: The address.
        option: The option it came from (for the error).

    Returns:
        (host, port).

    Raises:
        UsageError: Not an address.
    """
    t = text.strip()
    host = "127.0.0.1"
    port_s = t
    if t.startswith("["):
        end = t.find("]")
        if end < 0 or not t[end + 1 :].startswith(":"):
            raise UsageError(f"{option} {printable(text)}: expected [ADDRESS]:PORT")
        host, port_s = t[1:end], t[end + 2 :]
    elif ":" in t:
        host, _, port_s = t.rpartition(":")
    # ASCII digits only: str.isdigit() takes '²', which int() then refuses.
    if not re.fullmatch(r"[0-9]{1,5}", port_s) or not 0 <= int(port_s) <= 65535 or not host:
        raise UsageError(f"{option} {printable(text)}: expected HOST:PORT (e.g. {DEFAULT_BIND})")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise UsageError(
                f"{option} {printable(text)}: {printable(host)} is not an IP address"
            ) from None
    return host, int(port_s)


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /metrics: the last snapshot's bytes; anything else 404."""

    server: _HTTPServer
    timeout = 5.0  # a client that sends nothing is dropped after this
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        path = self.path.split("?", 1)[0]
        gzipped = False
        if path == "/metrics":
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            exporter = self.server.exporter
            body = exporter.body_gzip() if gzipped else exporter.body()
            ctype = CONTENT_TYPE_LATEST
        elif path == "/":
            body, ctype = b'kvtool serve: see <a href="/metrics">/metrics</a>\n', "text/html"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing per request (stderr is for findings)."""


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], exporter: Exporter, max_clients: int):
        self.exporter = exporter
        self._slots = threading.BoundedSemaphore(max_clients)
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # At most ``max_clients`` requests at once: a flood waits in the listen backlog
        # (and is refused past it) instead of taking threads and memory without bound.
        if not self._slots.acquire(timeout=1.0):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class MetricsServer:
    """``/metrics`` over HTTP, served from a background thread.

    Args:
        exporter: What is served.
        host: Address to bind (loopback unless the caller chose otherwise).
        port: Port (0: any free one; see :attr:`address`).
        max_clients: Requests served at once.

    Raises:
        UsageError: The address cannot be bound.
    """

    def __init__(
        self, exporter: Exporter, host: str = "127.0.0.1", port: int = 9400, max_clients: int = 8
    ) -> None:
        try:
            self._server = _HTTPServer((host, port), exporter, max_clients)
        except OSError as err:
            raise UsageError(
                f"--metrics {printable(host)}:{port}: cannot bind: {err.strerror or err}"
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name="kvtool-metrics",
        )  # fmt: skip

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) bound."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """The ``/metrics`` URL."""
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def start(self) -> MetricsServer:
        """Start serving.

        Returns:
            Itself.
        """
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (requests in flight get ``timeout_s`` to finish) and close the socket.

        Args:
            timeout_s: Seconds to wait for the server thread.
        """
        if self._thread.is_alive():
            stopper = threading.Thread(target=self._server.shutdown, daemon=True)
            stopper.start()
            stopper.join(timeout_s)
            self._thread.join(timeout_s)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["DEFAULT_BIND", "MetricsServer", "is_loopback", "parse_bind"]
