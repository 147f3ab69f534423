"""The suite writes to WebDataset shards deterministically and reads back what the scorers need."""

import numpy as np
import pytest

from app.tasks.__main__ import main as data_main
from app.tasks.vbvr import get_task
from app.tasks.vbvr.shards import read_shards, write_shards


def test_shards_round_trip_and_the_stored_rendering_scores_one(tmp_path):
    paths = write_shards(tmp_path, num_per_task=2, seed=0, tasks=["object_counting"], max_per_shard=3)
    assert [p.name for p in paths] == ["vbvr-in_domain-000000.tar"]
    samples = list(read_shards([str(p) for p in paths]))
    assert len(samples) == 2
    for sample in samples:
        record = sample["record"]
        task = get_task(record["task"], **record["params"])
        assert task.score(sample["last"], record["config"]).score == 1.0
        assert task.score(sample["video"], record["config"]).score == 1.0
        assert sample["video"].dtype == np.uint8 and sample["keyframes"].shape[0] == len(record["key_frame_indices"])
        np.testing.assert_array_equal(sample["video"][-1], sample["last"])
        assert sample["prompt"] and record["split"] == "in_domain"


def test_same_seed_same_bytes(tmp_path):
    a = write_shards(tmp_path / "a", 2, seed=5, tasks=["object_counting"])
    b = write_shards(tmp_path / "b", 2, seed=5, tasks=["object_counting"])
    assert [s["record"] for s in read_shards(str(a[0]))] == [s["record"] for s in read_shards(str(b[0]))]


def test_out_of_domain_split_uses_the_harder_parameters(tmp_path):
    paths = write_shards(tmp_path, 1, split="out_of_domain", tasks=["object_counting"])
    record = next(iter(read_shards(str(paths[0]))))["record"]
    assert record["split"] == "out_of_domain"
    assert record["params"] != {"image_size": 128, **get_task("object_counting").params}


def test_unknown_task_or_split_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown tasks"):
        write_shards(tmp_path, 1, tasks=["no_such_task"])
    with pytest.raises(ValueError, match="split"):
        write_shards(tmp_path, 1, split="test", tasks=["object_counting"])


def test_data_cli_writes_shards(tmp_path, capsys):
    data_main(["vbvr", "--out", str(tmp_path), "--num", "1", "--tasks", "object_counting"])
    assert "wrote 1 shard(s)" in capsys.readouterr().out
    assert list(tmp_path.glob("*.tar"))


def test_a_corrupt_header_mid_shard_is_an_error_naming_the_shard(tmp_path):
    import tarfile

    from app.data.shards import ShardDamageError

    (path,) = write_shards(tmp_path, num_per_task=3, seed=0, tasks=["object_counting"])
    with tarfile.open(path) as tar:
        offsets = [m.offset for m in tar.getmembers() if m.name.endswith(".last.png")]
    data = bytearray(path.read_bytes())
    data[offsets[1] + 148 : offsets[1] + 150] = b"99"  # the second sample's last-frame header: a bad checksum
    path.write_bytes(bytes(data))
    with pytest.raises(ShardDamageError, match=f"shard {path}"):
        list(read_shards(str(path)))
