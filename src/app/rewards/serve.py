"""Serve reward components over HTTP, for :class:`~app.rewards.remote.RemoteReward` clients on other processes or
machines (a judge or a scorer farm that does not fit beside the policy).

    python -m app.rewards.serve --config rewards.yaml --port 8000

``rewards.yaml`` holds the same blocks as a training config's ``model.init_args.rewards``::

    rewards:
      - class_path: app.rewards.AccuracyReward
      - class_path: app.tasks.vbvr.VBVRScorerReward
        init_args: {num_workers: 4}

Each request is one batch, scored by one served reward (the wire format: :mod:`app.rewards.wire`). Connections are
served on threads; one reward scores one batch at a time (its side-state counters are per batch), so a reward that is
CPU-bound scales with its own workers (``VBVRScorerReward.num_workers``) or with more servers. ``--token_env NAME``
makes the server require ``Authorization: Bearer <the value of $NAME>``. The standard library's HTTP server is all it
needs: put a TLS proxy in front of it to expose it beyond a trusted network.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from app.rewards.base import RewardComponent
from app.rewards.wire import FRAMED_TYPE, Blobs, WireError, decode_request, encode_values, flatten_side_state, unpack

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_MB = 256.0


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
        max_request_bytes: bodies larger than this are refused (413) without being read.
        token: when set, requests must carry ``Authorization: Bearer <token>`` (401 otherwise).
    """

    def __init__(
        self,
        rewards: Sequence[RewardComponent],
        host: str = "127.0.0.1",
        port: int = 0,
        max_request_bytes: int = int(DEFAULT_MAX_REQUEST_MB * 2**20),
        token: str | None = None,
    ) -> None:
        names = [reward.name for reward in rewards]
        if not names:
            raise ValueError("a reward server needs at least one reward")
        if len(set(names)) != len(names):
            raise ValueError(f"served rewards need distinct names, got {names}")
        for reward in rewards:
            reward.check_side_state()
        self.rewards = {reward.name: reward for reward in rewards}
        self.locks = {name: threading.Lock() for name in names}
        self.max_request_bytes = max_request_bytes
        self.token = token
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
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
            "rewards": [
                {
                    "name": name,
                    "scope": reward.scope,
                    "value_range": [bound if math.isfinite(bound) else None for bound in reward.value_range],
                    "side_state": list(reward.side_state),
                }
                for name, reward in self.rewards.items()
            ]
        }

    def score(self, body: Any, blobs: Blobs | None = None) -> dict[str, Any]:
        """The answer to a ``POST /score`` document (and the blobs of its framed body); raises :class:`_Refusal` for a
        bad request or a failing reward."""
        try:
            name, completions, samples, group_size = decode_request(body, blobs)
        except WireError as error:
            raise _Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
        reward = self._reward(name)
        started = time.perf_counter()
        with self.locks[reward.name]:
            before = reward.side_state_snapshot()
            try:
                raw = reward.collect(reward.score_async(completions, samples, group_size).result())
            except Exception as error:  # the reward's own failure: the client names it
                log.exception("reward %r failed on a batch of %d", reward.name, len(completions))
                raise _Refusal(
                    HTTPStatus.INTERNAL_SERVER_ERROR, f"reward {reward.name!r} raised {type(error).__name__}: {error}"
                ) from None
            side_state = flatten_side_state(reward.side_state_delta(before))
        values = torch.as_tensor(raw, dtype=torch.float64)
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
        if self.token is None:
            return True
        return header is not None and hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())


def _handler(server: RewardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection for every batch
        disable_nagle_algorithm = True  # headers and body go out as two writes: without it each answer waits ~40 ms

        def do_GET(self) -> None:
            self._answer(lambda: {"ok": True} if self.path == "/health" else self._get())

        def do_POST(self) -> None:
            self._answer(self._post)

        def _get(self) -> dict[str, Any]:
            if self.path != "/info":
                raise _Refusal(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: GET /health, GET /info, POST /score")
            return server.info()

        def _post(self) -> dict[str, Any]:
            if self.path != "/score":
                raise _Refusal(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: POST /score")
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise _Refusal(HTTPStatus.LENGTH_REQUIRED, "a request needs a Content-Length")
            if int(length) > server.max_request_bytes:
                self.close_connection = True  # the body is not read
                raise _Refusal(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"the body is {int(length)} bytes, over this server's limit of {server.max_request_bytes}",
                )
            raw = self.rfile.read(int(length))
            try:
                if self.headers.get("Content-Type", "").startswith(FRAMED_TYPE):
                    return server.score(*unpack(raw))
                body = json.loads(raw)
            except WireError as error:
                raise _Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise _Refusal(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {error}") from None
            return server.score(body)

        def _answer(self, make) -> None:
            try:
                if not server.authorised(self.headers.get("Authorization")):
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
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

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
        server = RewardServer(rewards, config.host, config.port, int(config.max_request_mb * 2**20), token)
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
