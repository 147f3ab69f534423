"""Serve reward components over HTTP, for :class:`~app.rewards.remote.RemoteReward` clients on other processes or
machines (a judge or a scorer farm that does not fit beside the policy).

    python -m app.rewards.serve --config rewards.yaml --port 8000

``rewards.yaml`` holds the same blocks as a training config's ``model.init_args.rewards``::

    rewards:
      - class_path: app.rewards.AccuracyReward
      - class_path: app.tasks.vbvr.VBVRScorerReward
        init_args: {num_workers: 4}

Each request is one batch, scored by one served reward (the wire format: :mod:`app.rewards.wire`, specified in
docs/wire_spec.md). Connections are served on threads, at most ``--max_connections`` at once (more wait in the listen
backlog); one reward scores one batch at a time (its side-state counters are per batch), so a reward that is CPU-bound
scales with its own workers (``VBVRScorerReward.num_workers``) or with more servers. ``--token_env NAME`` makes the
server require ``Authorization: Bearer <the value of $NAME>`` on ``/info`` and ``/score``. Untrusted clients cost a
bounded amount: a request must arrive within ``--timeout_s`` of its first byte, its body within ``--max_request_mb``
and its arrays' decoded size within ``--max_decoded_mb`` (checked from their headers before decoding); a body the
server does not read is read and discarded (up to 64 MiB) or the connection closed, never parsed as a request. The
standard library's HTTP server is all it needs: put a TLS proxy in front of it to expose it beyond a trusted network.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import math
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from app.rewards.base import RewardComponent
from app.rewards.wire import (
    FRAMED_TYPE,
    VERSION,
    Blobs,
    RequestTooLarge,
    WireError,
    decode_request,
    encode_values,
    flatten_side_state,
    parse_json,
    unpack,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_MB = 256.0
DEFAULT_MAX_DECODED_MB = 256.0
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_TIMEOUT_S = 60.0
DISCARD_LIMIT = 64 * 2**20
"""A body the server does not read (a refusal before it) is read and discarded up to this many bytes, so that the
connection stays usable and a client still sending reads the answer; a larger one closes the connection."""
_LENGTH = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() also accepts '²'


class _Refusal(Exception):
    """A request answered with an error status and a message."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class RewardServer:
    """Reward components behind ``GET /health``, ``GET /info`` and ``POST /score`` on ``host:port``.

    Args:
        rewards: the components served, each under its ``name``.
        host: the address to listen on (the loopback address by default).
        port: the port; 0 picks a free one (:attr:`url` tells which).
        max_request_bytes: bodies larger than this are refused (413) without being parsed.
        token: when set, ``GET /info`` and ``POST /score`` must carry ``Authorization: Bearer <token>``, exactly (401
            otherwise); ``GET /health`` needs none.
        max_decoded_bytes: a request whose arrays decode to more bytes than this, all together, is refused (413),
            from what their headers declare, before anything is decoded.
        max_connections: connections served at once; more wait in the listen backlog until one closes.
        timeout_s: a request must arrive whole within this many seconds of its first byte (408 or a closed
            connection otherwise), and a kept-alive connection idle this long is closed.
    """

    def __init__(
        self,
        rewards: Sequence[RewardComponent],
        host: str = "127.0.0.1",
        port: int = 0,
        max_request_bytes: int = int(DEFAULT_MAX_REQUEST_MB * 2**20),
        token: str | None = None,
        max_decoded_bytes: int = int(DEFAULT_MAX_DECODED_MB * 2**20),
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        names = [reward.name for reward in rewards]
        if not names:
            raise ValueError("a reward server needs at least one reward")
        if len(set(names)) != len(names):
            raise ValueError(f"served rewards need distinct names, got {names}")
        for label, value in (("max_request_bytes", max_request_bytes), ("max_decoded_bytes", max_decoded_bytes)):
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        if max_connections < 1 or not timeout_s > 0:
            raise ValueError(f"max_connections must be >= 1 and timeout_s > 0, got {max_connections}, {timeout_s}")
        for reward in rewards:
            reward.check_side_state()
        self.rewards = {reward.name: reward for reward in rewards}
        self.locks = {name: threading.Lock() for name in names}
        self.max_request_bytes = max_request_bytes
        self.max_decoded_bytes = max_decoded_bytes
        self.timeout_s = float(timeout_s)
        self.token = token
        self.httpd = _HTTPServer((host, port), _handler(self), max_connections)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RewardServer:
        """Serve on a background thread (tests, benchmarks, a notebook); :meth:`close` stops it."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="reward-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()
        for reward in self.rewards.values():
            close = getattr(reward, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ answers
    def info(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "limits": {
                "max_request_bytes": self.max_request_bytes,
                "max_decoded_bytes": self.max_decoded_bytes,
                "max_connections": self.httpd.max_connections,
                "timeout_s": self.timeout_s,
            },
            "rewards": [
                {
                    "name": name,
                    "scope": reward.scope,
                    "value_range": [bound if math.isfinite(bound) else None for bound in reward.value_range],
                    "side_state": list(reward.side_state),
                    "completions": list(reward.completion_kinds),
                }
                for name, reward in self.rewards.items()
            ],
        }

    def score(self, body: Any, blobs: Blobs | None = None) -> dict[str, Any]:
        """The answer to a ``POST /score`` document (and the blobs of its framed body); raises :class:`_Refusal` for a
        bad request or a failing reward."""
        try:
            name, completions, samples, group_size = decode_request(body, blobs, self.max_decoded_bytes)
        except RequestTooLarge as error:
            raise _Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(error)) from None
        except WireError as error:
            raise _Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
        reward = self._reward(name)
        started = time.perf_counter()
        with self.locks[reward.name]:
            before = reward.side_state_snapshot()
            try:
                raw = reward.collect(reward.score_async(completions, samples, group_size).result())
                values = torch.as_tensor(raw, dtype=torch.float64)
            except Exception as error:  # the reward's own failure: the client names it
                log.exception("reward %r failed on a batch of %d", reward.name, len(completions))
                raise _Refusal(
                    HTTPStatus.INTERNAL_SERVER_ERROR, f"reward {reward.name!r} raised {type(error).__name__}: {error}"
                ) from None
            side_state = flatten_side_state(reward.side_state_delta(before))
        if values.shape != (len(completions),):
            raise _Refusal(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                f"reward {reward.name!r} returned shape {list(values.shape)} for {len(completions)} completions",
            )
        return {
            "version": 1,
            "reward": reward.name,
            "values": encode_values(values),
            "side_state": side_state,
            "seconds": time.perf_counter() - started,
        }

    def _reward(self, name: str | None) -> RewardComponent:
        if name is None:
            if len(self.rewards) > 1:
                raise _Refusal(HTTPStatus.NOT_FOUND, f"this server serves {sorted(self.rewards)}: name one as reward")
            return next(iter(self.rewards.values()))
        if name not in self.rewards:
            raise _Refusal(HTTPStatus.NOT_FOUND, f"no reward {name!r} here; served: {sorted(self.rewards)}")
        return self.rewards[name]

    def authorised(self, header: str | None) -> bool:
        """Whether ``header`` is exactly ``Bearer <token>`` (compared in constant time)."""
        if self.token is None:
            return True
        return header is not None and hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())


class _HTTPServer(ThreadingHTTPServer):
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


def _handler(server: RewardServer) -> type[BaseHTTPRequestHandler]:
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
                raise _Refusal(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: GET /health, GET /info, POST /score")
            return server.info()

        def _post(self) -> dict[str, Any]:
            if self.path != "/score":
                raise _Refusal(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: POST /score")
            length = self._declared_length()
            if length is None:
                raise _Refusal(HTTPStatus.LENGTH_REQUIRED, "a request needs a Content-Length")
            if length > server.max_request_bytes:
                raise _Refusal(
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
                    raise _Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
            try:
                body = parse_json(raw, "the body")
            except WireError as error:
                raise _Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
            return server.score(body)

        def _declared_length(self) -> int | None:
            """The body's length; None without one. A refusal for a length that cannot be trusted: the connection
            then closes, since where the next request starts is unknown."""
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = True
                raise _Refusal(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length (no Transfer-Encoding)")
            lengths = self.headers.get_all("Content-Length") or []
            if len(lengths) > 1:
                self.close_connection = True
                raise _Refusal(HTTPStatus.BAD_REQUEST, f"a request has one Content-Length, got {len(lengths)}")
            if not lengths:
                return None
            if not _LENGTH.fullmatch(lengths[0].strip()):
                self.close_connection = True
                raise _Refusal(
                    HTTPStatus.BAD_REQUEST, f"Content-Length must be a number of bytes, got {lengths[0][:20]!r}"
                )
            return int(lengths[0])

        def _read_body(self, length: int) -> bytes:
            try:
                raw = self.rfile.read(length)
            except OSError:  # the deadline or the client gone: where the next request starts is unknown
                self.close_connection = True
                raise _Refusal(
                    HTTPStatus.REQUEST_TIMEOUT, f"the body did not arrive within {server.timeout_s:g} s"
                ) from None
            self.body_read = True
            if len(raw) != length:
                self.close_connection = True
                raise _Refusal(HTTPStatus.BAD_REQUEST, f"the body ended after {len(raw)} of {length} bytes")
            return raw

        def _settle_body(self) -> None:
            """After an answer: read and discard a body that was not read (bounded), or close the connection."""
            if self.body_read or self.close_connection:
                return
            try:
                length = self._declared_length()
            except _Refusal:
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
                    raise _Refusal(HTTPStatus.UNAUTHORIZED, "missing or wrong token (Authorization: Bearer ...)")
                status, payload = HTTPStatus.OK, make()
            except _Refusal as refusal:
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


class ServerProcess:
    """``python -m app.rewards.serve --config CONFIG --port 0`` in a child process, started and stopped from Python (a
    script, a notebook, a benchmark, a test): :attr:`url` is where it serves once the constructor returns.

    Args:
        config: the rewards YAML.
        pythonpath: folders put before ``PYTHONPATH`` in the child, for reward classes of modules outside the package.
        host: the address to listen on.

    The child's stderr goes to a temporary file (a pipe nobody reads would fill with its log and stop the server);
    :meth:`stop` returns the exit status and :attr:`log` holds what it wrote.
    """

    def __init__(
        self, config: str | os.PathLike, pythonpath: Sequence[str | os.PathLike] = (), host: str = "127.0.0.1"
    ):
        import subprocess
        import tempfile

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self._stderr = tempfile.TemporaryFile(mode="w+")
        command = [sys.executable, "-m", "app.rewards.serve", "--config", str(config), "--host", host, "--port", "0"]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.log = ""
        line = self.process.stdout.readline()  # "serving <names> on <url>", or nothing when it failed to start
        if " on http://" not in line:
            self.stop()
            why = self.log.strip()[-2000:] or f"it printed {line!r}"
            raise RuntimeError(f"the reward server did not start: {why}")
        self.url = line.rsplit(" on ", 1)[1].strip()

    def stop(self, timeout: float = 30.0) -> int:
        """Stop the server (SIGTERM) and wait for it; its exit status (0: it stopped cleanly)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.communicate(timeout=timeout)
        self._stderr.seek(0)
        self.log = self._stderr.read()
        self._stderr.close()
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        if not self._stderr.closed:
            self.stop()


# ---------------------------------------------------------------------------------------------------- the CLI
def _parser():
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="python -m app.rewards.serve",
        description="Serve reward components over HTTP for RemoteReward clients.",
        exit_on_error=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file with a rewards: list")
    parser.add_argument("--rewards", type=list[RewardComponent], required=True, help="the reward components served")
    parser.add_argument("--host", type=str, default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="the port (0: a free one, printed at start)")
    parser.add_argument("--max_request_mb", type=float, default=DEFAULT_MAX_REQUEST_MB, help="largest body accepted")
    parser.add_argument(
        "--max_decoded_mb",
        type=float,
        default=DEFAULT_MAX_DECODED_MB,
        help="largest decoded size of a request's arrays",
    )
    parser.add_argument(
        "--max_connections", type=int, default=DEFAULT_MAX_CONNECTIONS, help="connections served at once"
    )
    parser.add_argument(
        "--timeout_s", type=float, default=DEFAULT_TIMEOUT_S, help="seconds a request may take to arrive; idle close"
    )
    parser.add_argument("--token_env", type=str | None, default=None, help="require Authorization: Bearer $NAME")
    return parser


def main(argv: list[str] | None = None) -> None:
    from app.errors import describe_parse_error

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = parser.parse_args(argv)
        rewards = parser.instantiate(config).rewards
    except Exception as error:  # jsonargparse's parse and instantiation errors: a few lines, no traceback
        lines = describe_parse_error(str(error), command=None).splitlines()[:-1]
        sys.stderr.write("\n".join(lines) + "\nsee: python -m app.rewards.serve --help\n")
        raise SystemExit(2) from None
    token = None
    if config.token_env is not None:
        token = os.environ.get(config.token_env)
        if not token:
            sys.stderr.write(f"error: --token_env {config.token_env}: the variable is not set\n")
            raise SystemExit(2)
    try:
        server = RewardServer(
            rewards,
            config.host,
            config.port,
            int(config.max_request_mb * 2**20),
            token,
            max_decoded_bytes=int(config.max_decoded_mb * 2**20),
            max_connections=config.max_connections,
            timeout_s=config.timeout_s,
        )
    except (OSError, ValueError) as error:
        sys.stderr.write(f"error: cannot serve on {config.host}:{config.port}: {error}\n")
        raise SystemExit(2) from None

    def stop(signum, _frame) -> None:
        log.info("signal %d: stopping", signum)
        threading.Thread(target=server.httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"serving {', '.join(server.rewards)} on {server.url}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.close()


if __name__ == "__main__":
    main()
