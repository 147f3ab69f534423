"""A reward scored by a server in another process or on another machine (:mod:`app.rewards.serve`).

:class:`RemoteReward` is a :class:`~app.rewards.RewardComponent` whose :meth:`~RemoteReward.score` returns a future at
once: batches go to the server from the reward's own threads while the trainer goes on, so under ``pipeline.delay: 1``
the round trip overlaps the next rollout. In a training config it stands where the served reward would::

    rewards:
      - class_path: app.rewards.RemoteReward
        init_args: {url: "http://judge-host:8000", reward: accuracy, timeout_s: 120}

A failure is retried with exponential backoff (``backoff_s``, doubled per attempt): the server is down or refuses the
connection, it answers 5xx, 408 or 429, it is slower than ``timeout_s``, or its answer is not JSON, has the wrong
number of values, holds a value that is not a number, or is larger than ``max_response_mb``. Other 4xx answers (an
unknown reward, a wrong token, a request the server cannot read, a batch over its limits: 413) are configuration
errors and are not retried; a batch over the body limit the server reports in ``GET /info`` is refused before it is
sent. A kept-alive connection that the server closed while idle is replaced before it is used, not retried. When the
attempts run out, ``on_failure: raise`` (the default) fails the step with a :class:`~app.rewards.RewardError` naming the
reward, the server and the cause; ``on_failure: skip`` marks the batch's rows unscored
(:class:`~app.rewards.base.PartialScores`): the trainer leaves their groups out of the update and counts them in
``train/skipped_groups``. A failed batch never scores 0.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import select
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import torch
from torch import Tensor

from app.rewards.base import SCOPES, PartialScores, RewardComponent, RewardError
from app.rewards.wire import FRAMED_TYPE, Blobs, WireError, decode_side_state, decode_values, encode_request, pack
from app.types import VisualSample

log = logging.getLogger(__name__)

_RETRIED_STATUSES = {408, 429}  # and every 5xx


class _Retryable(Exception):
    """A failed attempt worth repeating (the server may recover)."""


class _Refused(Exception):
    """An answer that no repetition changes (a configuration error)."""


class RemoteRefusedError(RewardError):
    """The server refused the request for a reason no retry changes (an unknown reward, a wrong token, a request it
    cannot read): raised whatever ``on_failure`` says, since skipping would skip every batch."""


class _ServedScope:
    """``RemoteReward.scope``: ``completion`` on the class (what the reward contract checks), the served reward's scope
    on an instance, asked of the server the first time it is read (``GET /info``). The checks that refuse rewards
    comparing a group's rows (``grpo.group_ranks > 1``) then see what the server scores."""

    def __get__(self, instance: RemoteReward | None, owner: type) -> str:
        return "completion" if instance is None else instance.served_reward().scope


@dataclass(frozen=True)
class ServedReward:
    """What the server says of the reward it scores for this client (``GET /info``)."""

    name: str
    scope: str
    value_range: tuple[float, float]
    max_request_bytes: int | None = None  # the server's body limit (None: it does not say)


class RemoteReward(RewardComponent):
    """A reward that a server scores (``python -m app.rewards.serve``); the same values as the reward in-process.

    Its :attr:`scope` and :attr:`value_range` are the served reward's, asked of the server once (``GET /info``) when
    first needed: reading ``scope`` asks it.

    Attributes:
        num_requests: batches sent and answered.
        num_retries: attempts repeated after a failure.
        num_failed_requests: batches that failed every attempt.
        num_unscored: rows left unscored (``on_failure: skip``).
        server_counters: what the served reward's own side state gained on the server (``num_malformed``,
            ``failed_checks/<task>/<check>``, ...), summed over batches.

    Args:
        url: the server's address, ``http://host:port`` (``https://`` behind a TLS proxy).
        reward: the name of the served reward that scores (null: the only one the server serves).
        timeout_s: seconds one attempt may take, connecting and reading the whole answer.
        retries: attempts after the first before a batch fails.
        backoff_s: wait before the first retry; doubled for each further one.
        max_batch: completions per request; a batch is split into requests of whole groups of K. Rewards whose values
            depend on other rows (``group_pair``, ``triplet``) send the batch in one request.
        concurrency: requests in flight at once.
        headers_from_env: header name -> environment variable holding its value, read at each request (for
            example ``{Authorization: REWARD_SERVER_AUTH}`` with ``REWARD_SERVER_AUTH="Bearer <token>"``), so that
            no secret sits in a config.
        on_failure: ``raise`` fails the step with a ``RewardError``; ``skip`` leaves the batch's groups out of the
            update, counted and logged.
        max_response_mb: answers larger than this are refused (and retried).
        weight: weight in the total.
        name: log name; default: ``reward`` when given, else ``remote``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    side_state = ("num_requests", "num_retries", "num_failed_requests", "num_unscored", "server_counters")
    scope = _ServedScope()

    def __init__(
        self,
        url: str,
        reward: str | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_batch: int = 64,
        concurrency: int = 4,
        headers_from_env: dict[str, str] | None = None,
        on_failure: Literal["raise", "skip"] = "raise",
        max_response_mb: float = 64.0,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name if name is not None else reward, **kwargs)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"RemoteReward: url must be http://host:port or https://host:port, got {url!r}")
        for label, value, low in (("timeout_s", timeout_s, 0), ("max_response_mb", max_response_mb, 0)):
            if not value > low or not math.isfinite(value):
                raise ValueError(f"RemoteReward: {label} must be a positive number, got {value}")
        for label, value in (("retries", retries), ("max_batch", max_batch - 1), ("concurrency", concurrency - 1)):
            if value < 0:
                raise ValueError(f"RemoteReward: {label} must be at least {0 if label == 'retries' else 1}")
        if backoff_s < 0:
            raise ValueError(f"RemoteReward: backoff_s must be >= 0, got {backoff_s}")
        if on_failure not in ("raise", "skip"):
            raise ValueError(f"RemoteReward: on_failure must be 'raise' or 'skip', got {on_failure!r}")
        self.url = url.rstrip("/")
        self.reward = reward
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.backoff_s = float(backoff_s)
        self.max_batch = max_batch
        self.concurrency = concurrency
        self.headers_from_env = dict(headers_from_env or {})
        self.on_failure = on_failure
        self.max_response_bytes = int(max_response_mb * 2**20)
        self.num_requests = 0
        self.num_retries = 0
        self.num_failed_requests = 0
        self.num_unscored = 0
        self.server_counters: Counter[str] = Counter()
        self.served: ServedReward | None = None
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()  # one keep-alive connection per request thread
        self._batches: ThreadPoolExecutor | None = None  # encodes a batch and waits for its requests, in order
        self._requests: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__)
        for key in ("_lock", "_local", "_batches", "_requests"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._init_runtime()

    # ------------------------------------------------------------------------------------------- the contract
    def _grouping(self, group_size: int | None) -> dict[str, int]:
        return {"group_size": group_size} if group_size is not None else {}  # the served reward decides what it uses

    def score(
        self, completions: Sequence[Any], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> Future:
        """A future of the ``[N]`` values (or :class:`~app.rewards.base.PartialScores` under ``on_failure: skip``),
        scored by the server while the caller goes on."""
        if self._batches is None:
            self._batches = ThreadPoolExecutor(1, thread_name_prefix=f"remote-{self.name}")
        return self._batches.submit(self._score_batch, list(completions), list(samples), group_size)

    def start_on_own_workers(
        self, completions: Sequence[Any], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> Future:
        """:meth:`score`: the requests run on this reward's own threads, whatever executor the trainer has."""
        return self.score(completions, samples, group_size)

    def close(self) -> None:
        for pool in (self._batches, self._requests):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._batches = self._requests = None

    # ------------------------------------------------------------------------------------------------ a batch
    def _score_batch(
        self, completions: list[Any], samples: list[VisualSample], group_size: int | None
    ) -> Tensor | PartialScores:
        try:
            served = self.served_reward()
        except RemoteRefusedError:
            raise
        except RewardError as error:
            if self.on_failure == "raise":
                raise
            return self._unscored(torch.zeros(len(completions)), torch.ones(len(completions), dtype=torch.bool), error)
        if self._requests is None:
            self._requests = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"remote-{self.name}-http")
        spans = self._spans(len(completions), group_size, served.scope)
        futures = [
            self._requests.submit(self._score_span, completions[a:b], samples[a:b], group_size) for a, b in spans
        ]
        values = torch.zeros(len(completions), dtype=torch.float32)
        unscored = torch.zeros(len(completions), dtype=torch.bool)
        failure: Exception | None = None
        for (a, b), future in zip(spans, futures, strict=True):
            try:
                values[a:b] = future.result()
            except RewardError as error:
                if self.on_failure == "raise" or isinstance(error, RemoteRefusedError):
                    for other in futures:
                        other.cancel()
                    raise
                unscored[a:b] = True
                failure = error
        return self._unscored(values, unscored, failure) if unscored.any() else values

    def _unscored(self, values: Tensor, unscored: Tensor, error: Exception) -> PartialScores:
        with self._lock:
            self.num_unscored += int(unscored.sum())
        log.warning(
            "reward %r: %d of %d rows left unscored (%d so far): %s",
            self.name, int(unscored.sum()), len(unscored), self.num_unscored, error,
        )  # fmt: skip
        return PartialScores(values, unscored)

    def _spans(self, n: int, group_size: int | None, scope: str) -> list[tuple[int, int]]:
        """``(start, end)`` rows of each request: whole groups of K, at most ``max_batch`` rows (at least one group)."""
        if scope != "completion" or n == 0:
            return [(0, n)]
        step = self.max_batch
        if group_size is not None and group_size > 1:
            step = max(group_size, step - step % group_size)
        return [(a, min(a + step, n)) for a in range(0, n, step)]

    def _score_span(self, completions: list[Any], samples: list[VisualSample], group_size: int | None) -> Tensor:
        try:
            blobs = Blobs()
            body = pack(encode_request(self.served.name, completions, samples, group_size, blobs), blobs)
        except WireError as error:  # a sample the wire cannot carry (meta that is not JSON): a configuration error
            raise RemoteRefusedError(f"reward {self.name!r}: cannot send this batch to {self.url}: {error}") from None
        limit = self.served.max_request_bytes
        if limit is not None and len(body) > limit:
            self._count_failure()
            raise RemoteRefusedError(
                f"reward {self.name!r}: a request of {len(completions)} completions is {len(body)} bytes, over the "
                f"server's limit of {limit} (max_request_mb at {self.url}): lower max_batch"
            )

        def scored(answer: Any) -> Tensor:
            if not isinstance(answer, Mapping):
                raise WireError(f"the answer is not a JSON object: {str(answer)[:80]}")
            values = decode_values(answer.get("values"), len(completions))
            counters = decode_side_state(answer.get("side_state"))
            with self._lock:
                self.num_requests += 1
                if counters:
                    self.server_counters = self.server_counters + Counter(counters)  # a new object: see side_state
            return values

        return self._with_retries("POST", "/score", body, scored)

    def served_reward(self) -> ServedReward:
        """The served reward's name, scope and range (asked once, ``GET /info``); a ``RewardError`` when the server
        does not serve it."""
        if self.served is None:
            self.served = self._with_retries("GET", "/info", None, self._pick)
            self.value_range = self.served.value_range
            self._drop_connection()  # asked once: an idle connection would hold one of the server's slots
        return self.served

    def _pick(self, answer: Any) -> ServedReward:
        try:
            entries = {entry["name"]: entry for entry in answer["rewards"]}
        except (KeyError, TypeError) as error:
            raise WireError(f"GET /info answered without a rewards list ({error})") from None
        if self.reward is None and len(entries) != 1:
            raise _Refused(f"the server serves {sorted(entries)}: name one as reward")
        name = self.reward if self.reward is not None else next(iter(entries))
        if name not in entries:
            raise _Refused(f"the server does not serve {name!r}; it serves {sorted(entries)}")
        entry = entries[name]
        scope, value_range = entry.get("scope"), entry.get("value_range")
        if scope not in SCOPES or not isinstance(value_range, list) or len(value_range) != 2:
            raise WireError(f"GET /info: reward {name!r} has no valid scope and value_range: {entry}")
        low, high = (-math.inf if value_range[0] is None else value_range[0]), value_range[1]
        limits = answer.get("limits") if isinstance(answer, Mapping) else None
        limit = limits.get("max_request_bytes") if isinstance(limits, Mapping) else None
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
        return ServedReward(name, scope, (float(low), math.inf if high is None else float(high)), limit)

    # ------------------------------------------------------------------------------------------------ requests
    def _with_retries(self, method: str, path: str, body: bytes | None, read):
        """``read(answer)`` of the first attempt that gives a readable answer, else a ``RewardError`` naming the
        cause of the last one."""
        attempts = self.retries + 1
        for attempt in range(attempts):
            try:
                return read(self._exchange(method, path, body))
            except _Refused as refusal:
                self._count_failure()
                raise RemoteRefusedError(
                    f"reward {self.name!r}: {self.url}{path} refused the request: {refusal}"
                ) from None
            except (_Retryable, WireError) as failure:
                cause = failure
            if attempt + 1 < attempts:
                with self._lock:
                    self.num_retries += 1
                wait = self.backoff_s * 2**attempt
                log.warning(
                    "reward %r: %s %s%s failed (%s); retry %d of %d in %.2g s",
                    self.name, method, self.url, path, cause, attempt + 1, self.retries, wait,
                )  # fmt: skip
                time.sleep(wait)
        self._count_failure()
        raise RewardError(f"reward {self.name!r}: {method} {self.url}{path} failed {attempts} time(s); last: {cause}")

    def _count_failure(self) -> None:
        with self._lock:
            self.num_failed_requests += 1

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": FRAMED_TYPE, "Accept": "application/json"}
        for header, variable in self.headers_from_env.items():
            value = os.environ.get(variable)
            if value is None:
                raise _Refused(f"the environment variable {variable} (for the {header} header) is not set")
            headers[header] = value
        return headers

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is not None and _closed_by_server(connection):
            self._drop_connection()  # the server closed it while it was idle: a new one, not a failed attempt
            connection = None
        if connection is None:
            parts = urlsplit(self.url)
            kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            connection = self._local.connection = kind(parts.hostname, parts.port, timeout=self.timeout_s)
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _exchange(self, method: str, path: str, body: bytes | None) -> Any:
        """One attempt: the parsed JSON of a 200 answer; :class:`_Retryable` or :class:`_Refused` otherwise."""
        deadline = time.monotonic() + self.timeout_s
        headers = self._headers()
        prefix = urlsplit(self.url).path
        connection = self._connection()
        try:
            try:
                connection.request(method, prefix + path, body=body, headers=headers)
            except (BrokenPipeError, ConnectionResetError) as error:
                response = _early_answer(connection, error)  # a server may answer before the whole body (413)
            else:
                response = connection.getresponse()
            data = self._read(response, deadline)
        except TimeoutError:
            self._drop_connection()
            raise _Retryable(f"no answer within timeout_s = {self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            self._drop_connection()
            raise _Retryable(f"{type(error).__name__}: {error or 'connection lost'}") from None
        if response.status != 200:
            message = _error_message(data)
            if response.status >= 500 or response.status in _RETRIED_STATUSES:
                raise _Retryable(f"HTTP {response.status}: {message}")
            raise _Refused(f"HTTP {response.status}: {message}")
        try:
            return json.loads(data, parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as error:
            raise WireError(f"the answer is not JSON ({error}): {data[:80]!r}") from None

    def _read(self, response: http.client.HTTPResponse, deadline: float) -> bytes:
        """The answer's body, at most ``max_response_mb``, before ``deadline``."""
        length = response.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > self.max_response_bytes:
            self._drop_connection()
            raise _Retryable(f"the answer is {int(length)} bytes, over max_response_mb ({self.max_response_bytes} B)")
        chunks, size = [], 0
        while True:
            chunk = response.read(min(1 << 16, self.max_response_bytes + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_response_bytes:
                self._drop_connection()
                raise _Retryable(f"the answer is over max_response_mb ({self.max_response_bytes} B)")
            if time.monotonic() > deadline:
                self._drop_connection()
                raise TimeoutError


def _closed_by_server(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection was closed by the server (readable before a request: EOF or a reset)."""
    sock = connection.sock
    if sock is None:
        return False
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _early_answer(connection: http.client.HTTPConnection, error: OSError) -> http.client.HTTPResponse:
    """The answer a server sent before it stopped reading the body (a 413); ``error`` again when there is none."""
    try:
        return connection.getresponse()
    except (OSError, http.client.HTTPException):
        raise error from None


def _no_constant(token: str) -> None:
    raise ValueError(f"{token} is not a JSON number")


def _error_message(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"])[:300]
    except (ValueError, KeyError, TypeError):
        return data[:200].decode("utf-8", "replace") or "(no body)"
