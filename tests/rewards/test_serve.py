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
from served_rewards import CountingReward

from app.rewards import AccuracyReward, FormatReward, RewardComponent
from app.rewards.serve import RewardServer, ServerProcess
from app.rewards.wire import encode_request
from app.types import VisualSample

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
def test_the_command_serves_the_config_s_rewards_and_stops_cleanly_on_sigterm(tmp_path):
    server = ServerProcess(config_file(tmp_path, REWARDS_YAML))
    try:
        assert server.url.startswith("http://127.0.0.1:")
        body = encode_request("format", ["<think>a</think><answer>b</answer>", "b"], [prompt()] * 2, None)
        assert post(server.url, body)[1]["values"] == [1.0, 0.0]
    finally:
        code = server.stop()
    assert code == 0, server.log


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_server_process_that_cannot_start_says_why():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "rewards.yaml"
        config.write_text("rewards:\n  - class_path: app.rewards.AccuracyRewrd\n")
        with pytest.raises(RuntimeError, match=r"the reward server did not start: error: .*AccuracyRewrd"):
            ServerProcess(config)


# ------------------------------------------------------------------------- hostile clients (issue 53)
# Every case talks to a server on 127.0.0.1 with a short timeout, so that stalled connections end within a second; each
# ends by checking that the server still answers /health.
import http.client  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

TIMEOUT_S = 0.5


class PixelSum(RewardComponent):
    """The float64 sum of a rendering's values over 1e6: any change to one value on the way changes the score."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([float(np.asarray(c, dtype=np.float64).sum()) / 1e6 for c in completions])


@pytest.fixture
def hostile():
    rewards = [AccuracyReward(), CountingReward(), PixelSum()]
    limits = {"max_request_bytes": 20_000, "max_decoded_bytes": 100_000, "max_connections": 8, "timeout_s": TIMEOUT_S}
    with RewardServer(rewards, **limits) as running:
        yield running
        assert get(running.url, "/health") == {"ok": True}  # alive after whatever the case sent


def connect(server, timeout=5.0) -> socket.socket:
    host, port = server.httpd.server_address[:2]
    return socket.create_connection((host, port), timeout=timeout)


def responses(sock: socket.socket, limit: int = 5) -> list[tuple[int, dict, bytes]]:
    """The responses read from ``sock`` until it closes or is quiet for a second: (status, headers, body)."""
    sock.settimeout(1.0)
    stream, out = sock.makefile("rb"), []
    try:
        while len(out) < limit:
            line = stream.readline()
            if not line:
                break
            status, headers = int(line.split()[1]), {}
            while (header := stream.readline()) not in (b"\r\n", b""):
                name, value = header.decode("latin-1").split(":", 1)
                headers[name.strip().lower()] = value.strip()
            out.append((status, headers, stream.read(int(headers.get("content-length", 0)))))
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def request(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}"
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``within`` seconds, whatever it answers first."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def score_body(completions=("1",), reward="counting") -> bytes:
    return json.dumps(encode_request(reward, list(completions), [prompt()] * len(completions), None)).encode()


def test_a_burst_of_100_concurrent_requests_is_served_with_no_reset():
    with RewardServer([CountingReward()]) as server:
        start, results = threading.Barrier(100), []

        def client():
            connection = http.client.HTTPConnection(*server.httpd.server_address[:2], timeout=10)
            start.wait()
            try:
                connection.request("POST", "/score", body=score_body(), headers={"Content-Type": "application/json"})
                results.append(connection.getresponse().status)
            except OSError as error:
                results.append(type(error).__name__)

        threads = [threading.Thread(target=client) for _ in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert results == [200] * 100  # the default backlog of 5 reset some of them


@pytest.mark.parametrize("path, status", [("/health", 404), ("/nowhere", 404)])
def test_an_unread_body_is_never_read_as_the_next_request(hostile, path, status):
    smuggled = request("GET", "/info")
    with connect(hostile) as sock:
        sock.sendall(request("POST", path, smuggled) + request("GET", "/health"))
        got = responses(sock)
    assert [s for s, _, _ in got] == [status, 200] and json.loads(got[1][2]) == {"ok": True}


def test_a_refused_request_s_body_is_not_read_as_a_request_either():
    with RewardServer([CountingReward()], token="s3cret", timeout_s=TIMEOUT_S) as server, connect(server) as sock:
        sock.sendall(request("POST", "/score", request("GET", "/health")) + request("GET", "/health"))
        got = responses(sock)
    assert [s for s, _, _ in got] == [401, 200] and json.loads(got[1][2]) == {"ok": True}


@pytest.mark.parametrize(
    "length_headers, message",
    [
        ("Content-Length: 5\r\nContent-Length: 40\r\n", "one Content-Length, got 2"),
        ("Content-Length: \u00b2\r\n", "Content-Length must be a number of bytes"),
        ("Content-Length: " + "9" * 5000 + "\r\n", "Content-Length must be a number of bytes"),
        ("Content-Length: -1\r\n", "Content-Length must be a number of bytes"),
    ],
    ids=["duplicate", "superscript-two", "5000-digits", "negative"],
)
def test_a_duplicate_or_malformed_content_length_is_refused_and_the_connection_closed(hostile, length_headers, message):
    with connect(hostile) as sock:
        sock.sendall(f"POST /score HTTP/1.1\r\nHost: x\r\n{length_headers}\r\n".encode("latin-1") + b"12345" * 8)
        got = responses(sock)
        assert closed(sock, 1.0)
    assert [s for s, _, _ in got] == [400] and message in json.loads(got[0][2])["error"]


def test_a_chunked_body_is_refused_with_411_and_never_read_as_a_request(hostile):
    with connect(hostile) as sock:
        body = b"5\r\nGET /\r\n0\r\n\r\n"
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
        got = responses(sock)
    assert [s for s, _, _ in got] == [411] and "Content-Length" in json.loads(got[0][2])["error"]


def test_a_body_over_the_limit_gets_a_413_the_client_reads_not_a_broken_pipe(hostile):
    connection = http.client.HTTPConnection(*hostile.httpd.server_address[:2], timeout=5)
    connection.request("POST", "/score", body=b"x" * 8_000_000, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 413
    assert json.loads(response.read()) == {"error": "the body is 8000000 bytes, over this server's limit of 20000"}


def test_expect_100_continue_is_answered_only_after_the_length_is_checked(hostile):
    with connect(hostile) as sock:
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\nExpect: 100-continue\r\n\r\n")
        assert [s for s, _, _ in responses(sock)] == [413]  # no 100 Continue before it
    body = score_body()
    with connect(hostile) as sock:
        sock.sendall(
            f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        assert [s for s, _, _ in responses(sock)] == [200]


def array_request(value: dict) -> dict:
    body = encode_request("pixel_sum", ["x"], [prompt()], None)
    body["rows"][0]["completion"] = value
    return body


def npy(array: np.ndarray) -> str:
    import base64  # noqa: PLC0415
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(
    "body, status, message",
    [
        (array_request({"pt": npy(np.zeros(3, ">f4"))}), 400, r"rows\[0\]\.completion: dtype '>f4' is big-endian"),
        (array_request({"npy": npy(np.array(["a"]))}), 400, r"rows\[0\]\.completion: dtype '<U1' is not a number"),
        (b"[" * 9_000 + b"]" * 9_000, 400, "the body is nested too deeply"),
        ({"version": 1, "samples": [], "rows": [], "reward": 3}, 400, "reward must be a name or null, got 3"),
        ({"version": 1, "samples": [{"question": "?"}], "rows": []}, 400, r"samples\[0\]\.task must be a string"),
        (b"\xff\xfe", 400, "the body is not JSON"),
    ],
    ids=["big-endian", "string-dtype", "deep-nesting", "reward-not-a-name", "no-task", "not-utf8"],
)
def test_a_malformed_request_is_a_4xx_naming_the_field_never_a_500(hostile, body, status, message):
    got, answer = post(hostile.url, None, raw=body if isinstance(body, bytes) else json.dumps(body).encode())
    assert got == status and __import__("re").search(message, answer["error"]), answer


def test_a_decompression_bomb_is_refused_from_its_header_before_decoding(hostile):
    import base64  # noqa: PLC0415
    import struct  # noqa: PLC0415
    import zlib  # noqa: PLC0415

    fields = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)  # 30 GB of RGB declared
    chunk = b"IHDR" + fields
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    idat = zlib.compress(bytes(10_000_000), 9)  # the first rows of zeros, 10 KB
    png = header + struct.pack(">I", len(idat)) + b"IDAT" + idat + struct.pack(">I", zlib.crc32(b"IDAT" + idat))
    got, answer = post(hostile.url, array_request({"png": base64.b64encode(png).decode()}))
    assert got == 413
    assert answer["error"] == (
        "rows[0].completion: a PNG of 100000 x 100000 x 3 bytes brings the request's decoded arrays to 30000000000 "
        "bytes, over this request's limit of 100000"
    )


def test_a_stalled_or_trickling_request_is_cut_off_after_the_timeout(hostile):
    body = score_body()
    with connect(hostile) as stalled, connect(hostile) as trickling:
        stalled.sendall(request("POST", "/score", body)[:-10])  # all but the last 10 bytes, then nothing
        line, sent = b"POST /score HTTP/1.1\r\nHost: x\r\n", 0
        for byte in line:  # a byte every 0.1 s: no single read waits 0.5 s, the whole line takes 3.3 s
            try:
                trickling.sendall(bytes([byte]))
            except OSError:
                break
            sent += 1
            time.sleep(0.1)
        got = responses(stalled)
        assert [s for s, _, _ in got] == [408] and closed(stalled, 1.0)
        # cut off mid-line by the request's deadline, which timeouts on each read alone would never do
        assert closed(trickling, 1.0) and sent < len(line)


def test_connections_are_bounded_and_stalled_ones_released(hostile):
    before = threading.active_count()
    sockets = [connect(hostile) for _ in range(30)]  # 8 served at once, the rest wait in the listen backlog
    try:
        for sock in sockets:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # and stall in the headers
        time.sleep(0.2)
        assert threading.active_count() - before <= 8
    finally:
        for sock in sockets:
            sock.close()
    assert get(hostile.url, "/health") == {"ok": True}


def test_idle_kept_alive_connections_make_room_for_a_waiting_one():
    with RewardServer([CountingReward()], max_connections=2, timeout_s=60) as server:
        idle = [connect(server) for _ in range(2)]
        for sock in idle:
            sock.sendall(request("GET", "/health"))
            sock.recv(1000)  # answered, then kept alive and idle: both slots taken
        # answered within the client's 5 s timeout: a slot was freed, not left to the 60 s idle timeout
        connection = http.client.HTTPConnection(*server.httpd.server_address[:2], timeout=5)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200
        assert any(closed(sock, 1.0) for sock in idle)  # as many as it took to free a slot
        connection.close()


def test_an_unsupported_method_gets_a_json_501_and_errors_are_json():
    with RewardServer([CountingReward()]) as server, connect(server) as sock:
        sock.sendall(request("PUT", "/score", b"{}"))
        (status, headers, body), *_ = responses(sock)
    assert status == 501 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "unsupported method 'PUT': GET /health, GET /info, POST /score"}


def test_health_is_open_and_info_needs_the_token_when_there_is_one():
    with RewardServer([CountingReward()], token="s3cret") as server:
        assert get(server.url, "/health") == {"ok": True}  # a load balancer's probe carries no secret
        with pytest.raises(urllib.error.HTTPError, match="401"):
            get(server.url, "/info")
        request_ = urllib.request.Request(server.url + "/info", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(request_, timeout=10) as response:
            assert json.loads(response.read())["rewards"][0]["name"] == "counting"
        for wrong in ("bearer s3cret", "Bearer s3cret ", "Bearer  s3cret", "Bearer s3cre", "s3cret"):
            assert post(server.url, encode_request(None, ["1"], [prompt()], None), {"Authorization": wrong})[0] == 401


def test_info_reports_the_limits_and_the_completion_kinds_each_reward_scores(hostile):
    info = get(hostile.url, "/info")
    assert info["version"] == 1
    assert info["limits"] == {
        "max_request_bytes": 20_000,
        "max_decoded_bytes": 100_000,
        "max_connections": 8,
        "timeout_s": TIMEOUT_S,
    }
    kinds = {entry["name"]: entry["completions"] for entry in info["rewards"]}
    assert kinds == {
        "accuracy": ["text"],
        "counting": ["text", "image", "array"],
        "pixel_sum": ["text", "image", "array"],
    }


# ----------------------------------------------------- a client written from docs/wire_spec.md alone (issue 53)
# The client side uses only the standard library: no app.rewards.wire, no numpy, no torch.
import base64 as b64  # noqa: E402
import struct  # noqa: E402
import zlib  # noqa: E402


def spec_png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """An 8-bit RGB PNG of rows of (r, g, b) pixels: the signature, IHDR, one IDAT (filter 0 per row), IEND."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", len(pixels[0]), len(pixels), 8, 2, 0, 0, 0)
    scanlines = b"".join(b"\x00" + bytes(v for pixel in row for v in pixel) for row in pixels)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(scanlines)) + chunk(b"IEND", b"")
    )


def spec_framed(document: dict, blobs: list[bytes]) -> bytes:
    parts = [json.dumps(document).encode(), *blobs]
    return b"RWB1" + b"".join(struct.pack("<Q", len(part)) + part for part in parts)


def spec_post(server, body: bytes, content_type: str) -> dict:
    host, port = server.httpd.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.request("POST", "/score", body=body, headers={"Content-Type": content_type})
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200, answer
    return answer


class ImageAndPrompt(RewardComponent):
    """The float64 sum of a rendering plus the mean of its prompt's first image: reads both arrays of a request."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor(
            [
                float(np.asarray(c, dtype=np.float64).sum()) + float(np.asarray(s.images[0], dtype=np.float64).mean())
                for c, s in zip(completions, samples, strict=True)
            ]
        )


def test_a_client_from_the_spec_alone_scores_a_text_batch_as_in_process():
    texts = ["<think>a</think><answer>yes</answer>", "<answer>no</answer>", "yes", "<answer>4</answer>"]
    document = {
        "version": 1,
        "reward": "accuracy",
        "group_size": 2,
        "samples": [
            {"question": "Is it?", "task": "demo", "answer": "yes"},
            {"question": "2+2?", "task": "demo", "answer": "4"},
        ],
        "rows": [{"sample": i // 2, "completion": {"text": text}} for i, text in enumerate(texts)],
    }
    with RewardServer([AccuracyReward(), ImageAndPrompt()]) as server:
        answer = spec_post(server, json.dumps(document).encode(), "application/json")
    samples = [prompt("yes")] * 2 + [prompt("4")] * 2
    assert answer["version"] == 1 and answer["reward"] == "accuracy"
    assert answer["values"] == AccuracyReward().score(texts, samples).tolist() == [1.0, 0.0, 0.0, 1.0]


def test_a_client_from_the_spec_alone_scores_an_image_batch_as_in_process():
    pixels = [[(255, 0, 0), (0, 128, 255)], [(1, 2, 3), (250, 251, 252)]]
    values = [i / 7 for i in range(2 * 3 * 4)]  # packed as float32 on both sides: the same bits
    hwc = struct.pack("<24f", *values)  # a [2, 3, 4] float32 buffer
    document = {
        "version": 1,
        "reward": "image_and_prompt",
        "samples": [{"question": "draw", "task": "demo", "images": [{"png": {"blob": 0}}]}],
        "rows": [
            {"sample": 0, "completion": {"pt": {"blob": 1, "dtype": "<f4", "shape": [2, 3, 4]}}},
            {"sample": 0, "completion": {"pt": {"blob": 1, "dtype": "<f4", "shape": [2, 3, 4]}, "dims": [1, 2, 0]}},
            {"sample": 0, "completion": {"npy": b64.b64encode(spec_npy(values[:6], (2, 3))).decode()}},
        ],
    }
    with RewardServer([AccuracyReward(), ImageAndPrompt()]) as server:
        answer = spec_post(server, spec_framed(document, [spec_png(pixels), hwc]), "application/x-reward-batch")
    from PIL import Image  # noqa: PLC0415 - the in-process side

    image = Image.fromarray(np.array(pixels, dtype=np.uint8))
    buffer = torch.tensor(values, dtype=torch.float32).reshape(2, 3, 4)
    completions = [buffer, buffer.permute(2, 0, 1), np.array(values[:6], dtype=np.float32).reshape(2, 3)]
    sample = VisualSample([image], "draw", "demo")
    assert answer["values"] == ImageAndPrompt().score(completions, [sample] * 3).tolist()


def spec_npy(values: list[float], shape: tuple[int, ...]) -> bytes:
    """A version 1.0 ``.npy`` file of little-endian float32 values in C order."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"  # the magic, version and length, then padded to 64
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + struct.pack(f"<{len(values)}f", *values)


@pytest.mark.parametrize(
    ("error", "level", "line"),
    [
        (BrokenPipeError(32, "Broken pipe"), "DEBUG", "client 127.0.0.1 hung up: [Errno 32] Broken pipe"),
        (ConnectionResetError(104, "reset"), "DEBUG", "client 127.0.0.1 hung up: [Errno 104] reset"),
        (RuntimeError("boom"), "ERROR", "a request from 127.0.0.1 failed: RuntimeError: boom"),
    ],
)
def test_a_connection_that_fails_outside_an_answer_is_one_log_line_not_a_traceback(error, level, line, capsys, caplog):
    with RewardServer([CountingReward()]) as server, caplog.at_level("DEBUG", logger="app.rewards.http_server"):
        try:
            raise error  # as socketserver calls handle_error: inside the except block of the failed request
        except Exception:
            server.httpd.handle_error(None, ("127.0.0.1", 40000))
    assert [(r.levelname, r.getMessage()) for r in caplog.records if "127.0.0.1" in r.getMessage()] == [(level, line)]
    assert "Traceback" not in capsys.readouterr().err
