"""RemoteReward (app.rewards.remote) against real servers on the loopback address: the values of the reward in-process,
a future that does not wait for the server, batches split into whole groups, and every failure mode (down, 5xx,
slow, malformed, wrong length, NaN, oversized, dropped) retried, then failed with a named RewardError or skipped."""

import json
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from jsonargparse import ArgumentParser
from prompt_samples import prompts
from served_rewards import CountingReward

from app.rewards import AccuracyReward, FormatReward, RemoteReward, RewardComponent, RewardError, WeightedReward
from app.rewards.base import PartialScores
from app.rewards.groups import split_groups
from app.rewards.remote import RemoteRefusedError
from app.rewards.serve import RewardServer
from app.rewards.wire import unpack
from app.types import VisualSample

K = 2
COMPLETIONS = [
    "<think>a</think><answer>yes</answer>",
    "<answer>no</answer>",
    "<think>b</think><answer>no</answer>",
    "no",
    "<think>c</think><answer>yes</answer>",
    "<answer>yes</answer>",
]


def scored_samples():
    """Three prompts, each repeated K times (as the trainer hands them to rewards)."""
    return [s for s in prompts(3, "Is {i} even?", ("demo",), answers=("yes", "no")) for _ in range(K)]


class PixelMean(RewardComponent):
    """The mean of a rendering's values in float64: any change to a single value on the way changes the score."""

    value_range = (0.0, 1.0)

    def score(self, completions, samples):
        return torch.tensor([float(np.asarray(c, dtype=np.float64).mean()) for c in completions])


class GroupSpread(RewardComponent):
    """Each row scores the spread of its group's lengths (a reward that reads whole groups, handed K)."""

    scope = "group_pair"
    value_range = (0.0, 100.0)

    def score(self, completions, samples, group_size=None):
        lengths = torch.tensor([float(len(c)) for c in completions])
        return torch.cat(
            [(lengths[g].max() - lengths[g].min()).expand(g.stop - g.start) for g in split_groups(samples, group_size)]
        )


class ScriptedServer:
    """A real reward server behind a handler that first plays the queued faults, one per ``POST /score``.

    Faults: ``500`` (an error answer), ``slow`` (answers after ``slow_s``), ``not-json``, ``short`` (one value
    missing), ``nan`` (a bare NaN token), ``oversized`` (a Content-Length over the client's limit), ``unsized`` (a
    large body without a length), ``drop`` (closes the connection without an answer), ``hold`` (waits for
    :attr:`release`)."""

    def __init__(self, rewards, slow_s=1.0):
        self.inner = RewardServer(rewards)
        self.faults: list[str] = []
        self.requests = 0
        self.slow_s = slow_s
        self.release = threading.Event()
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self._send(200, json.dumps(scripted.inner.info()).encode())

            def do_POST(self):
                document, blobs = unpack(self.rfile.read(int(self.headers["Content-Length"])))
                scripted.requests += 1
                fault = scripted.faults.pop(0) if scripted.faults else None
                if fault == "drop":
                    self.close_connection = True
                    return
                if fault == "hold":
                    scripted.release.wait(10)
                if fault == "slow":
                    time.sleep(scripted.slow_s)
                if fault == "500":
                    return self._send(500, b'{"error": "the scorer ran out of memory"}')
                answer = scripted.inner.score(document, blobs)
                if fault == "short":
                    answer["values"] = answer["values"][:-1]
                data = json.dumps(answer).encode()
                if fault == "not-json":
                    data = b"<html>502 Bad Gateway</html>"
                if fault == "nan":
                    answer["values"][0] = float("nan")
                    data = json.dumps(answer).encode()  # Python writes the bare NaN token
                if fault == "oversized":
                    return self._send(200, data, length=str(10**9))
                if fault == "unsized":
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data + b" " * 300_000)
                    self.close_connection = True
                    return
                self._send(200, data)

            def _send(self, status, data, length=None):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if length is None:
                    self.wfile.write(data)
                else:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    server = ScriptedServer([AccuracyReward(), FormatReward(), PixelMean(), GroupSpread()])
    yield server
    server.close()


@pytest.fixture
def served():
    with RewardServer([AccuracyReward(), FormatReward(), PixelMean(), GroupSpread()]) as server:
        yield server


def remote(url, reward="accuracy", **options):
    return RemoteReward(url, reward, **{"retries": 2, "backoff_s": 0.0, "timeout_s": 5.0, **options})


# ------------------------------------------------------------------------------------------- the same values
def test_a_remote_reward_gives_the_values_of_the_reward_in_process(served):
    local = WeightedReward([AccuracyReward(), FormatReward(weight=0.5)])(COMPLETIONS, scored_samples(), group_size=K)
    rewards = WeightedReward([remote(served.url), remote(served.url, "format", weight=0.5)])
    out = rewards.gather(rewards.submit(COMPLETIONS, scored_samples(), group_size=K))
    assert torch.equal(out.total, local.total) and out.unscored is None
    assert all(torch.equal(out.components[n], local.components[n]) for n in ("accuracy", "format"))
    assert rewards.names == ["accuracy", "format"]  # logged under the served rewards' names


def test_renderings_reach_the_server_bit_for_bit(served):
    generator = torch.Generator().manual_seed(0)
    renderings = [torch.rand(3, 8, 8, generator=generator), torch.rand(4, 3, 8, 8, generator=generator)]
    renderings.append((torch.rand(8, 8, 3, generator=generator) * 255).to(torch.uint8).numpy())
    samples = [VisualSample([], "draw", "demo")] * 3
    got = remote(served.url, "pixel_mean").checked_score(renderings, samples)[0]
    assert torch.equal(got, PixelMean().checked_score(renderings, samples)[0])


def test_batches_go_as_requests_of_whole_groups_and_group_rewards_in_one(scripted):
    reward = remote(scripted.url, max_batch=3)  # 3 rows round down to one group of K = 2 per request
    assert torch.equal(
        reward.checked_score(COMPLETIONS, scored_samples(), K)[0], AccuracyReward().score(COMPLETIONS, scored_samples())
    )
    assert scripted.requests == 3 and reward.num_requests == 3
    spread = remote(scripted.url, "group_spread", max_batch=2)
    assert torch.equal(
        spread.checked_score(COMPLETIONS, scored_samples(), K)[0], GroupSpread().score(COMPLETIONS, scored_samples(), K)
    )
    assert scripted.requests == 4  # group rewards see the whole batch at once


def test_score_returns_a_future_before_the_server_answers(scripted):
    reward = remote(scripted.url)
    reward.served_reward()  # asked once, before the first batch
    scripted.faults = ["hold"]
    future = reward.score_async(COMPLETIONS, scored_samples(), K)
    time.sleep(0.05)
    assert not future.done()  # the server is still holding the request
    scripted.release.set()
    assert torch.equal(future.result(timeout=10), AccuracyReward().score(COMPLETIONS, scored_samples()))


def test_a_remote_reward_takes_the_served_reward_s_scope_and_range(served):
    spread = remote(served.url, "group_spread")
    assert RemoteReward.scope == "completion"  # the class, before any server is asked
    assert spread.scope == "group_pair" and spread.value_range == (0.0, 100.0)
    assert remote(served.url).scope == "completion"


def test_the_served_reward_s_side_state_comes_back_into_the_client_s_counters():
    with RewardServer([CountingReward()]) as server:
        reward = RemoteReward(server.url, max_batch=2)
        reward.checked_score(["1", "x", "y", "2", "z"], [VisualSample([], "?", "demo")] * 5)
    assert reward.server_counters == {"num_malformed": 3.0} and reward.num_requests == 3
    assert reward.name == "remote"  # the served reward unnamed: the default name


# ----------------------------------------------------------------------------------------------- failures
FAULTS = ["500", "slow", "not-json", "short", "nan", "oversized", "unsized", "drop"]
CAUSES = {
    "500": "HTTP 500: the scorer ran out of memory",
    "slow": "no answer within timeout_s = 0.3 s",
    "not-json": "the answer is not JSON",
    "short": "the answer has 5 values for 6 completions",
    "nan": "NaN is not a JSON number",
    "oversized": "the answer is 1000000000 bytes, over max_response_mb",
    "unsized": "the answer is over max_response_mb",
    "drop": "RemoteDisconnected",
}
OPTIONS = {"timeout_s": 0.3, "max_response_mb": 0.1}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_attempt_is_retried_and_the_next_one_scores(scripted, fault):
    scripted.slow_s = 0.6
    reward = remote(scripted.url, **OPTIONS)
    scripted.faults = [fault]
    values, _ = reward.checked_score(COMPLETIONS, scored_samples(), K)
    assert torch.equal(values, AccuracyReward().score(COMPLETIONS, scored_samples()))
    assert reward.num_retries == 1 and reward.num_failed_requests == 0


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_that_persists_fails_the_step_naming_the_reward_the_server_and_the_cause(scripted, fault):
    scripted.slow_s = 0.6
    rewards = WeightedReward([remote(scripted.url, **OPTIONS)])
    scripted.faults = [fault] * 3
    with pytest.raises(RewardError) as error:
        rewards.gather(rewards.submit(COMPLETIONS, scored_samples(), group_size=K))
    message = str(error.value)
    assert message.startswith(f"reward 'accuracy': POST {scripted.url}/score failed 3 time(s); last: "), message
    assert CAUSES[fault] in message and "\n" not in message
    assert (
        error.value.__cause__ is None and error.value.__suppress_context__ is False or error.value.__context__ is None
    )
    assert rewards.components[0].num_failed_requests == 1 and rewards.components[0].num_retries == 2


def test_a_server_that_is_down_fails_after_its_retries(scripted):
    scripted.close()
    with pytest.raises(
        RewardError, match=r"GET http://127\.0\.0\.1:\d+/info failed 3 time\(s\); last: ConnectionRefused"
    ):
        remote(scripted.url).checked_score(COMPLETIONS, scored_samples(), K)


def test_backoff_doubles_between_attempts(scripted, monkeypatch):
    waits = []
    monkeypatch.setattr("app.rewards.remote.time.sleep", waits.append)
    scripted.faults = ["500"] * 4
    with pytest.raises(RewardError):
        RemoteReward(scripted.url, "accuracy", retries=3, backoff_s=0.25).checked_score(
            COMPLETIONS, scored_samples(), K
        )
    assert waits == [0.25, 0.5, 1.0]


def test_a_refusal_is_not_retried_and_names_what_the_server_said(served):
    with pytest.raises(RemoteRefusedError, match=r"does not serve 'acuracy'; it serves \['accuracy', "):
        remote(served.url, "acuracy").checked_score(COMPLETIONS, scored_samples(), K)
    with pytest.raises(RemoteRefusedError, match=r"serves \['accuracy', .*\]: name one as reward"):
        remote(served.url, None).checked_score(COMPLETIONS, scored_samples(), K)


def test_on_failure_skip_marks_the_failed_request_s_rows_unscored_and_never_scores_them_0(scripted):
    reward = remote(scripted.url, on_failure="skip", max_batch=4, retries=0, concurrency=1)  # requests in order
    reward.served_reward()
    scripted.faults = [None, "500"]  # rows 0-3 are scored, rows 4-5 fail
    rewards = WeightedReward([reward, FormatReward()])
    out = rewards.gather(rewards.submit(COMPLETIONS, scored_samples(), group_size=K))
    assert out.unscored.tolist() == [False] * 4 + [True] * 2
    assert torch.equal(out.components["accuracy"][:4], AccuracyReward().score(COMPLETIONS[:4], scored_samples()[:4]))
    assert reward.num_unscored == 2 and rewards.num_nonfinite == 0


def test_on_failure_skip_leaves_everything_unscored_when_the_server_is_down(scripted):
    scripted.close()
    raw = remote(scripted.url, on_failure="skip", retries=0).score(COMPLETIONS, scored_samples(), K).result()
    assert isinstance(raw, PartialScores) and raw.unscored.all()


def test_on_failure_skip_still_fails_on_a_refusal_that_every_batch_would_meet(served):
    with pytest.raises(RemoteRefusedError, match="does not serve 'nothing'"):
        remote(served.url, "nothing", on_failure="skip").checked_score(COMPLETIONS, scored_samples(), K)


def test_headers_come_from_the_environment_at_each_request(monkeypatch):
    with RewardServer([AccuracyReward()], token="s3cret") as server:
        reward = RemoteReward(server.url, headers_from_env={"Authorization": "REWARD_AUTH"}, retries=0)
        monkeypatch.delenv("REWARD_AUTH", raising=False)
        with pytest.raises(RemoteRefusedError, match="the environment variable REWARD_AUTH .* is not set"):
            reward.checked_score(COMPLETIONS, scored_samples(), K)
        monkeypatch.setenv("REWARD_AUTH", "Bearer wrong")
        with pytest.raises(RemoteRefusedError, match="HTTP 401: missing or wrong token"):
            reward.checked_score(COMPLETIONS, scored_samples(), K)
        monkeypatch.setenv("REWARD_AUTH", "Bearer s3cret")
        assert torch.equal(
            reward.checked_score(COMPLETIONS, scored_samples(), K)[0],
            AccuracyReward().score(COMPLETIONS, scored_samples()),
        )


def test_a_413_is_a_refusal_no_retry_changes_whether_the_body_or_its_arrays_are_too_large():
    renderings = [torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(0)) for _ in range(4)]
    samples = [VisualSample([], "draw", "demo")] * 4
    with RewardServer([PixelMean()], max_decoded_bytes=10_000) as server:  # 4 x 3 KB of float32 decoded
        reward = remote(server.url, "pixel_mean")
        with pytest.raises(RemoteRefusedError, match=r"HTTP 413: rows\[3\]\.completion: an array of 3072 bytes"):
            reward.checked_score(renderings, samples)
        assert reward.num_retries == 0 and reward.num_failed_requests == 1
        reward.served_reward()
        server.max_decoded_bytes, server.max_request_bytes = 10**9, 1_000  # lowered after the client asked /info
        with pytest.raises(RemoteRefusedError, match=r"HTTP 413: the body is \d+ bytes, over this server's limit"):
            reward.checked_score(renderings, samples)  # the body was sent whole: the 413 read, not a broken pipe
        assert reward.num_retries == 0


def test_a_batch_over_the_server_s_body_limit_is_refused_before_it_is_sent():
    with RewardServer([PixelMean()], max_request_bytes=5_000) as server:
        reward = remote(server.url, "pixel_mean", max_batch=8)
        with pytest.raises(RemoteRefusedError, match=r"is \d+ bytes, over the server's limit of 5000 \(max_request"):
            reward.checked_score([torch.zeros(3, 32, 32)] * 2, [VisualSample([], "draw", "demo")] * 2)
        assert reward.num_requests == 0 and reward.num_retries == 0


def test_a_kept_alive_connection_the_server_closed_while_idle_is_replaced_without_a_retry():
    with RewardServer([AccuracyReward()], timeout_s=0.2) as server:
        reward = remote(server.url)
        reward.checked_score(COMPLETIONS, scored_samples(), K)
        time.sleep(0.5)  # the server closes the idle connection
        values, _ = reward.checked_score(COMPLETIONS, scored_samples(), K)
    assert torch.equal(values, AccuracyReward().score(COMPLETIONS, scored_samples()))
    assert reward.num_retries == 0 and reward.num_requests == 2


# ---------------------------------------------------------------------------------------------- configuration
def test_a_remote_reward_parses_from_yaml_as_a_reward_component():
    parser = ArgumentParser()
    parser.add_argument("--rewards", type=list[RewardComponent])
    config = parser.parse_string(
        "rewards:\n  - class_path: app.rewards.RemoteReward\n"
        "    init_args: {url: 'http://judge:8000', reward: accuracy, on_failure: skip, max_batch: 32}\n"
    )
    (reward,) = parser.instantiate(config).rewards
    assert isinstance(reward, RemoteReward) and (reward.name, reward.on_failure, reward.max_batch) == (
        "accuracy",
        "skip",
        32,
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"url": "judge:8000"}, "url must be http://host:port"),
        ({"timeout_s": 0}, "timeout_s must be a positive number"),
        ({"max_batch": 0}, "max_batch must be at least 1"),
        ({"retries": -1}, "retries must be at least 0"),
        ({"on_failure": "ignore"}, "on_failure must be 'raise' or 'skip'"),
    ],
)
def test_bad_options_are_refused_when_the_reward_is_built(options, message):
    with pytest.raises(ValueError, match=message):
        RemoteReward(**{"url": "http://127.0.0.1:1", **options})


def test_a_remote_reward_pickles_before_and_after_scoring_and_the_copy_scores(served):
    reward = remote(served.url)
    reward.checked_score(COMPLETIONS, scored_samples(), K)
    copy = pickle.loads(pickle.dumps(reward))
    assert copy.num_requests == 1 and torch.equal(
        copy.checked_score(COMPLETIONS, scored_samples(), K)[0],
        reward.checked_score(COMPLETIONS, scored_samples(), K)[0],
    )
