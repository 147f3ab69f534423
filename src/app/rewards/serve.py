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
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import torch

from app.rewards.base import RewardComponent
from app.rewards.http_server import BoundedHTTPServer, Refusal, handler_for
from app.rewards.wire import (
    VERSION,
    Blobs,
    RequestTooLarge,
    WireError,
    decode_request,
    encode_values,
    flatten_side_state,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_MB = 256.0
DEFAULT_MAX_DECODED_MB = 256.0
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_TIMEOUT_S = 60.0


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
        self.httpd = BoundedHTTPServer((host, port), handler_for(self), max_connections)
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
        """The answer to a ``POST /score`` document (and the blobs of its framed body); raises :class:`Refusal` for a
        bad request or a failing reward."""
        try:
            name, completions, samples, group_size = decode_request(body, blobs, self.max_decoded_bytes)
        except RequestTooLarge as error:
            raise Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(error)) from None
        except WireError as error:
            raise Refusal(HTTPStatus.BAD_REQUEST, str(error)) from None
        reward = self._reward(name)
        started = time.perf_counter()
        with self.locks[reward.name]:
            before = reward.side_state_snapshot()
            try:
                raw = reward.collect(reward.score_async(completions, samples, group_size).result())
                values = torch.as_tensor(raw, dtype=torch.float64)
            except Exception as error:  # the reward's own failure: the client names it
                log.exception("reward %r failed on a batch of %d", reward.name, len(completions))
                raise Refusal(
                    HTTPStatus.INTERNAL_SERVER_ERROR, f"reward {reward.name!r} raised {type(error).__name__}: {error}"
                ) from None
            side_state = flatten_side_state(reward.side_state_delta(before))
        if values.shape != (len(completions),):
            raise Refusal(
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
                raise Refusal(HTTPStatus.NOT_FOUND, f"this server serves {sorted(self.rewards)}: name one as reward")
            return next(iter(self.rewards.values()))
        if name not in self.rewards:
            raise Refusal(HTTPStatus.NOT_FOUND, f"no reward {name!r} here; served: {sorted(self.rewards)}")
        return self.rewards[name]

    def authorised(self, header: str | None) -> bool:
        """Whether ``header`` is exactly ``Bearer <token>`` (compared in constant time)."""
        if self.token is None:
            return True
        return header is not None and hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())


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
    from app.command_line.error_messages import describe_parse_error

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
