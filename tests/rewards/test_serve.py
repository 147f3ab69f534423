"""The reward server (app.rewards.serve) on the loopback address: what it answers, how it refuses, and its command
line, started as its own process."""

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from app.rewards import AccuracyReward, FormatReward, RewardComponent
from app.rewards.serve import RewardServer, ServerProcess
from app.rewards.wire import encode_request
from app.types import VisualSample

ROOT = Path(__file__).resolve().parents[2]


class CountingReward(RewardComponent):
    """1 for completions that are digits; counts the others in its side state, and raises on the text ``boom``."""

    side_state = ("num_malformed",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.num_malformed = 0

    def score(self, completions, samples):
        if "boom" in completions:
            raise RuntimeError("the scorer fell over")
        self.num_malformed += sum(not c.isdigit() for c in completions)
        return torch.tensor([1.0 if c.isdigit() else float("nan") if c == "nan" else 0.0 for c in completions])


def prompt(answer="yes"):
    return VisualSample([], "Is it?", "demo", answer=answer)


def post(url, payload, headers=None, raw=None):
    data = raw if raw is not None else json.dumps(payload).encode()
    request = urllib.request.Request(
        url + "/score", data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def server():
    with RewardServer([AccuracyReward(), FormatReward(), CountingReward()], max_request_bytes=20_000) as running:
        yield running


def test_health_and_info_list_each_served_reward_with_its_scope_and_range(server):
    assert get(server.url, "/health") == {"ok": True}
    info = {entry["name"]: entry for entry in get(server.url, "/info")["rewards"]}
    assert list(info) == ["accuracy", "format", "counting"]
    assert info["accuracy"]["scope"] == "completion" and info["accuracy"]["value_range"] == [0.0, 1.0]
    assert info["counting"]["side_state"] == ["num_malformed"]


def test_a_batch_gets_the_values_of_the_reward_in_process(server):
    completions = ["<think>a</think><answer>yes</answer>", "<answer>no</answer>", "yes"]
    samples = [prompt()] * 3
    for name, reward in (("accuracy", AccuracyReward()), ("format", FormatReward())):
        status, answer = post(server.url, encode_request(name, completions, samples, None))
        assert status == 200 and answer["reward"] == name
        assert answer["values"] == reward.score(completions, samples).tolist()


def test_the_answer_carries_what_the_reward_s_side_state_gained_and_its_non_finite_values_as_null(server):
    status, answer = post(server.url, encode_request("counting", ["1", "x", "nan", "2"], [prompt()] * 4, None))
    assert status == 200
    assert answer["values"] == [1.0, 0.0, None, 1.0] and answer["side_state"] == {"num_malformed": 2.0}
    status, answer = post(server.url, encode_request("counting", ["3"], [prompt()], None))
    assert answer["side_state"] == {}  # this batch's increments only
    assert server.rewards["counting"].num_malformed == 2  # the server's own reward keeps the totals


@pytest.mark.parametrize(
    "payload, raw, status, message",
    [
        ({"reward": "acuracy"}, None, 404, "no reward 'acuracy' here; served: \\['accuracy', 'counting', 'format'\\]"),
        ({"reward": None}, None, 404, "this server serves .*: name one as reward"),
        ({"version": 0}, None, 400, "version must be 1"),
        (None, b"{not json", 400, "the body is not JSON"),
        ({"rows": [{"sample": 0}]}, None, 400, r"rows\[0\] must be \{'sample': index, 'completion': ...\}"),
        (None, b"x" * 30_000, 413, "the body is 30000 bytes, over this server's limit of 20000"),
        ({"reward": "counting", "rows": [{"sample": 0, "completion": {"text": "boom"}}]}, None, 500,
         "reward 'counting' raised RuntimeError: the scorer fell over"),
    ],
    ids=["unknown-reward", "unnamed-reward", "version", "not-json", "bad-row", "too-large", "reward-raised"],
)  # fmt: skip
def test_a_bad_request_is_refused_with_a_status_and_a_message(server, payload, raw, status, message):
    body = encode_request("accuracy", ["<answer>yes</answer>"], [prompt()], None)
    body.update(payload or {})
    got, answer = post(server.url, body, raw=raw)
    assert got == status and set(answer) == {"error"}
    assert __import__("re").search(message, answer["error"]), answer["error"]
    assert get(server.url, "/health") == {"ok": True}  # and it goes on serving


def test_with_a_token_only_requests_that_carry_it_are_served():
    body = encode_request(None, ["1"], [prompt()], None)
    with RewardServer([CountingReward()], token="s3cret") as server:
        assert post(server.url, body)[0] == 401
        assert post(server.url, body, {"Authorization": "Bearer wrong"})[0] == 401
        assert post(server.url, body, {"Authorization": "Bearer s3cret"}) == (
            200,
            {"version": 1, "reward": "counting", "values": [1.0], "side_state": {}, "seconds": pytest.approx(0, abs=5)},
        )


class Unbounded(RewardComponent):
    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([float(len(c)) for c in completions])


def test_an_unbounded_range_travels_as_null_and_the_client_reads_it_back():
    from app.rewards import RemoteReward  # noqa: PLC0415

    with RewardServer([Unbounded()]) as server:
        assert get(server.url, "/info")["rewards"][0]["value_range"] == [0.0, None]
        reward = RemoteReward(server.url)
        assert reward.checked_score(["abc"], [prompt()])[0].tolist() == [3.0]
        assert reward.value_range == (0.0, float("inf"))


def test_served_rewards_need_distinct_names():
    with pytest.raises(ValueError, match="distinct names, got \\['format', 'format'\\]"):
        RewardServer([FormatReward(), FormatReward()])


# ---------------------------------------------------------------------------------------------- the command line
def config_file(tmp_path, text: str):
    path = tmp_path / "rewards.yaml"
    path.write_text(text)
    return path


REWARDS_YAML = """\
rewards:
  - class_path: app.rewards.AccuracyReward
  - class_path: app.rewards.FormatReward
    init_args: {weight: 0.5}
"""


def test_the_command_serves_the_config_s_rewards_and_stops_cleanly_on_sigterm(tmp_path):
    server = ServerProcess(config_file(tmp_path, REWARDS_YAML))
    try:
        assert server.url.startswith("http://127.0.0.1:")
        body = encode_request("format", ["<think>a</think><answer>b</answer>", "b"], [prompt()] * 2, None)
        assert post(server.url, body)[1]["values"] == [1.0, 0.0]
    finally:
        code = server.stop()
    assert code == 0, server.log


@pytest.mark.parametrize(
    "config, message",
    [
        ("rewards:\n  - class_path: app.rewards.AccuracyRewrd\n", "AccuracyRewrd"),
        ("rewards:\n  - class_path: app.rewards.FormatReward\n    init_args: {wieght: 2}\n", "wieght"),
        ("reward: []\n", "reward"),
    ],
    ids=["unknown-class", "unknown-argument", "no-rewards"],
)
def test_a_malformed_config_fails_in_a_few_lines_naming_what_is_wrong(tmp_path, config, message):
    command = [sys.executable, "-m", "app.rewards.serve", "--config", str(config_file(tmp_path, config)), "--port", "0"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    err = result.stderr
    assert result.returncode == 2
    assert err.startswith("error:") and message in err and "Traceback" not in err and len(err.splitlines()) <= 8, err


def test_a_server_process_that_cannot_start_says_why():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "rewards.yaml"
        config.write_text("rewards:\n  - class_path: app.rewards.AccuracyRewrd\n")
        with pytest.raises(RuntimeError, match=r"the reward server did not start: error: .*AccuracyRewrd"):
            ServerProcess(config)
