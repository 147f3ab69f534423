import io
import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from app.data.shards import (
    LABEL_META_KEYS,
    SCHEMA_VERSION,
    decode_sample,
    encode_sample,
    expand_urls,
    read_samples,
    write_samples,
)
from app.tasks.dots import DotsDataset
from app.tasks.dots.triplets import TripletDotsDataset
from app.types import Video, VisualSample


def _dots(n: int, seed: int = 0) -> list[VisualSample]:
    dataset = DotsDataset(num_samples=n, seed=seed, image_size=32)
    return [dataset[i] for i in range(n)]


def _json_round(meta: dict) -> dict:
    return json.loads(json.dumps(meta))


def _tar_members(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_round_trip_keeps_pixels_text_and_meta(tmp_path):
    samples = _dots(6)
    paths = write_samples(samples, tmp_path, "dots", max_per_shard=4)
    assert [p.name for p in paths] == ["dots-000000.tar", "dots-000001.tar"]
    back = list(read_samples([str(p) for p in paths]))
    assert len(back) == 6
    for original, decoded in zip(samples, back, strict=True):
        assert (decoded.task, decoded.question, decoded.answer, decoded.reasoning) == (
            original.task,
            original.question,
            original.answer,
            original.reasoning,
        )
        assert decoded.meta == _json_round(original.meta)  # tuples come back as lists
        assert decoded.images[0].mode == "RGB"
        assert np.array_equal(np.asarray(decoded.images[0]), np.asarray(original.images[0]))


def test_multi_image_samples_round_trip(tmp_path):
    dataset = TripletDotsDataset(num_samples=3, seed=0, image_size=32)
    samples = [dataset[i] for i in range(3)]
    back = list(read_samples([str(p) for p in write_samples(samples, tmp_path, "tri")]))
    for original, decoded in zip(samples, back, strict=True):
        assert len(decoded.images) == 3
        for a, b in zip(original.images, decoded.images, strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))
        assert decoded.meta == _json_round(original.meta)


def test_schema_of_a_record():
    sample = VisualSample([Image.new("L", (8, 8), 7)], "q?", "t", answer="a", meta={"n": np.int64(3)})
    record = encode_sample(sample, "k-1")
    payload = json.loads(record["json"])
    assert payload == {
        "schema": 1,  # no videos: the schema that existed before them
        "task": "t",
        "question": "q?",
        "answer": "a",
        "meta": {"n": 3},
        "num_images": 1,
    }
    image = Image.open(io.BytesIO(record["img0.png"]))
    assert image.format == "PNG" and image.mode == "RGB"


def clip(frames: int, seed: int, fps: float) -> Video:
    pixels = np.random.default_rng(seed).integers(0, 256, (frames, 6, 10, 3), dtype=np.uint8)
    return Video(pixels, fps=fps)


def test_videos_round_trip_exactly_with_their_rate_under_schema_2(tmp_path):
    samples = [
        VisualSample([], "<video> Which way?", "moving", answer="left", videos=[clip(4, 0, 2.0)]),
        VisualSample(
            [Image.new("RGB", (8, 8), (1, 2, 3))],
            "<image> <video> <video>?",
            "t",
            videos=[clip(2, 1, 1.5), clip(6, 2, 3)],
        ),
        VisualSample([Image.new("RGB", (8, 8))], "No video.", "t"),
    ]
    paths = write_samples(samples, tmp_path, "vid")
    members = _tar_members(paths[0])
    assert {name.split(".", 1)[1] for name in members if name.startswith("vid-000000001.")} == {
        "json",
        "img0.png",
        "vid0.npy",
        "vid1.npy",
    }
    schemas = [json.loads(members[f"vid-00000000{i}.json"])["schema"] for i in range(3)]
    assert schemas == [2, 2, 1] and SCHEMA_VERSION == 2
    back = list(read_samples([str(p) for p in paths]))
    for original, decoded in zip(samples, back, strict=True):
        assert [v.fps for v in decoded.videos] == [v.fps for v in original.videos]
        for a, b in zip(original.videos, decoded.videos, strict=True):
            assert np.array_equal(a.frames, b.frames)
        assert decoded.question == original.question and len(decoded.images) == len(original.images)


def write_old_shard(path, samples: list[VisualSample]):
    """A shard as the writer wrote it before videos existed: schema 1 records, the images as PNG members."""
    with tarfile.open(path, "w") as tar:
        for i, sample in enumerate(samples):
            key = f"old-{i:09d}"
            record = {"schema": 1, "task": sample.task, "question": sample.question, "meta": sample.meta}
            members = {"json": json.dumps({**record, "num_images": len(sample.images)}).encode()}
            for j, image in enumerate(sample.images):
                buffer = io.BytesIO()
                image.save(buffer, format="PNG")
                members[f"img{j}.png"] = buffer.getvalue()
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_shards_written_before_videos_still_read(tmp_path):
    samples = _dots(3)
    back = list(read_samples([str(write_old_shard(tmp_path / "old-000000.tar", samples))]))
    assert [s.question for s in back] == [s.question for s in samples]
    assert all(s.videos == [] and len(s.images) == 1 for s in back)
    assert np.array_equal(np.asarray(back[0].images[0]), np.asarray(samples[0].images[0].convert("RGB")))


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"drop": "vid0.npy"}, r"'k-0': missing video 'vid0.npy' \(1 videos\)"),
        ({"add": "vid1.npy"}, r"'k-0': video members \['vid1.npy'\] beyond the 1 videos of its record"),
        ({"json": {"videos": [{"fps": 0}]}}, "'k-0': each entry of 'videos' needs an 'fps' > 0"),
        ({"json": {"videos": "fast"}}, "'k-0': JSON field 'videos' must be a list of objects"),
        ({"json": {"schema": 1}}, r"'k-0': video members \['vid0.npy'\] beyond the 0 videos"),
        ({"vid0.npy": _npy(np.zeros((2, 4, 4, 3), np.float32))}, "'k-0': cannot decode video 'vid0.npy': .*uint8"),
        ({"vid0.npy": _npy(np.array([{"a": 1}], dtype=object))}, "'k-0': cannot decode video 'vid0.npy': .*pickle"),
    ],
    ids=["missing", "extra", "fps", "not-a-list", "schema-1-with-a-video", "float-frames", "pickled"],
)
def test_video_records_off_the_schema_are_refused_naming_the_member(change, message):
    record = encode_sample(VisualSample([], "<video>?", "t", videos=[clip(2, 0, 2.0)]), "k-0")
    if "drop" in change:
        del record[change["drop"]]
    if "add" in change:
        record[change["add"]] = record["vid0.npy"]
    if "json" in change:
        record["json"] = json.dumps({**json.loads(record["json"]), **change["json"]}).encode()
    if "vid0.npy" in change:
        record["vid0.npy"] = change["vid0.npy"]
    with pytest.raises(ValueError, match=message):
        decode_sample(record)


def test_keys_are_unique_and_deterministic(tmp_path):
    samples = _dots(5)
    first = write_samples(samples, tmp_path / "a", "dots", max_per_shard=2)
    second = write_samples(samples, tmp_path / "b", "dots", max_per_shard=2)
    keys = [name.split(".")[0] for p in first for name in _tar_members(p)]
    assert sorted(set(keys)) == [f"dots-{i:09d}" for i in range(5)]
    assert [p.read_bytes() == q.read_bytes() for p, q in zip(first, second, strict=True)] == [True] * 3


def test_strip_labels_leaves_no_answer_in_the_tar(tmp_path):
    dataset = TripletDotsDataset(num_samples=4, seed=0, image_size=32)
    samples = [dataset[i] for i in range(4)]
    assert {"pair_answers", "attributes"} <= set(samples[0].meta) and set(LABEL_META_KEYS) & {"pair_answers"}
    (path,) = write_samples(samples, tmp_path, "free", strip_labels=True)
    records = [json.loads(v) for k, v in _tar_members(path).items() if k.endswith(".json")]
    assert len(records) == 4
    for record in records:
        assert "answer" not in record and "reasoning" not in record
        assert not set(record["meta"]) & set(LABEL_META_KEYS)
        assert record["meta"]["answer_type"] == "ordinal"  # non-label meta stays
    raw = b"".join(v for k, v in _tar_members(path).items() if k.endswith(".json"))
    for sample in samples:
        assert sample.answer.encode() not in raw


def test_rewriting_fewer_samples_removes_stale_shards(tmp_path):
    write_samples(_dots(6), tmp_path, "dots", max_per_shard=2)
    paths = write_samples(_dots(2), tmp_path, "dots", max_per_shard=2)
    assert sorted(tmp_path.glob("dots-*.tar")) == paths
    assert write_samples([], tmp_path / "empty", "dots") == []


@pytest.mark.parametrize("prefix", ["a.b", "a/b", ""])
def test_bad_prefix_is_refused(tmp_path, prefix):
    with pytest.raises(ValueError, match="prefix"):
        write_samples(_dots(1), tmp_path, prefix)


def test_unserialisable_meta_names_the_key():
    sample = VisualSample([], "q", "t", meta={"f": object()})
    with pytest.raises(ValueError, match="'k-7'.*JSON-serialisable"):
        encode_sample(sample, "k-7")


def test_decode_errors_name_the_key_and_the_problem():
    record = encode_sample(_dots(1)[0], "k-0")
    with pytest.raises(ValueError, match="'k-0': missing 'json'"):
        decode_sample({k: v for k, v in record.items() if k != "json"})
    with pytest.raises(ValueError, match=r"'k-0': missing image 'img0.png' \(num_images=1\)"):
        decode_sample({k: v for k, v in record.items() if k != "img0.png"})
    with pytest.raises(ValueError, match="'k-0': cannot decode image 'img0.png'"):
        decode_sample({**record, "img0.png": b"\x89PNG garbage"})
    with pytest.raises(ValueError, match="'k-0': member 'json' is not valid JSON"):
        decode_sample({**record, "json": b"{not json"})
    bad = {**json.loads(record["json"]), "num_images": "one"}
    with pytest.raises(ValueError, match="'k-0': JSON field 'num_images'"):
        decode_sample({**record, "json": json.dumps(bad).encode()})
    newer = {**json.loads(record["json"]), "schema": SCHEMA_VERSION + 1}
    with pytest.raises(ValueError, match="'k-0': unsupported schema"):
        decode_sample({**record, "json": json.dumps(newer).encode()})


def test_expand_urls_braces_globs_and_lists(tmp_path):
    paths = [str(p) for p in write_samples(_dots(8), tmp_path, "dots", max_per_shard=2)]
    assert expand_urls(f"{tmp_path}/dots-{{000000..000003}}.tar") == paths
    assert expand_urls(f"{tmp_path}/dots-*.tar") == paths
    assert expand_urls([paths[1], paths[0]]) == [paths[1], paths[0]]
    assert expand_urls(f"{paths[0]}::{paths[2]}") == [paths[0], paths[2]]
    assert expand_urls("pipe:cat x-{0..1}.tar") == ["pipe:cat x-0.tar", "pipe:cat x-1.tar"]


def test_expand_urls_errors_name_the_pattern(tmp_path):
    pattern = f"{tmp_path}/nothing-*.tar"
    with pytest.raises(FileNotFoundError, match="nothing-\\*.tar.*matches no files"):
        expand_urls(pattern)
    with pytest.raises(FileNotFoundError, match="x-\\{0..1\\}.tar.*no such file"):
        expand_urls(f"{tmp_path}/x-{{0..1}}.tar")
    with pytest.raises(ValueError, match="no shard URLs"):
        expand_urls("")
    with pytest.raises(ValueError, match="no shard URLs"):
        expand_urls([])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_images": 0}, r"'k-0': image members \['img0.png'\] beyond num_images=0"),
        ({"answer": 3}, "'k-0': JSON field 'answer' must be a string, got int 3"),
        ({"answer": ["yes"]}, r"'k-0': JSON field 'answer' must be a string, got list \['yes'\]"),
        ({"reasoning": 1.5}, "'k-0': JSON field 'reasoning' must be a string, got float 1.5"),
        ({"question": 7}, "'k-0': JSON field 'question' missing or not a string"),
        ({"task": None}, "'k-0': JSON field 'task' missing or not a string"),
        ({"meta": [1]}, "'k-0': JSON field 'meta' must be an object, got list"),
        ({"num_images": True}, "'k-0': JSON field 'num_images' must be a non-negative int, got True"),
        ({"num_images": -1}, "'k-0': JSON field 'num_images' must be a non-negative int, got -1"),
        ({"schema": True}, "'k-0': unsupported schema True"),
    ],
)
def test_records_off_the_schema_are_refused_naming_the_field(change, message):
    record = encode_sample(_dots(1)[0], "k-0")
    fields = {**json.loads(record["json"]), **change}
    with pytest.raises(ValueError, match=message):
        decode_sample({**record, "json": json.dumps(fields).encode()})


def test_image_members_must_match_num_images_but_prompt_only_records_are_valid():
    sample = _dots(1)[0]
    record = encode_sample(sample, "k-0")
    with pytest.raises(ValueError, match=r"'k-0': image members \['img1.png', 'img7.png'\] beyond num_images=1"):
        decode_sample({**record, "img1.png": record["img0.png"], "img7.png": b""})
    prompt = decode_sample(encode_sample(VisualSample([], "draw a red square", "shape_prompts"), "p-0"))
    assert prompt.images == [] and prompt.question == "draw a red square"
    absent = {k: v for k, v in json.loads(record["json"]).items() if k != "answer"}
    assert decode_sample({**record, "json": json.dumps({**absent, "answer": None}).encode()}).answer is None
    assert decode_sample({**record, "txt": b"an unknown member is ignored"}).answer == sample.answer
