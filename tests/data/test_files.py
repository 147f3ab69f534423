"""File-backed data sets: each anchor's layout and file type reads into the samples its rows hold, and every kind of
bad row stops with its file, row and field named, or is skipped and counted."""

import io
import json
import logging
import re
from pathlib import Path

import cv2
import datasets
import numpy as np
import pytest
from PIL import Image, ImageFile

from app.data import VisualTaskDataModule
from app.data.files import FileDataset, write_folder
from app.data.rows import BadRowError, RowReader
from app.data.tables import load_table
from app.types import VisualSample


def write_png(path, color, size=(8, 6)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def png_bytes(color, size=(8, 6)):
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_clip(path, frames: int = 4, size=(16, 12), fps: float = 4.0):
    """An MJPG clip whose frame i is a flat grey of value 10 * i."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, size)
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), 10 * i, dtype=np.uint8))
    writer.release()
    return path


def pixel(image):
    return np.asarray(image)[0, 0].tolist()


@pytest.fixture
def folder(tmp_path):
    write_png(tmp_path / "images" / "red.png", (255, 0, 0))
    write_png(tmp_path / "images" / "blue.png", (0, 0, 255))
    return tmp_path


def test_default_fields_read_question_answer_images_and_meta(folder):
    rows = [
        {"question": "Which is left?", "answer": "red", "images": ["images/red.png", "images/blue.png"], "level": 2},
        {"question": "How many?", "answer": 3, "reasoning": "I count three.", "task": "count", "images": []},
    ]
    data = FileDataset(10, 0, 64, str(write_jsonl(folder / "train.jsonl", rows)))

    first, second = data[0], data[1]
    assert len(data) == 2
    assert (first.question, first.answer, first.task, first.meta) == ("Which is left?", "red", "custom", {"level": 2})
    assert [pixel(image) for image in first.images] == [[255, 0, 0], [0, 0, 255]]
    assert first.images[0].size == (8, 6) and first.images[0].mode == "RGB"
    assert (second.answer, second.reasoning, second.task, second.images) == ("3", "I count three.", "count", [])
    assert second.meta == {"level": None}  # a JSONL column missing from a row reads as null


def test_trl_chat_prompt_with_image_column_and_solution(folder):
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]},
            ],
            "image": "images/red.png",
            "solution": "red",
            "difficulty": "easy",
        }
    ]
    sample = FileDataset(1, 0, 64, str(write_jsonl(folder / "t.jsonl", rows)), RowReader(preset="trl"))[0]
    assert (sample.question, sample.answer) == ("<image>What colour?", "red")  # the image part stays in place
    assert [pixel(image) for image in sample.images] == [[255, 0, 0]]
    assert sample.meta == {"difficulty": "easy", "system": "Be brief."}


def test_verl_parquet_with_image_bytes_and_nested_ground_truth(tmp_path):
    table = datasets.Dataset.from_list(
        [
            {
                "data_source": "geo3k",
                "prompt": [{"role": "user", "content": "<image>Find x."}],
                "images": [{"bytes": png_bytes((0, 255, 0)), "path": None}],
                "reward_model": {"style": "rule", "ground_truth": "12"},
                "extra_info": {"index": 7},
            }
        ]
    )
    table.to_parquet(str(tmp_path / "train.parquet"))

    sample = FileDataset(1, 0, 64, str(tmp_path / "train.parquet"), RowReader(preset="verl"))[0]

    assert (sample.question, sample.answer, sample.task) == ("<image>Find x.", "12", "geo3k")
    assert [pixel(image) for image in sample.images] == [[0, 255, 0]]
    assert sample.meta == {"reward_model": {"style": "rule", "ground_truth": "12"}, "extra_info": {"index": 7}}


def test_easyr1_json_array_with_image_dir_and_template(folder):
    path = folder / "data" / "train.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"problem": "<image> Count the dots.", "answer": "4", "images": ["blue.png"]}]))
    reader = RowReader(preset="easyr1", image_dir=str(folder / "images"), prompt_template="{question} Be exact.")

    sample = FileDataset(1, 0, 64, str(path), reader)[0]

    assert (sample.question, sample.answer) == ("<image> Count the dots. Be exact.", "4")
    assert [pixel(image) for image in sample.images] == [[0, 0, 255]]


def test_swift_messages_keep_the_assistant_turn_in_meta(folder):
    rows = [
        {
            "messages": [
                {"role": "user", "content": "<image><image>Same colour?"},
                {"role": "assistant", "content": "<answer>no</answer>"},
            ],
            "images": ["images/red.png", "images/blue.png"],
            "solution": "no",
        }
    ]
    sample = FileDataset(1, 0, 64, str(write_jsonl(folder / "s.jsonl", rows)), RowReader(preset="swift"))[0]
    assert (sample.question, sample.answer, len(sample.images)) == ("<image><image>Same colour?", "no", 2)
    assert sample.meta == {"response": "<answer>no</answer>"}


def test_easyr1_verl_and_swift_read_a_videos_column_sampled_by_the_reader_s_options(folder):
    write_clip(folder / "images" / "clip.avi", frames=24, size=(64, 48), fps=8.0)  # 3 s
    reader_options = dict(image_dir=str(folder / "images"), video_fps=2.0, max_video_frames=4, max_video_pixels=32 * 24)
    easyr1 = [{"problem": "<video> Which way?", "answer": "left", "videos": ["clip.avi"], "images": []}]
    verl = [
        {
            "prompt": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which way?"}]}],
            "videos": ["clip.avi"],
            "reward_model": {"ground_truth": "left"},
            "data_source": "moving",
        }
    ]
    swift = [{"messages": [{"role": "user", "content": "<video>Which way?"}], "videos": "clip.avi", "solution": "left"}]
    for preset, rows in (("easyr1", easyr1), ("verl", verl), ("swift", swift)):
        path = str(write_jsonl(folder / f"{preset}.jsonl", rows))
        sample = FileDataset(1, 0, 64, path, RowReader(preset=preset, **reader_options))[0]
        assert sample.answer == "left" and sample.question.startswith("<video>") and "videos" not in sample.meta
        (video,) = sample.videos
        # 2 fps over 3 s is 6 frames, capped at 4; 64 x 48 scaled to 32 x 24; 4 of 24 frames at 8 fps is 4/3 fps
        assert video.frames.shape == (4, 24, 32, 3) and video.fps == pytest.approx(4 / 3), preset
        means = video.frames.reshape(4, -1).mean(axis=1)  # frame i is 10 i grey: linspace(0, 23, 4) -> 0, 8, 15, 23
        np.testing.assert_allclose(means, [0, 80, 150, 230], atol=5)


def test_a_videos_column_of_a_layout_without_videos_goes_to_meta(folder):
    rows = [{"prompt": "Which way?", "solution": "left", "videos": ["clip.avi"]}]
    sample = FileDataset(1, 0, 64, str(write_jsonl(folder / "t.jsonl", rows)), RowReader(preset="trl"))[0]
    assert sample.videos == [] and sample.meta == {"videos": ["clip.avi"]}


def test_building_the_data_set_checks_video_headers_without_decoding(folder, monkeypatch):
    write_clip(folder / "images" / "clip.avi")
    rows = [{"question": "Which way?", "videos": ["clip.avi"]}]
    path = str(write_jsonl(folder / "v.jsonl", rows))
    monkeypatch.setattr(cv2.VideoCapture, "retrieve", lambda self: (_ for _ in ()).throw(AssertionError("decoded")))
    data = FileDataset(1, 0, 64, path, RowReader(image_dir=str(folder / "images")))
    assert len(data) == 1
    with pytest.raises(AssertionError, match="decoded"):
        data[0]


def test_csv_with_a_json_list_of_paths_and_a_saved_table_with_image_features(folder):
    csv = folder / "rows.csv"
    csv.write_text('question,answer,images\nLeft?,yes,"[""images/red.png"", ""images/blue.png""]"\n')
    assert [pixel(i) for i in FileDataset(1, 0, 64, str(csv))[0].images] == [[255, 0, 0], [0, 0, 255]]

    features = datasets.Features({"question": datasets.Value("string"), "image": datasets.Image()})
    saved = datasets.Dataset.from_dict(
        {"question": ["Colour?"], "image": [Image.new("RGB", (5, 5), (9, 9, 9))]}, features=features
    )
    saved.save_to_disk(str(folder / "saved"))
    sample = FileDataset(1, 0, 64, str(folder / "saved"))[0]
    assert (sample.question, [pixel(i) for i in sample.images], sample.answer) == ("Colour?", [[9, 9, 9]], None)


def test_text_file_is_one_prompt_a_line_for_the_flow_preset(tmp_path):
    (tmp_path / "train.txt").write_text("a red square\n\nA blue circle on the left\n")
    data = FileDataset(10, 0, 64, str(tmp_path / "train.txt"), RowReader(preset="flow"))
    assert [data[i].question for i in range(len(data))] == ["a red square", "A blue circle on the left"]
    assert all(data[i].images == [] and data[i].answer is None for i in range(len(data)))


def test_flow_jsonl_carries_negative_prompt_and_conditioning_image(folder):
    rows = [{"prompt": "paint it blue", "negative_prompt": "blurry", "image": "images/red.png", "video": "v.mp4"}]
    sample = FileDataset(1, 0, 64, str(write_jsonl(folder / "edit.jsonl", rows)), RowReader(preset="flow"))[0]
    assert sample.question == "paint it blue" and [pixel(i) for i in sample.images] == [[255, 0, 0]]
    assert sample.meta == {"negative_prompt": "blurry", "video": "v.mp4"}


# ------------------------------------------------------------------------------------------------------ bad rows
GOOD = {"id": 0, "question": "Q?", "answer": "a", "images": ["red.png"]}
BAD_ROWS = {
    "missing image": ({"images": ["none.png"]}, "images", "not found"),
    "unreadable image": ({"images": ["junk.png"]}, "images", "unreadable image"),
    "wrong type": ({"answer": ["a", "b"]}, "answer", "must be a string, got list"),
    "empty question": ({"question": "  <image> "}, "question", "empty question"),
    "image over the limit": ({"images": ["big.png"]}, "images", "image of 40x30 pixels, over max_image_pixels"),
    "duplicate key": ({"id": 0}, "id", "duplicate key '0' (first at row 0)"),
    "path leaving image_dir": ({"images": ["../outside.png"]}, "images", "leaves image_dir"),
    "placeholders": ({"question": "<image><image>Q?"}, "question", "2 <image> placeholders for 1 images"),
    "missing video": ({"videos": ["none.avi"]}, "videos", "video 'none.avi' not found"),
    "unreadable video": ({"videos": ["junk.mp4"]}, "videos", "video 'junk.mp4': unreadable video"),
    "video over the limit": (
        {"videos": ["long.avi"]},
        "videos",
        "video 'long.avi': 20 frames, over max_source_frames=10 (the reader's max_video_source_frames)",
    ),
    "video frames over the limit": (
        {"videos": ["wide.avi"]},
        "videos",
        "video 'wide.avi': frames of 40x30 pixels, over max_source_pixels=1000 (the reader's max_image_pixels)",
    ),
    "video path leaving image_dir": ({"videos": ["../clip.avi"]}, "videos", "video path '../clip.avi' leaves"),
    "video placeholders": ({"question": "<image> <video> Q?"}, "question", "1 <video> placeholders for 0 videos"),
    "too many videos": ({"videos": ["clip.avi"] * 5}, "videos", "5 videos, more than max_videos=4"),
}


def bad_file(folder, change):
    write_png(folder / "images" / "big.png", (1, 1, 1), size=(40, 30))
    (folder / "images" / "junk.png").write_bytes(b"not a png")
    write_png(folder / "outside.png", (1, 1, 1))
    write_clip(folder / "images" / "long.avi", frames=20)
    write_clip(folder / "images" / "wide.avi", size=(40, 30))
    write_clip(folder / "clip.avi")
    (folder / "images" / "junk.mp4").write_bytes(b"not a video" * 50)
    rows = [GOOD, {**GOOD, "id": 1}, {**GOOD, "id": 2, **change}, {**GOOD, "id": 3}]
    return str(write_jsonl(folder / "bad.jsonl", rows))


@pytest.mark.parametrize("kind", list(BAD_ROWS))
def test_a_bad_row_stops_the_run_naming_file_row_and_field(folder, kind):
    change, field, reason = BAD_ROWS[kind]
    path = bad_file(folder, change)
    reader = RowReader(key="id", image_dir=str(folder / "images"), max_image_pixels=1000, max_video_source_frames=10)

    with pytest.raises(BadRowError) as error:
        FileDataset(10, 0, 64, path, reader)

    assert error.value.bad_row.file == path and error.value.bad_row.row == 2 and error.value.bad_row.field == field
    assert reason in str(error.value) and f"{path}: row 2, field {field!r}" in str(error.value)


@pytest.mark.parametrize("kind", list(BAD_ROWS))
def test_skip_skips_counts_and_logs_the_bad_row(folder, kind, caplog):
    change, field, reason = BAD_ROWS[kind]
    reader = RowReader(
        key="id", image_dir=str(folder / "images"), max_image_pixels=1000, max_video_source_frames=10, on_bad_row="skip"
    )

    with caplog.at_level(logging.WARNING, logger="app.data.rows"):
        data = FileDataset(10, 0, 64, bad_file(folder, change), reader)

    assert len(data) == 3 and [data[i].meta["id"] for i in range(3)] == [0, 1, 3]
    assert [(bad.row, bad.field) for bad in data.bad_rows] == [(2, field)]
    assert reason in caplog.text and "3 good rows, 1 skipped" in caplog.text


def test_the_size_limit_is_read_from_the_header_without_decoding(folder, monkeypatch):
    path = bad_file(folder, {"images": ["big.png"]})

    def no_decoding(self):
        raise AssertionError("decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    with pytest.raises(BadRowError, match="image of 40x30 pixels"):
        FileDataset(10, 0, 64, path, RowReader(image_dir=str(folder / "images"), max_image_pixels=1000))


def test_outside_paths_are_read_when_allowed(folder):
    path = bad_file(folder, {"images": ["../outside.png"]})
    data = FileDataset(10, 0, 64, path, RowReader(image_dir=str(folder / "images"), allow_outside_image_dir=True))
    assert len(data) == 4 and pixel(data[2].images[0]) == [1, 1, 1]


def test_write_folder_reads_back_as_the_samples(tmp_path):
    two = [Image.new("RGB", (4, 3), (5, 6, 7)), Image.new("RGB", (2, 2), (8, 9, 10))]
    samples = [
        VisualSample(two, "Same colour?", "compare", "no", "They differ."),
        VisualSample([], "A label-free question", "free"),
    ]
    path = write_folder(samples, tmp_path / "out", "train")

    data = FileDataset(10, 0, 64, str(path))
    got = [data[0], data[1]]
    assert [(s.question, s.task, s.answer, s.reasoning, s.meta) for s in got] == [
        ("Same colour?", "compare", "no", "They differ.", {}),
        ("A label-free question", "free", None, None, {}),
    ]
    assert [pixel(image) for image in got[0].images] == [[5, 6, 7], [8, 9, 10]] and got[1].images == []


# ------------------------------------------------------------------------------------------------------ splits
def numbered_rows(folder, n):
    return str(write_jsonl(folder / "rows.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(n)]))


def test_held_out_part_is_disjoint_and_covers_the_file(folder):
    path = numbered_rows(folder, 40)
    train = FileDataset(100, 0, 64, path, holdout_fraction=0.25)
    held = FileDataset(100, 0, 64, path, holdout_fraction=0.25, part="holdout")
    assert sorted(train.indices + held.indices) == list(range(40)) and not set(train.indices) & set(held.indices)
    assert 4 <= len(held) <= 16  # 0.25 of 40 rows, a fixed draw; far outside these bounds the draw would be broken


def test_num_samples_takes_the_first_good_rows(folder):
    data = FileDataset(3, 0, 64, numbered_rows(folder, 10))
    assert [data[i].question for i in range(len(data))] == ["q0", "q1", "q2"]


def test_serves_visual_task_data_module_with_separate_eval_file(folder):
    train = numbered_rows(folder, 8)
    val = str(write_jsonl(folder / "val.jsonl", [{"question": "v0"}, {"question": "v1"}]))
    module = VisualTaskDataModule(
        dataset=lambda n, seed, size: FileDataset(n, seed, size, train),
        eval_dataset=lambda n, seed, size: FileDataset(n, seed, size, val),
        train_size=100,
        val_size=2,
        test_size=2,
        batch_size=4,
    )
    batches = list(module.train_dataloader())
    assert len(batches) == 2 and sorted(s.question for b in batches for s in b) == [f"q{i}" for i in range(8)]
    assert [s.question for s in next(iter(module.val_dataloader()))] == ["v0", "v1"]


def test_unknown_file_type_and_missing_file_name_the_path(tmp_path):
    (tmp_path / "rows.xml").write_text("<rows/>")
    with pytest.raises(ValueError, match=r"rows.xml'?: unknown data file type '.xml'"):
        load_table(tmp_path / "rows.xml")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_table(tmp_path / "nope.jsonl")


# ------------------------------------------------------------------------------------------------------ end to end
def anchor_file(folder, preset):
    """Four dots-like rows in ``preset``'s own layout; the path of the file."""
    write_png(folder / "images" / "red.png", (255, 0, 0), size=(64, 64))
    questions = [f"Is the red dot left of the blue dot? ({i})" for i in range(4)]
    if preset == "trl":
        rows = [
            {
                "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}],
                "image": "images/red.png",
                "solution": "yes",
            }
            for q in questions
        ]
    elif preset == "verl":
        rows = [
            {
                "data_source": "dots",
                "prompt": [{"role": "user", "content": f"<image>{q}"}],
                "images": [{"bytes": png_bytes((255, 0, 0), (64, 64)), "path": None}],
                "reward_model": {"style": "rule", "ground_truth": "yes"},
            }
            for q in questions
        ]
        datasets.Dataset.from_list(rows).to_parquet(str(folder / "train.parquet"))
        return folder / "train.parquet"
    elif preset == "easyr1":
        rows = [{"problem": f"<image>{q}", "answer": "yes", "images": ["images/red.png"]} for q in questions]
    else:  # swift
        rows = [
            {"messages": [{"role": "user", "content": f"<image>{q}"}], "images": ["images/red.png"], "solution": "yes"}
            for q in questions
        ]
    return write_jsonl(folder / "train.jsonl", rows)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["trl", "verl", "easyr1", "swift"])
def test_each_anchor_layout_trains_the_tiny_model_two_steps(preset, tmp_path, fit):
    import functools
    import math

    from app.command_line.commands import AppCLI

    path = str(anchor_file(tmp_path, preset))
    factory = functools.partial(FileDataset, path=path, rows=RowReader(preset=preset))
    data = VisualTaskDataModule(dataset=factory, train_size=4, val_size=2, test_size=2, batch_size=2)
    config = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny_grpo.yaml")
    cli = AppCLI(args=["--config", config, "--trainer.default_root_dir", str(tmp_path)], run=False)

    trainer, recorder = fit(cli.model, data)

    assert trainer.global_step == 2
    rewards = recorder.metric("train/reward/accuracy")
    assert len(rewards) == 2 and all(math.isfinite(value) for value in rewards)


def flow_prompt_file(folder, kind):
    prompts = ["a red square on the left", "a blue circle on the top", "a green square on the right", "a red circle"]
    if kind == "text-to-image":
        (folder / "train.txt").write_text("\n".join(prompts) + "\n")
        return folder / "train.txt"
    write_png(folder / "images" / "start.png", (128, 128, 128), size=(64, 64))
    if kind == "vbvr":
        return vbvr_file(folder, prompts)
    rows = [{"prompt": p, "negative_prompt": "blurry", "image": "images/start.png"} for p in prompts]
    return write_jsonl(folder / "train.jsonl", rows)


def vbvr_file(folder, prompts):
    """Rows in the columns of VBVR-Dataset's ``data/metadata.parquet``."""
    rows = [
        {
            "id": i,
            "generator": "G-1",
            "task": "object_counting",
            "sample_id": f"G-1_{i:05d}",
            "prompt": prompt,
            "metadata_json": json.dumps({"seed": i}),
            "first_frame_path": "images/start.png",
            "final_frame_path": "images/end.png",
            "ground_truth_video_path": "videos/gt.mp4",
            "tar_file": "G-1.tar",
        }
        for i, prompt in enumerate(prompts)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "metadata.parquet"))
    return folder / "metadata.parquet"


def test_vbvr_metadata_rows_condition_on_the_first_frame(tmp_path):
    write_png(tmp_path / "images" / "start.png", (1, 2, 3), size=(64, 64))
    sample = FileDataset(1, 0, 64, str(vbvr_file(tmp_path, ["fill the cup"])), RowReader(preset="vbvr"))[0]
    assert (sample.question, sample.task, [pixel(i) for i in sample.images]) == (
        "fill the cup",
        "object_counting",
        [[1, 2, 3]],
    )
    assert sample.meta["final_frame_path"] == "images/end.png" and json.loads(sample.meta["metadata_json"]) == {
        "seed": 0
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, model", [("text-to-image", "tiny-sd3"), ("image-edit", "tiny-flux-kontext"), ("vbvr", "tiny-flux-kontext")]
)
def test_flow_prompt_files_train_the_tiny_flow_model_two_steps(kind, model, tmp_path, monkeypatch, fit):
    import functools
    import math

    from app.command_line.commands import AppCLI

    monkeypatch.chdir(tmp_path)
    rows = RowReader(preset="vbvr" if kind == "vbvr" else "flow")
    factory = functools.partial(FileDataset, path=str(flow_prompt_file(tmp_path, kind)), rows=rows)
    data = VisualTaskDataModule(dataset=factory, train_size=4, val_size=2, test_size=2, batch_size=2, image_size=64)
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart" / "quickstart_flow.yaml"
    args = ["--config", str(config), "--model.init_args.policy.init_args.model", model]
    args += ["--model.init_args.sampling.group_size", "2", "--model.init_args.sampling.num_steps", "2"]
    cli = AppCLI(args=args, run=False)

    trainer, recorder = fit(cli.model, data)

    rewards = recorder.metric("train/reward/color_region")
    assert trainer.global_step == 2 and len(rewards) == 2 and all(math.isfinite(value) for value in rewards)
    assert data.train_dataset[0].meta.get("negative_prompt") == ("blurry" if kind == "image-edit" else None)
    assert len(data.train_dataset[0].images) == (0 if kind == "text-to-image" else 1)


# ------------------------------------------------------------------------------------------------------ paper formats
REASON_RFT_SUITES = {
    # suite: (config, reward the config trains with, image field as the paper's JSON writes it, answer, solution)
    "counting": ("reason_rft_counting.yaml", "NumericToleranceReward", "a.png", "3", "<answer>3</answer>"),
    "structure": (
        "quickstart.yaml",
        "AccuracyReward",
        [{"path": "a.png"}],
        "B",
        "<think>The angle is 30 degrees.</think><answer>B</answer>",
    ),
    "transformation": (
        "reason_rft_transform.yaml",
        "FunctionSequenceReward",
        ["a.png", "b.png"],
        "change_color(obj_1, red), change_position(obj_2, left)",
        "<answer>change_color(obj_1, red), change_position(obj_2, left)</answer>",
    ),
}


def reason_rft_file(folder, suite):
    """Four rows of Reason-RFT's released JSON (its ``grpo.py`` reads ``problem``, ``image`` and ``solution``, image
    paths relative to ``--image_path``)."""
    _, _, image, _, solution = REASON_RFT_SUITES[suite]
    write_png(folder / "train_images" / "a.png", (200, 30, 30), size=(64, 64))
    write_png(folder / "train_images" / "b.png", (30, 30, 200), size=(64, 64))
    rows = [
        {"id": i, "problem": f"Question {i} of the {suite} suite?", "image": image, "solution": solution}
        for i in range(4)
    ]
    (folder / "train.json").write_text(json.dumps(rows))
    return str(folder / "train.json")


def test_a_tagged_solution_gives_the_answer_and_its_reasoning(tmp_path):
    path = reason_rft_file(tmp_path, "structure")
    sample = FileDataset(1, 0, 64, path, RowReader(preset="reason_rft", image_dir=str(tmp_path / "train_images")))[0]
    assert (sample.answer, sample.reasoning) == ("B", "The angle is 30 degrees.")
    assert sample.question == "Question 0 of the structure suite?" and pixel(sample.images[0]) == [200, 30, 30]


@pytest.mark.slow
@pytest.mark.parametrize("suite", list(REASON_RFT_SUITES))
def test_reason_rft_json_trains_with_the_suites_reward(suite, tmp_path, monkeypatch, fit):
    import functools
    import math

    from app.command_line.commands import AppCLI

    config_name, reward_class, image, answer, _ = REASON_RFT_SUITES[suite]
    reader = RowReader(preset="reason_rft", image_dir=str(tmp_path / "train_images"), key="id")
    factory = functools.partial(FileDataset, path=reason_rft_file(tmp_path, suite), rows=reader)
    data = VisualTaskDataModule(dataset=factory, train_size=4, val_size=2, test_size=2, batch_size=2)
    sample = data._build("train", 4)[0]
    assert sample.answer == answer and len(sample.images) == (len(image) if isinstance(image, list) else 1)
    assert sample.meta == {"id": 0}

    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart" / config_name
    cli = AppCLI(args=["--config", str(config), "--model.init_args.policy.init_args.model", "tiny-qwen3-vl"], run=False)
    reward = next(r for r in cli.model.rewards.components if type(r).__name__ == reward_class)
    right, wrong = f"<think>x</think><answer>{answer}</answer>", "<think>x</think><answer>7 C</answer>"
    assert reward.score([right, wrong], [sample, sample]).tolist() == [1.0, 0.0]  # the row's answer is what it reads

    trainer, recorder = fit(cli.model, data)

    assert trainer.global_step == 2
    rewards = recorder.metric(f"train/reward/{reward.name}")
    assert len(rewards) == 2 and all(math.isfinite(value) for value in rewards)


def test_an_unparseable_file_stops_naming_the_file_and_the_row(tmp_path):
    from app.errors import ConfigError

    (tmp_path / "broken.jsonl").write_text('{"question": "a"}\n{"question": broken\n')
    with pytest.raises(ConfigError, match=r"broken.jsonl'?: cannot read it: .*JSON parse error.* in row 1"):
        load_table(tmp_path / "broken.jsonl")


@pytest.mark.slow
def test_rows_with_reasoning_train_the_sft_stage_two_steps(tmp_path, fit):
    import functools
    import math

    from app.command_line.commands import AppCLI

    write_png(tmp_path / "images" / "red.png", (255, 0, 0), size=(64, 64))
    row = {"question": "What colour?", "answer": "red", "reasoning": "The square is red.", "images": ["images/red.png"]}
    path = str(write_jsonl(tmp_path / "sft.jsonl", [row] * 4))
    data = VisualTaskDataModule(functools.partial(FileDataset, path=path), train_size=4, val_size=2, batch_size=2)
    config = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny_sft.yaml")
    cli = AppCLI(args=["--config", config, "--trainer.default_root_dir", str(tmp_path)], run=False)

    trainer, recorder = fit(cli.model, data)

    assert trainer.global_step == 2 and data.train_dataset[0].reasoning == "The square is red."
    losses = recorder.metric("train/loss/sft")
    assert len(losses) == 2 and all(math.isfinite(value) for value in losses)


def core_file(folder, rows=None):
    """Four CoRe comparison triplets: three images, the question, the target answer and reasoning, the dimension and
    TriSR's ground truth (``pair_answers``, ``attributes``, ``answer_type``)."""
    from app.formats import format_triplet_response

    for name, color in (("a", (200, 0, 0)), ("b", (0, 200, 0)), ("c", (0, 0, 200))):
        write_png(folder / "images" / f"{name}.png", color, size=(64, 64))
    answers = {"1-2": "1", "1-3": "1", "2-3": "2"}
    reasoning, answer = format_triplet_response([5, 3, 2], answers, answers)
    row = {
        "question": "Which image has more dots in each pair?",
        "images": ["images/a.png", "images/b.png", "images/c.png"],
        "answer": answer,
        "reasoning": reasoning,
        "dimension": "core_counting",
        "attributes": [5, 3, 2],
        "pair_answers": answers,
        "answer_type": "ordinal",
    }
    return write_jsonl(folder / "core.jsonl", rows or [row] * 4)


def test_a_core_triplet_row_holds_three_images_and_trisr_s_ground_truth(tmp_path):
    from app.formats import format_response
    from app.rewards.trisr import TriSRReward

    sample = FileDataset(1, 0, 64, str(core_file(tmp_path)), RowReader(preset="core"))[0]

    assert sample.task == "core_counting" and [pixel(image) for image in sample.images][2] == [0, 0, 200]
    assert set(sample.meta) == {"attributes", "pair_answers", "answer_type"}
    reward = TriSRReward(ag_weight=0.2, ja_weight=0.2, tc_weight=0.3)
    target = format_response(sample.reasoning, sample.answer)
    assert reward.score([target], [sample]).tolist() == [pytest.approx(1.7)]  # the target scores the maximum


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"images": ["images/a.png", "images/b.png"]}, "images", "2 images; this layout needs 3"),
        ({"pair_answers": None}, "pair_answers", "missing; the 'core' layout's rewards read ['pair_answers']"),
    ],
)
def test_a_core_row_the_reward_could_not_score_is_a_bad_row(tmp_path, change, field, reason):
    path = core_file(tmp_path)
    row = {**json.loads(path.read_text().splitlines()[0]), **change}
    row = {k: v for k, v in row.items() if v is not None}
    with pytest.raises(BadRowError, match=rf"row 0, field '{field}': {re.escape(reason)}"):
        FileDataset(1, 0, 64, str(core_file(tmp_path, [row])), RowReader(preset="core"))


def ot_grpo_file(folder, twin=None, answer="yes"):
    """Four OT-GRPO prompt pairs: the prompt, its augmented twin (mirrored image, swapped question) and the twin's
    relation; ``answer_type`` for the consistency verifier."""
    write_png(folder / "images" / "scene.png", (255, 0, 0), size=(64, 64))
    write_png(folder / "images" / "mirrored.png", (0, 0, 255), size=(64, 64))
    twin = twin or {"question": "Is the blue dot left of the red dot?", "images": ["images/mirrored.png"]}
    rows = [
        {
            "id": f"pair-{i}",
            "question": "Is the red dot left of the blue dot?",
            "images": ["images/scene.png"],
            "answer": answer,
            "answer_type": "bool",
            "twin": {"relation": "negation", **twin},
        }
        for i in range(4)
    ]
    return write_jsonl(folder / "pairs.jsonl", rows)


def test_an_ot_grpo_row_is_a_prompt_and_its_twin_with_the_relation(tmp_path):
    from app.rewards.groups import pair_groups

    x, twin = FileDataset(4, 0, 64, str(ot_grpo_file(tmp_path)), RowReader(preset="ot_grpo", key="id"))[1]

    assert (x.question, x.answer, pixel(x.images[0])) == ("Is the red dot left of the blue dot?", "yes", [255, 0, 0])
    assert (twin.question, twin.answer, pixel(twin.images[0])) == (
        "Is the blue dot left of the red dot?",
        "no",
        [0, 0, 255],
    )
    assert x.meta == {"id": "pair-1", "answer_type": "bool", "pair_id": "pair-1"}
    assert twin.meta == {**x.meta, "relation": "negation"} and twin.task == x.task
    assert pair_groups([x, x, twin, twin], group_size=2) == [(slice(0, 2), slice(2, 4), "negation")]


@pytest.mark.parametrize(
    "twin, answer, field, reason",
    [
        ({"relation": "mirror", "question": "Q?", "images": []}, "yes", "twin.relation", "must be one of"),
        ({"question": "Q?", "images": ["images/none.png"]}, "yes", "twin.images", "not found"),
        ({"question": "Q?", "images": ["images/scene.png"]}, "3", "twin.answer", "needs its own answer"),
    ],
)
def test_a_bad_twin_names_its_field(tmp_path, twin, answer, field, reason):
    path = ot_grpo_file(tmp_path, twin, answer)
    with pytest.raises(BadRowError, match=rf"row 0, field '{re.escape(field)}': .*{reason}"):
        FileDataset(4, 0, 64, str(path), RowReader(preset="ot_grpo"))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["core", "ot_grpo"])
def test_each_paper_layout_trains_the_tiny_model_with_its_reward(layout, tmp_path, monkeypatch, fit):
    """CoRe triplets with TriSR (configs/quickstart/trisr_dots.yaml), OT-GRPO pairs with the label-free consistency
    verifier (configs/quickstart/consistency_dots.yaml), two steps each on the tiny Qwen3-VL."""
    import functools
    import math

    from app.command_line.commands import AppCLI

    config_name, reward, path = {
        "core": ("trisr_dots.yaml", "tri_sr", core_file(tmp_path)),
        "ot_grpo": ("consistency_dots.yaml", "consistency", ot_grpo_file(tmp_path)),
    }[layout]
    factory = functools.partial(FileDataset, path=str(path), rows=RowReader(preset=layout))
    data = VisualTaskDataModule(dataset=factory, train_size=4, val_size=2, test_size=2, batch_size=2)
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart" / config_name
    args = ["--config", str(config), "--model.init_args.policy.init_args.model", "tiny-qwen3-vl"]
    args += ["--model.init_args.sampling.group_size", "2", "--model.init_args.sampling.max_new_tokens", "8"]
    cli = AppCLI(args=args, run=False)

    trainer, recorder = fit(cli.model, data)

    rewards = recorder.metric(f"train/reward/{reward}")
    assert trainer.global_step == 2 and len(rewards) == 2 and all(math.isfinite(value) for value in rewards)
