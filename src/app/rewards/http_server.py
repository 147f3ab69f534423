"""The HTTP side of the reward server (:mod:`app.rewards.serve`): the standard library's threading server bounded
for untrusted clients (a listen backlog sized for bursts, at most ``max_connections`` connections at once, idle
kept-alive ones closed when another waits), a deadline on each request from its first byte, and the handler that
checks a request's framing (one ASCII ``Content-Length``, no chunked body, the size before the body is read, an unread
body drained or the connection closed) before :class:`~app.rewards.serve.RewardServer` answers it."""

from __future__ import annotations

import io
import json
import logging
import re
import select
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from app.rewards.wire import FRAMED_TYPE, Blobs, WireError, parse_json, unpack

log = logging.getLogger(__name__)


class Service(Protocol):
    """What the handler asks of the server it fronts (:class:`~app.rewards.serve.RewardServer`)."""

    httpd: BoundedHTTPServer
    max_request_bytes: int
    timeout_s: float

    def info(self) -> dict[str, Any]: ...

    def score(self, body: Any, blobs: Blobs | None = None) -> dict[str, Any]: ...

    def authorised(self, header: str | None) -> bool: ...


DISCARD_LIMIT = 64 * 2**20
"""A body the server does not read (a refusal before it) is read and discarded up to this many bytes, so that the
connection stays usable and a client still sending reads the answer; a larger one closes the connection."""
_LENGTH = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() also accepts '²'


class Refusal(Exception):
    """A request answered with an error status and a message."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class BoundedHTTPServer(ThreadingHTTPServer):
    """The standard library's threading server with a listen backlog sized for bursts and at most ``max_connections``
    connections served at once: a connection takes a slot before it is accepted and frees it when it closes, so the
    ones beyond wait in the backlog instead of each holding a thread."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog (the default 5 drops a burst's connections: resets, 1 s retransmits)

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        self.max_connections = max_connections
        self.slots = threading.BoundedSemaphore(max_connections)
        self.closing = threading.Event()
        self.crowded = threading.Event()  # a connection waits for a slot: idle kept-alive ones make room
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        while not self.slots.acquire(timeout=0.05):  # all slots taken: wait, but not past a shutdown
            self.crowded.set()
            if self.closing.is_set():
                raise OSError("the server is shutting down")
        self.crowded.clear()
        try:
            return super().get_request()
        except OSError:
            self.slots.release()
            raise

    def shutdown_request(self, request: socket.socket) -> None:
        try:
            super().shutdown_request(request)
        finally:
            self.slots.release()

    def shutdown(self) -> None:
        self.closing.set()
        super().shutdown()

    def handle_error(self, request: socket.socket, client_address: Any) -> None:
        """One log line for a connection that failed outside the answers' own handling, instead of socketserver's
        traceback on stderr: a client that hung up before reading its answer is routine (a debug line); anything
        else is an error line naming it (its traceback only with debug logging on)."""
        error = sys.exc_info()[1]
        host = client_address[0] if isinstance(client_address, tuple) else client_address
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.debug("client %s hung up: %s", host, error)
            return
        log.error(
            "a request from %s failed: %s: %s",
            host,
            type(error).__name__,
            error,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )


class _RequestDeadline(io.RawIOBase):
    """A connection's reads with a deadline: while a request is read every read waits at most until ``deadline``
    (a request trickled a byte at a time still ends); between requests (``deadline`` None) at most ``timeout_s``,
    and not at all once another connection waits for a slot (``crowded``)."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, timeout_s: float, crowded: threading.Event) -> None:
        self.raw, self.sock, self.timeout_s, self.crowded = raw, sock, timeout_s, crowded
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def _wait_idle(self) -> None:
        end = time.monotonic() + self.timeout_s
        while not select.select([self.sock], [], [], 0.1)[0]:
            if self.crowded.is_set() or time.monotonic() >= end:
                raise TimeoutError("an idle connection closed")

    def readinto(self, buffer) -> int:
        if self.deadline is None:
            self._wait_idle()
        wait = self.timeout_s if self.deadline is None else self.deadline - time.monotonic()
        if wait <= 0:
            raise TimeoutError("the request did not arrive within timeout_s")
        self.sock.settimeout(min(wait, self.timeout_s))
        return self.raw.readinto(buffer)

    def close(self) -> None:
        self.raw.close()
        super().close()


def handler_for(server: Service) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection for every batch
        disable_nagle_algorithm = True  # headers and body go out as two writes: without it each answer waits ~40 ms
        timeout = server.timeout_s

        def setup(self) -> None:
            super().setup()
            self.reads = _RequestDeadline(self.rfile.detach(), self.connection, server.timeout_s, server.httpd.crowded)
            self.rfile = io.BufferedReader(self.reads)

        def handle_one_request(self) -> None:
            self.reads.deadline = None  # waiting for a request: an idle connection closes after timeout_s
            try:
                if not self.rfile.peek(1):
                    self.close_connection = True
                    return
            except OSError:  # the timeout included
                self.close_connection = True
                return
            self.reads.deadline = time.monotonic() + server.timeout_s
            self.body_read = False
            super().handle_one_request()

        def handle_expect_100(self) -> bool:
            return True  # 100 Continue is sent by _post, once the path, token and length are checked

        def do_GET(self) -> None:
            self._answer(self._get, needs_token=self.path != "/health")

        def do_POST(self) -> None:
            self._answer(self._post)

        def _get(self) -> dict[str, Any]:
            if self.path == "/health":
                return {"ok": True}
            if self.path != "/info":
                raise Refusal(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: GET /health, GET /info, POST /score")
            return server.info()

        def _post(self) -> dict[str, Any]:
            if self.path != "/score":
                raise Refusal(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: POST /score")
            length = self._declared_length()
            if length is None:
                raise Refusal(HTTPStatus.LENGTH_REQUIRED, "a request needs a Content-Length")
            if length > server.max_request_bytes:
                raise Refusal(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"the body is {length} bytes, over this server's limit of {server.max_request_bytes}",
                )
            if self.headers.get("Expect", "").lower() == "100-continue":
                self.send_response_only(HTTPStatus.CONTINUE)
                self.end_headers()
            raw = self._read_body(length)
            if self.headers.get("Content-Type", "").startswith(FRAMED_TYPE):
                try:
                    return server.score(*unpack(raw))
                except WireError as error:
                    raise Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
            try:
                body = parse_json(raw, "the body")
            except WireError as error:
                raise Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
            return server.score(body)

        def _declared_length(self) -> int | None:
            """The body's length; None without one. A refusal for a length that cannot be trusted: the connection
            then closes, since where the next request starts is unknown."""
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = True
                raise Refusal(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length (no Transfer-Encoding)")
            lengths = self.headers.get_all("Content-Length") or []
            if len(lengths) > 1:
                self.close_connection = True
                raise Refusal(HTTPStatus.BAD_REQUEST, f"a request has one Content-Length, got {len(lengths)}")
            if not lengths:
                return None
            if not _LENGTH.fullmatch(lengths[0].strip()):
                self.close_connection = True
                raise Refusal(
                    HTTPStatus.BAD_REQUEST, f"Content-Length must be a number of bytes, got {lengths[0][:20]!r}"
                )
            return int(lengths[0])

        def _read_body(self, length: int) -> bytes:
            try:
                raw = self.rfile.read(length)
            except OSError:  # the deadline or the client gone: where the next request starts is unknown
                self.close_connection = True
                raise Refusal(
                    HTTPStatus.REQUEST_TIMEOUT, f"the body did not arrive within {server.timeout_s:g} s"
                ) from None
            self.body_read = True
            if len(raw) != length:
                self.close_connection = True
                raise Refusal(HTTPStatus.BAD_REQUEST, f"the body ended after {len(raw)} of {length} bytes")
            return raw

        def _settle_body(self) -> None:
            """After an answer: read and discard a body that was not read (bounded), or close the connection."""
            if self.body_read or self.close_connection:
                return
            try:
                length = self._declared_length()
            except Refusal:
                return  # close_connection is set
            if not length:
                return
            if length > DISCARD_LIMIT or self.headers.get("Expect", "").lower() == "100-continue":
                self.close_connection = True  # too much to read, or a body the client holds back: not coming
                return
            try:
                while length > 0:
                    chunk = self.rfile.read(min(length, 1 << 20))
                    if not chunk:
                        break
                    length -= len(chunk)
            except OSError:
                pass
            self.close_connection = self.close_connection or length > 0

        def _answer(self, make, needs_token: bool = True) -> None:
            try:
                if needs_token and not server.authorised(self.headers.get("Authorization")):
                    raise Refusal(HTTPStatus.UNAUTHORIZED, "missing or wrong token (Authorization: Bearer ...)")
                status, payload = HTTPStatus.OK, make()
            except Refusal as refusal:
                status, payload = refusal.status, {"error": str(refusal)}
            except Exception as error:  # a bug here: the client still gets an answer that names it
                log.exception("%s %s failed", self.command, self.path)
                status, payload = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(error).__name__}: {error}"}
            try:
                data = json.dumps(payload, allow_nan=False).encode()
            except ValueError as error:
                status, data = HTTPStatus.INTERNAL_SERVER_ERROR, json.dumps({"error": str(error)}).encode()
            self._send(status, data)
            self._settle_body()

        def _send(self, status: int, data: bytes) -> None:
            self.connection.settimeout(server.timeout_s)  # a client that does not read its answer: bounded too
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """The standard library's own refusals (a malformed request line or header, an unknown method) as JSON,
            like every other answer; the connection closes, since the request was not understood."""
            if code == HTTPStatus.NOT_IMPLEMENTED:
                message = f"unsupported method {self.command!r}: GET /health, GET /info, POST /score"
            self.close_connection = True
            self.log_error("code %d, message %s", code, message)
            self._send(code, json.dumps({"error": message or HTTPStatus(code).phrase}).encode())

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's signature
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
