"""Damaged shards and invalid records are read past, counted and named: nothing is lost in silence.

Python's tarfile stops at a corrupt member header in the middle of a shard as if the archive ended there; these drills
corrupt shards written by the package's own writer and check that the reader resynchronises at the next member, that
the loss is counted (the shard once, each sample left incomplete) and that the warning names the file and the bytes.
"""

import gzip
import io
import json
import logging
import random
import re
import tarfile

import numpy as np
import pytest
import webdataset as wds

from app.data.shard_stream import ShardStream, SkipCounts
from app.data.shards import ShardDamageError, encode_sample, read_samples, tar_members, write_samples
from app.tasks.dots import DotsDataset
from app.types import VisualSample

PER_SHARD = 16


def _samples(n: int) -> list[VisualSample]:
    dataset = DotsDataset(num_samples=n, seed=0, image_size=16)
    out = []
    for i in range(n):
        sample = dataset[i]
        sample.meta["index"] = i
        out.append(sample)
    return out


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """One shard of 16 samples (keys ``x-000000000`` ...), its bytes, and its members by name."""
    out = tmp_path_factory.mktemp("shard")
    (path,) = write_samples(_samples(PER_SHARD), out, "x", max_per_shard=PER_SHARD)
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    return path.read_bytes(), members


def _header(members, name: str, kind: str) -> int:
    """Offset of a member's header block: ``pax`` (the extended header the writer puts first) or ``ustar``."""
    member = members[name]
    return member.offset if kind == "pax" else member.offset_data - tarfile.BLOCKSIZE


def _corrupt(data: bytes, offset: int, at: int = 148, garbage: bytes = b"99") -> bytes:
    """``data`` with ``garbage`` written over a header's checksum field (``at`` 148) or its name (``at`` 0)."""
    out = bytearray(data)
    out[offset + at : offset + at + len(garbage)] = garbage
    return bytes(out)


def _stream(path, caplog) -> tuple[list[VisualSample], SkipCounts, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.data.shard_stream"):
        items = list(ShardStream([str(path)], batch_size=4))
    skipped = SkipCounts()
    for item in items:
        skipped = skipped + item.skipped
    return [s for item in items for s in item.samples], skipped, [r.getMessage() for r in caplog.records]


def _assert_intact(delivered: list[VisualSample], originals: list[VisualSample]) -> None:
    for got in delivered:
        want = originals[got.meta["index"]]
        assert (got.question, got.answer, got.task) == (want.question, want.answer, want.task)
        assert np.array_equal(np.asarray(got.images[0]), np.asarray(want.images[0]))


@pytest.mark.parametrize(
    "member, kind, at, lost_member",
    [
        ("x-000000007.img0.png", "ustar", 148, "img0.png"),  # the member's own header: checksum
        ("x-000000007.img0.png", "ustar", 0, "img0.png"),  # ... its name
        ("x-000000007.json", "ustar", 148, "json"),
        ("x-000000000.json", "ustar", 148, "json"),  # near the start
        ("x-000000015.json", "ustar", 148, "json"),  # the last member
    ],
)
def test_a_corrupt_member_header_loses_only_its_sample_counted_and_named(
    shard, tmp_path, caplog, member, kind, at, lost_member
):
    data, members = shard
    path = tmp_path / "corrupt.tar"
    path.write_bytes(_corrupt(data, _header(members, member, kind), at, b"99" if at else b"garbage!"))
    lost = int(member[2:11])
    delivered, skipped, messages = _stream(path, caplog)
    assert [s.meta["index"] for s in delivered] == [i for i in range(PER_SHARD) if i != lost]  # after it too
    _assert_intact(delivered, _samples(PER_SHARD))
    assert skipped == SkipCounts(shards=1, samples=1)
    damage, sample = messages
    assert re.fullmatch(
        rf"damaged shard {re.escape(str(path))}: skipped \d+ bytes at offset {members[member].offset} (between|after) "
        r".* that hold no valid member header \(a corrupt header\); any members stored there are lost "
        r"\(worker 0: 1 shards, 0 samples skipped this epoch\)",
        damage,
    ), damage
    assert sample.startswith(f"skipping sample {member[:11]} of {path}: sample '{member[:11]}': missing")
    assert f"'{lost_member}'" in sample


def test_the_drill_from_the_issue_16_samples_a_corrupt_header_in_the_middle(shard, tmp_path, caplog):
    """Before the fix, tarfile ended the shard at the corrupt header: 11 of 16 samples dropped with no count."""
    data, members = shard
    for kind in ("pax", "ustar"):  # both header blocks of the member
        data = _corrupt(data, _header(members, "x-000000005.json", kind))
    path = tmp_path / "drill.tar"
    path.write_bytes(data)
    plain = list(wds.DataPipeline(wds.SimpleShardList([str(path)]), wds.tarfile_to_samples()))
    assert len(plain) == 6  # tarfile alone: samples 0-4 and half of 5, then nothing, and no error
    delivered, skipped, messages = _stream(path, caplog)
    assert len(delivered) == 15 and skipped == SkipCounts(shards=1, samples=1)
    assert messages[0] == (
        f"damaged shard {path}: skipped 2048 bytes at offset {members['x-000000005.json'].offset} between "
        "'x-000000005.img0.png' and 'x-000000006.img0.png' that hold no valid member header (a corrupt header); any "
        "members stored there are lost (worker 0: 1 shards, 0 samples skipped this epoch)"
    )


def test_a_corrupt_extended_header_loses_nothing_but_the_shard_is_still_counted(shard, tmp_path, caplog):
    """The writer puts a pax header before each member; with it corrupt, the member's own header still reads."""
    data, members = shard
    path = tmp_path / "pax.tar"
    path.write_bytes(_corrupt(data, _header(members, "x-000000009.img0.png", "pax")))
    delivered, skipped, messages = _stream(path, caplog)
    assert len(delivered) == PER_SHARD and skipped == SkipCounts(shards=1)
    assert messages == [
        f"damaged shard {path}: skipped 1024 bytes at offset {members['x-000000009.img0.png'].offset} between "
        "'x-000000008.json' and 'x-000000009.img0.png' that hold no valid member header (a corrupt header); any "
        "members stored there are lost (worker 0: 1 shards, 0 samples skipped this epoch)"
    ]


def test_two_damaged_places_count_the_shard_once_and_each_sample(shard, tmp_path, caplog):
    data, members = shard
    for name in ("x-000000003.img0.png", "x-000000011.json"):
        data = _corrupt(data, _header(members, name, "ustar"))
    path = tmp_path / "twice.tar"
    path.write_bytes(data)
    delivered, skipped, messages = _stream(path, caplog)
    assert sorted(s.meta["index"] for s in delivered) == [i for i in range(PER_SHARD) if i not in (3, 11)]
    assert skipped == SkipCounts(shards=1, samples=2)
    assert sum(m.startswith("damaged shard") for m in messages) == 2


def test_a_shard_cut_at_a_member_boundary_is_counted(shard, tmp_path, caplog):
    """No end-of-archive marker: tarfile reads a clean end, but whatever followed is gone (how much is unknown)."""
    data, members = shard
    path = tmp_path / "cut.tar"
    path.write_bytes(data[: members["x-000000012.img0.png"].offset])
    delivered, skipped, messages = _stream(path, caplog)
    assert [s.meta["index"] for s in delivered] == list(range(12))
    assert skipped == SkipCounts(shards=1)
    offset = members["x-000000012.img0.png"].offset
    assert messages == [
        f"damaged shard {path}: no end-of-archive marker after 'x-000000011.json' (offset {offset}): the shard was "
        "cut short; any members after it are lost (worker 0: 1 shards, 0 samples skipped this epoch)"
    ]


def test_zero_blocks_over_members_are_counted(shard, tmp_path, caplog):
    data, members = shard
    start, end = members["x-000000004.img0.png"].offset, members["x-000000005.img0.png"].offset
    path = tmp_path / "hole.tar"
    path.write_bytes(data[:start] + bytes(end - start) + data[end:])  # sample 4 zeroed out entirely
    delivered, skipped, messages = _stream(path, caplog)
    assert [s.meta["index"] for s in delivered] == [i for i in range(PER_SHARD) if i != 4]
    assert skipped == SkipCounts(shards=1)  # nothing of sample 4 is left to count: the shard stands for it
    assert messages == [
        f"damaged shard {path}: skipped {end - start} bytes of zero blocks at offset {start} between "
        "'x-000000003.json' and 'x-000000005.img0.png' (a hole, or concatenated archives); any members stored there "
        "are lost (worker 0: 1 shards, 0 samples skipped this epoch)"
    ]


def test_tar_members_reads_clean_and_compressed_shards_without_reports(shard):
    data, members = shard
    reports: list[str] = []
    names = [m["fname"] for m in tar_members(io.BytesIO(data), reports.append)]
    assert names == list(members) and reports == []
    assert [m["fname"] for m in tar_members(io.BytesIO(gzip.compress(data)), reports.append)] == names
    assert reports == []
    cut = gzip.compress(data[: members["x-000000002.img0.png"].offset])
    assert len(list(tar_members(io.BytesIO(cut), reports.append))) == 4
    assert len(reports) == 1 and "no end-of-archive marker after 'x-000000001.json'" in reports[0]


def test_tar_members_refuses_what_is_no_tar_and_raises_without_a_handler(shard):
    with pytest.raises(tarfile.ReadError, match="^not a tar archive: no valid member header in its 3000 bytes$"):
        list(tar_members(io.BytesIO(random.Random(0).randbytes(3000))))
    data, members = shard
    corrupt = _corrupt(data, _header(members, "x-000000001.json", "ustar"))
    with pytest.raises(ShardDamageError, match="between 'x-000000001.img0.png' and 'x-000000002.img0.png'"):
        list(tar_members(io.BytesIO(corrupt)))


def test_read_samples_raises_naming_the_damaged_shard(shard, tmp_path):
    data, members = shard
    path = tmp_path / "damaged.tar"
    path.write_bytes(_corrupt(data, _header(members, "x-000000006.img0.png", "ustar")))
    with pytest.raises(ShardDamageError, match=f"^shard {re.escape(str(path))}: skipped 2048 bytes at offset "):
        list(read_samples(str(path)))
    clean = tmp_path / "clean.tar"
    clean.write_bytes(data)
    assert [s.meta["index"] for s in read_samples(str(clean))] == list(range(PER_SHARD))


def _record(sample: VisualSample, key: str, **changes) -> dict:
    record = encode_sample(sample, key)
    fields = json.loads(record["json"])
    for name, value in changes.items():
        if name.endswith(".png"):
            record[name] = value
        else:
            fields[name] = value
    record["json"] = json.dumps(fields).encode()
    return record


def test_records_off_the_schema_are_counted_with_their_reason(tmp_path, caplog):
    samples = _samples(8)
    png = encode_sample(samples[0], "k")["img0.png"]
    path = tmp_path / "schema.tar"
    with wds.TarWriter(str(path)) as sink:
        sink.write(_record(samples[0], "ok-0"))
        sink.write(_record(samples[1], "zero-images", num_images=0))  # its img0.png is there: the record disagrees
        sink.write(_record(samples[2], "extra-image", **{"img1.png": png}))
        sink.write(_record(samples[3], "int-answer", answer=3))
        sink.write(_record(samples[4], "list-question", question=["what?"]))
        sink.write(_record(samples[5], "dict-reasoning", reasoning={"step": 1}))
        sink.write(_record(samples[6], "bool-schema", schema=True))
        prompt_only = VisualSample([], "draw a red square on the left", "shape_prompts")
        sink.write(encode_sample(prompt_only, "prompt-only"))  # num_images 0 and no image: a valid prompt
    delivered, skipped, messages = _stream(path, caplog)
    assert [s.question for s in delivered] == [samples[0].question, prompt_only.question]
    assert delivered[1].images == []
    assert skipped == SkipCounts(samples=6)
    reasons = [m.split(": ", 2)[2].rsplit(" (worker", 1)[0] for m in messages]
    assert reasons == [
        "image members ['img0.png'] beyond num_images=0 (the record and its images disagree)",
        "image members ['img1.png'] beyond num_images=1 (the record and its images disagree)",
        "JSON field 'answer' must be a string, got int 3",
        "JSON field 'question' missing or not a string",
        "JSON field 'reasoning' must be a string, got dict {'step': 1}",
        "unsupported schema True (this reader knows up to 2)",  # schema 2 added videos
    ]
