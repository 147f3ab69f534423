"""``python -m app.data convert``: the converter writes shards that read back as the file's rows and counts what it
skips; the newcomer page's commands train."""

import json

import numpy as np
import pytest
from PIL import Image

from app.data.__main__ import main
from app.data.files import FileDataset
from app.data.shards import read_samples


def write_rows(folder, n, bad=()):
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        Image.new("RGB", (4 + i, 5), (i, 2 * i, 3 * i)).save(folder / "images" / f"{i}.png")
        paths = ["images/missing.png"] if i in bad else [f"images/{i}.png"] * (1 + i % 2)
        rows.append({"question": f"q{i}?", "answer": str(i), "images": paths, "source": {"n": i}})
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def same(a, b):
    assert (a.question, a.answer, a.reasoning, a.task, a.meta) == (b.question, b.answer, b.reasoning, b.task, b.meta)
    assert [np.asarray(i).tolist() for i in a.images] == [np.asarray(i).tolist() for i in b.images]


def test_convert_round_trips_file_to_shards_to_samples(tmp_path, capsys):
    path = write_rows(tmp_path, 7)

    main(["convert", str(path), str(tmp_path / "shards"), "--max-per-shard", "3"])

    shards = sorted((tmp_path / "shards").glob("*.tar"))
    assert [p.name for p in shards] == ["rows-000000.tar", "rows-000001.tar", "rows-000002.tar"]
    from_shards = list(read_samples([str(p) for p in shards]))
    from_file = FileDataset(100, 0, 64, str(path))
    assert len(from_shards) == len(from_file) == 7
    for a, b in zip(from_shards, (from_file[i] for i in range(7)), strict=True):
        same(a, b)
    assert from_shards[3].meta == {"source": {"n": 3}} and len(from_shards[3].images) == 2
    out = capsys.readouterr().out
    assert "wrote 7 samples to 3 shards" in out and "7 good rows, 0 skipped" in out


def test_convert_writes_a_videos_column_sampled_by_its_video_options(tmp_path, capsys):
    import cv2

    writer = cv2.VideoWriter(str(tmp_path / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 8.0, (64, 48))
    for i in range(24):  # 3 s
        writer.write(np.full((48, 64, 3), 10 * i, dtype=np.uint8))
    writer.release()
    path = tmp_path / "clips.jsonl"
    path.write_text(json.dumps({"problem": "<video> Which way?", "answer": "left", "videos": ["clip.avi"]}) + "\n")
    options = ["--video-fps", "2", "--max-video-frames", "4", "--max-video-pixels", str(32 * 24)]

    main(["convert", str(path), str(tmp_path / "shards"), "--format", "easyr1", *options])

    (sample,) = read_samples([str(p) for p in sorted((tmp_path / "shards").glob("*.tar"))])
    (video,) = sample.videos  # 2 fps over 3 s is 6 frames, capped at 4, each scaled to 32 x 24
    assert video.frames.shape == (4, 24, 32, 3) and video.fps == pytest.approx(4 / 3)
    assert sample.question == "<video> Which way?" and "1 good rows, 0 skipped" in capsys.readouterr().out


def test_the_byte_limit_closes_a_shard_once_it_holds_that_many_bytes(tmp_path, capsys):
    from app.data.shards import encode_sample

    path = write_rows(tmp_path, 7)
    samples = [FileDataset(7, 0, 64, str(path))[i] for i in range(7)]
    payload = [sum(len(v) for k, v in encode_sample(s, "k").items() if k != "__key__") for s in samples]
    limit = payload[0] + payload[1]  # the files' bytes the writer counts (tar headers not included)

    main(["convert", str(path), str(tmp_path / "shards"), "--max-shard-bytes", str(limit)])

    shards = sorted((tmp_path / "shards").glob("*.tar"))
    counts = [len(list(read_samples([str(p)]))) for p in shards]
    assert counts[0] == 2 and sum(counts) == 7 and len(shards) >= 3  # shard 0 closes once its two samples fill it
    assert f"wrote 7 samples to {len(shards)} shards" in capsys.readouterr().out


def test_pair_rows_are_not_converted_to_single_prompt_shards(tmp_path):
    row = {"question": "q?", "images": [], "twin": {"question": "q'?", "images": [], "relation": "identity"}}
    (tmp_path / "pairs.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(SystemExit, match="reads each row as a prompt pair"):
        main(["convert", str(tmp_path / "pairs.jsonl"), str(tmp_path / "shards"), "--format", "ot_grpo"])


def test_convert_is_deterministic(tmp_path):
    path = write_rows(tmp_path, 4)
    main(["convert", str(path), str(tmp_path / "a")])
    main(["convert", str(path), str(tmp_path / "b")])
    assert (tmp_path / "a" / "rows-000000.tar").read_bytes() == (tmp_path / "b" / "rows-000000.tar").read_bytes()


def test_convert_skips_and_lists_bad_rows_or_stops_at_the_first(tmp_path, capsys):
    path = write_rows(tmp_path, 6, bad=(1, 4))

    main(["convert", str(path), str(tmp_path / "shards"), "--on-bad-row", "skip"])

    assert [s.answer for s in read_samples(str(tmp_path / "shards" / "rows-000000.tar"))] == ["0", "2", "3", "5"]
    out = capsys.readouterr().out
    assert (
        "wrote 4 samples to 1 shards" in out and "4 good rows, 2 skipped (2 x images: image 'images/missing.png'" in out
    )
    assert f"skipped {path}: row 1, field 'images'" in out and f"skipped {path}: row 4, field 'images'" in out
    with pytest.raises(
        SystemExit, match=r"^error: .*rows.jsonl: row 1, field 'images': image 'images/missing.png' not"
    ):
        main(["convert", str(path), str(tmp_path / "stopped")])


@pytest.mark.slow
def test_the_your_data_quickstart_trains_on_the_example_folder(tmp_path, monkeypatch):
    """The commands of docs/your_data.md: two ``python -m app.tasks dots ... --format jsonl``, then the quickstart
    config (cut to 2 steps)."""
    import math
    from pathlib import Path

    from app.command_line.commands import AppCLI
    from app.tasks.__main__ import main as tasks_main

    monkeypatch.chdir(tmp_path)  # the config's relative paths (data, runs) land in tmp_path
    for split, num, seed in (("train", "64", "0"), ("val", "16", "1")):
        tasks_main(
            ["dots", "--out", "data/your_data", "--num", num, "--seed", seed, "--dot-radius", "12"]
            + ["--format", "jsonl", "--prefix", split]
        )
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart" / "your_data_jsonl.yaml"
    args = ["--config", str(config), "--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false"]
    cli = AppCLI(args=args, run=False)

    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    assert cli.trainer.global_step == 2 and len(cli.datamodule.train_dataset) == 64
    assert cli.datamodule.train_dataset[0].question.startswith("Is the red dot")
    assert math.isfinite(float(cli.trainer.callback_metrics["train/reward/accuracy"]))


@pytest.mark.slow
def test_a_bad_row_stops_python_m_app_fit_with_a_short_message(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from app.command_line.commands import main as app_main

    monkeypatch.chdir(tmp_path)
    path = write_rows(tmp_path, 6, bad=(4,))
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart" / "your_data_jsonl.yaml"
    data = "--data.init_args.dataset.init_args.path"

    with pytest.raises(SystemExit) as exit_info:
        app_main(
            ["fit", "--config", str(config), data, str(path), "--data.init_args.eval_dataset.init_args.path", str(path)]
        )

    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert f"error: {path}: row 4, field 'images': image 'images/missing.png' not found" in err
    assert "Traceback" not in err
