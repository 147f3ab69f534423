"""The reward server's wire format (app.rewards.wire): a batch survives the trip bit for bit, prompts travel once, and
every malformed field is named."""

import base64
import json
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from app.rewards.wire import (
    Blobs,
    DecodeBudget,
    RequestTooLarge,
    WireError,
    decode_array,
    decode_request,
    decode_side_state,
    decode_values,
    encode_array,
    encode_request,
    encode_values,
    flatten_side_state,
    pack,
    unpack,
)
from app.types import VisualSample


def through_json(payload):
    return json.loads(json.dumps(payload, allow_nan=False))


def sample(question="How many dots?", meta=None):
    image = Image.fromarray(np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3))
    return VisualSample([image], question, "dots", answer="3", reasoning="count", meta=meta or {"split": "in_domain"})


@pytest.mark.parametrize(
    "value",
    [
        torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(0)),  # a decoded video in [0, 1]
        torch.rand(3, 4, 4, dtype=torch.float64),
        np.random.default_rng(0).integers(0, 256, (6, 6, 3), dtype=np.uint8),
    ],
    ids=["float32-video", "float64-image", "uint8-array"],
)
def test_arrays_come_back_bit_for_bit(value):
    back = decode_array(through_json(encode_array(value)), "x")
    assert type(back) is type(value)  # a tensor comes back as a tensor, an array as an array
    assert (
        back.dtype == value.dtype and back.shape == value.shape and np.array_equal(np.asarray(back), np.asarray(value))
    )


def test_a_permuted_view_comes_back_with_its_strides_so_reductions_give_the_same_bits():
    image = torch.rand(64, 64, 3, generator=torch.Generator().manual_seed(0)).permute(2, 0, 1)  # [3, H, W] of HWC
    encoded = encode_array(image)
    back = decode_array(through_json(encoded), "x")
    assert encoded["dims"] == [1, 2, 0] and back.stride() == image.stride() and torch.equal(back, image)
    assert back[0].mean().item() == image[0].mean().item()  # summed in memory order, as in-process
    with pytest.raises(WireError, match="dims must be a permutation of the 3 dimensions"):
        decode_array({**encoded, "dims": [0, 0, 1]}, "x")


def test_a_bfloat16_tensor_travels_as_its_exact_float32_values():
    value = torch.randn(3, 4).bfloat16()
    assert torch.equal(decode_array(encode_array(value), "x"), value.float())


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_images_keep_their_mode_and_pixels(mode):
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (5, 6, 4), dtype=np.uint8), "RGBA").convert(mode)
    back = decode_array(encode_array(image), "x")
    assert back.mode == mode and np.array_equal(np.asarray(back), np.asarray(image))


def test_a_request_sends_each_prompt_once_and_its_rows_get_one_shared_sample_back():
    first, second = sample(), sample("Which is left?", meta={"pair": [1, 2], "split": "ood"})
    completions = ["<answer>3</answer>", "no", torch.zeros(3, 2, 2), "<answer>x</answer>"]
    body = through_json(encode_request("accuracy", completions, [first, first, second, second], group_size=2))
    assert len(body["samples"]) == 2 and [row["sample"] for row in body["rows"]] == [0, 0, 1, 1]
    reward, got, samples, group_size = decode_request(body)
    assert (reward, group_size) == ("accuracy", 2)
    assert got[:2] == completions[:2] and got[3] == completions[3] and torch.equal(got[2], torch.zeros(3, 2, 2))
    assert samples[0] is samples[1] and samples[2] is samples[3] and samples[1] is not samples[2]
    assert samples[2].question == "Which is left?" and samples[2].meta == {"pair": [1, 2], "split": "ood"}
    assert (samples[0].answer, samples[0].reasoning, samples[0].task) == ("3", "count", "dots")
    assert np.array_equal(np.asarray(samples[0].images[0]), np.asarray(first.images[0]))


def test_tuples_in_meta_travel_as_lists_and_numpy_scalars_as_numbers():
    meta = {"vbvr": {"config": {"colour": (255, 0, 0), "count": np.int64(3), "size": np.float32(0.5)}}}
    _, _, (got,), _ = decode_request(through_json(encode_request(None, ["x"], [sample(meta=meta)], None)))
    assert got.meta == {"vbvr": {"config": {"colour": [255, 0, 0], "count": 3, "size": 0.5}}}


def test_meta_that_json_cannot_hold_is_named_by_its_path():
    with pytest.raises(WireError, match=r"samples\[0\]\.meta\.vbvr\.mask is a ndarray"):
        encode_request(None, ["x"], [sample(meta={"vbvr": {"mask": np.zeros(3)}})], None)


def test_a_completion_that_is_neither_text_nor_an_array_is_refused():
    with pytest.raises(WireError, match="cannot send a dict"):
        encode_request(None, [{"a": 1}], [sample()], None)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b.update(version=2), "version must be 1"),
        (lambda b: b.update(group_size=0), "group_size must be a positive integer"),
        (lambda b: b["rows"][0].update(sample=5), r"rows\[0\]\.sample must index samples \(0\.\.0\)"),
        (lambda b: b["rows"][0].update(completion={"png": "not base64!"}), r"rows\[0\]\.completion: png data"),
        (lambda b: b["rows"][0].update(completion={"npy": base64.b64encode(b"junk").decode()}), "unreadable npy"),
        (lambda b: b["samples"][0].update(question=3), r"samples\[0\]\.question must be a string"),
        (
            lambda b: b["samples"][0]["images"].append({"npy": b["samples"][0]["images"][0]["png"]}),
            r"samples\[0\]\.images\[1\] must be a PNG image",
        ),
        (lambda b: b.update(rows="x"), "rows must be a list, got 'x'"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_field(change, message):
    body = through_json(encode_request(None, ["x"], [sample()], None))
    change(body)
    with pytest.raises(WireError, match=message):
        decode_request(body)


def test_values_travel_with_non_finite_ones_as_null_and_back_as_nan():
    values = torch.tensor([0.25, float("nan"), float("inf"), -1.0])
    encoded = through_json(encode_values(values))
    assert encoded == [0.25, None, None, -1.0]
    back = decode_values(encoded, 4)
    assert back[0] == 0.25 and back[3] == -1.0 and torch.isnan(back[1:3]).all()


@pytest.mark.parametrize(
    "values, message",
    [
        ([1.0], "1 values for 2 completions"),
        ([1.0, "0.5"], r"values\[1\] is '0.5'"),
        ([1.0, True], r"values\[1\] is True"),
        ([1.0, float("nan")], r"values\[1\] is nan"),  # a bare NaN token, parsed leniently
        ({"a": 1}, "values must be a list"),
    ],
)
def test_an_answer_with_wrong_values_is_refused(values, message):
    with pytest.raises(WireError, match=message):
        decode_values(values, 2)


def test_side_state_is_flattened_to_names_and_keys_and_zero_increments_are_left_out():
    delta = {"": {"num_malformed": 2, "failed_checks": Counter({("maze", "path"): 1, ("dots", "count"): 0})}}
    delta["inner"] = {"hits": torch.tensor([1.0, 2.0])}
    flat = flatten_side_state(delta)
    assert flat == {"num_malformed": 2.0, "failed_checks/maze/path": 1.0, "inner.hits": 3.0}
    assert decode_side_state(through_json(flat)) == flat
    with pytest.raises(WireError, match="side_state must map names to finite numbers"):
        decode_side_state({"num_malformed": "2"})


def test_a_framed_body_carries_the_arrays_raw_and_decodes_to_the_same_batch():
    image = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    first = sample()
    blobs = Blobs()
    document = encode_request("pixels", [image, "text"], [first, first], None, blobs)
    assert document["rows"][0]["completion"] == {"pt": {"blob": 1, "dtype": "<f4", "shape": [2, 3, 8, 8]}}  # 0: PNG
    got_document, got_blobs = unpack(pack(document, blobs))
    _, (back, text), (s0, s1), _ = decode_request(got_document, got_blobs)
    assert torch.equal(back, image) and text == "text" and s0 is s1
    back.mul_(2)  # the reward may write into what it gets
    assert np.array_equal(np.asarray(s0.images[0]), np.asarray(first.images[0]))


@pytest.mark.parametrize(
    "body, message",
    [
        (b"JSON{}", "a framed body starts with b'RWB1'"),
        (b"RWB1" + (5).to_bytes(8, "little") + b"{}", "truncated: a part of 5 bytes at byte 4"),
        (b"RWB1", "holds no JSON document"),
        (b"RWB1" + (2).to_bytes(8, "little") + b"{x", "document is not JSON"),
    ],
)
def test_a_malformed_framed_body_is_refused_saying_where(body, message):
    with pytest.raises(WireError, match=message):
        unpack(body)


def test_a_reference_to_a_missing_blob_is_refused():
    document = encode_request(None, [torch.zeros(2)], [sample()], None, Blobs())
    with pytest.raises(WireError, match=r"samples\[0\]\.images\[0\]: blob must index the 0 attachments, got"):
        decode_request(document, Blobs())


@pytest.mark.parametrize(
    "about, message",
    [
        ({"dtype": "<f4", "shape": [3]}, "8 bytes do not hold a float32 array of shape \\[3\\]"),
        ({"dtype": "|O", "shape": [1]}, "dtype '|O' is not a number type"),
        ({"dtype": "<f4", "shape": [-2]}, "a raw array needs a numeric dtype and a shape of sizes"),
        ({"dtype": "nonsense", "shape": [2]}, "dtype 'nonsense' is not a number type such as '<f4'"),
    ],
)
def test_a_raw_blob_that_does_not_match_its_description_is_refused(about, message):
    with pytest.raises(WireError, match=message):
        decode_array({"pt": {"blob": 0, **about}}, "x", Blobs([bytearray(8)]))


@pytest.mark.parametrize("shape", [(), (0, 3), (2, 0, 4)])
def test_empty_and_zero_dimensional_arrays_travel_in_a_framed_body(shape):
    value = torch.ones(shape)
    blobs = Blobs()
    document = encode_array(value, blobs)
    _, got = unpack(pack({"a": document}, blobs))
    assert torch.equal(decode_array(document, "x", got), value)
    assert torch.equal(decode_array(through_json(encode_array(value)), "x"), value)  # and as base64 npy


# ------------------------------------------------------------------------------- hostile input (issue 53)
def npy_base64(array: np.ndarray) -> str:
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def png_header(width: int, height: int, bit_depth: int = 8, colour_type: int = 2) -> bytes:
    """The signature and IHDR chunk of a PNG declaring ``width x height`` (no pixel data follows)."""
    import struct  # noqa: PLC0415
    import zlib  # noqa: PLC0415

    fields = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    chunk = b"IHDR" + fields
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(fields)) + chunk + struct.pack(">I", zlib.crc32(chunk))


@pytest.mark.parametrize(
    "value, message",
    [
        ({"pt": npy_base64(np.zeros(3, dtype=">f4"))}, "dtype '>f4' is big-endian: send little-endian"),
        ({"npy": npy_base64(np.array(["ab", "c"]))}, "dtype '<U2' is not a number type"),
        ({"pt": {"blob": 0, "dtype": ">f4", "shape": [2]}}, "dtype '>f4' is big-endian"),
        ({"pt": {"blob": 0, "dtype": "|S8", "shape": [1]}}, "dtype '|S8' is not a number type"),
        ({"pt": {"blob": 0, "dtype": ["<f4"], "shape": [2]}}, r"dtype \['<f4'\] is not a number type"),
        ({"npy": npy_base64(np.zeros((2, 2))), "dims": [0, "1"]}, "dims must be a permutation of the 2 dimensions"),
        ({"npy": npy_base64(np.zeros((2, 2))), "dims": [True, False]}, "dims must be a permutation"),
        ({"png": base64.b64encode(b"GIF89a" + bytes(20)).decode()}, "not a PNG"),
    ],
    ids=["big-endian-npy", "string-npy", "big-endian-raw", "bytes-raw", "list-dtype", "str-dims", "bool-dims", "gif"],
)
def test_an_array_the_wire_does_not_carry_is_refused_naming_the_field(value, message):
    with pytest.raises(WireError, match=message) as error:
        decode_array(value, "rows[0].completion", Blobs([bytearray(8)]))
    assert str(error.value).startswith("rows[0].completion: ")


def test_a_non_png_image_is_refused_even_when_pillow_reads_it():
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="BMP")
    with pytest.raises(WireError, match="x: png data is not a PNG"):
        decode_array({"png": base64.b64encode(buffer.getvalue()).decode()}, "x")


def test_deeply_nested_json_is_refused_as_malformed():
    body = b"RWB1" + (200_000).to_bytes(8, "little") + b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(WireError, match="the framed body's document is nested too deeply"):
        unpack(body)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b.pop("version"), "version must be 1, got None"),
        (lambda b: b.update(grup_size=2), r"unknown field\(s\) \['grup_size'\]"),
        (lambda b: b["samples"][0].update(awnser="3"), r"samples\[0\]: unknown field\(s\) \['awnser'\]"),
        (lambda b: b.pop("samples"), "samples must be a list, got None"),
    ],
)
def test_missing_and_unknown_fields_are_refused_by_name(change, message):
    body = through_json(encode_request(None, ["x"], [sample()], None))
    change(body)
    with pytest.raises(WireError, match=message):
        decode_request(body)


def test_decoded_bytes_are_bounded_from_the_png_header_before_decoding(monkeypatch):
    bomb = {"png": base64.b64encode(png_header(100_000, 100_000)).decode()}  # 30 GB declared in 33 bytes
    opened = []
    monkeypatch.setattr("app.rewards.wire.Image.open", lambda *a, **k: opened.append(a))
    with pytest.raises(RequestTooLarge, match=r"rows\[0\]\.completion: a PNG of 100000 x 100000 x 3 bytes"):
        decode_array(bomb, "rows[0].completion", budget=DecodeBudget(2**20))
    assert opened == []  # refused before Pillow saw it


def test_a_request_s_decoded_bytes_are_summed_over_its_arrays():
    first = sample()  # a 4 x 5 RGB image: 60 bytes
    completions = [torch.zeros(10), torch.zeros(10)]  # 40 bytes each
    body = through_json(encode_request(None, completions, [first, first], None))
    decode_request(body, max_decoded_bytes=140)
    with pytest.raises(RequestTooLarge, match=r"rows\[1\]\.completion: .* over this request's limit of 139"):
        decode_request(body, max_decoded_bytes=139)


def test_an_npy_array_is_bounded_by_its_header_before_it_is_read():
    header_only = np.lib.format.header_data_from_array_1_0(np.zeros(1, dtype="<f8"))
    header_only["shape"] = (10**6, 10**6)
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header_only)
    value = {"npy": base64.b64encode(buffer.getvalue()).decode()}
    with pytest.raises(RequestTooLarge, match=r"x: an array of 8000000000000 bytes"):
        decode_array(value, "x", budget=DecodeBudget(2**20))


# ------------------------------------------------------------------------- docs/wire_spec.md's examples
def spec_example(name: str) -> dict:
    from pathlib import Path  # noqa: PLC0415

    text = (Path(__file__).resolve().parents[2] / "docs" / "wire_spec.md").read_text()
    block = text.split(f"<!-- example: {name} -->\n```json\n", 1)[1].split("\n```", 1)[0]
    return json.loads(block)


def test_the_spec_s_dims_example_decodes_to_the_view_it_states():
    back = decode_array(spec_example("dims"), "x", Blobs([bytearray(range(12))]))
    assert back.tolist() == [[[0, 3], [6, 9]], [[1, 4], [7, 10]], [[2, 5], [8, 11]]]
    view = np.arange(12, dtype=np.uint8).reshape(2, 2, 3).transpose(2, 0, 1)  # an HWC buffer viewed as CHW
    blobs = Blobs()
    assert encode_array(view, blobs) == spec_example("dims") and bytes(blobs.parts[0]) == bytes(range(12))


def test_the_spec_s_npy_and_png_examples_decode_to_what_it_states():
    assert decode_array(spec_example("npy"), "x").tolist() == [1.5, -2.0]
    image = decode_array(spec_example("png"), "x")
    assert image.mode == "RGB" and np.asarray(image).tolist() == [[[255, 0, 0], [0, 0, 255]]]
