"""The text-rendering task: prompts and targets rebuilt from (seed, index), every target read by the real OCR, and
both quickstart stages (flow-matching pretraining, then flow-GRPO on the OCR reward) training end to end."""

import math
import random
from pathlib import Path

import numpy as np
import pytest

from app.rewards.ocr import OCRReward, expected_text
from app.tasks.text_render import SCENES, WORDS, TextRenderDataset, render_text, text_prompt

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "quickstart"


def test_every_word_and_scene_comes_once_per_block_and_rebuilds_from_its_index():
    a, b = TextRenderDataset(64, seed=1), TextRenderDataset(64, seed=1)
    pairs = len(WORDS) * len(SCENES)
    assert [s.question for s in a] == [s.question for s in b]
    assert sorted((s.meta["text"], s.meta["scene"]) for s in list(a)[:pairs]) == sorted(
        (w, s) for w in WORDS for s in SCENES
    )
    assert [s.question for s in TextRenderDataset(64, seed=2)] != [s.question for s in a]
    assert np.array_equal(np.asarray(a[5].images[0]), np.asarray(b[5].images[0]))
    assert TextRenderDataset(4, seed=1, labeled=False)[0].images == []


def test_the_prompt_quotes_the_word_that_meta_names():
    for sample in TextRenderDataset(32, seed=0, labeled=False):
        assert sample.task == "text_render"
        assert expected_text(sample.question) == sample.meta["text"] == expected_text(sample.meta)
        assert sample.question == text_prompt(sample.meta["text"], sample.meta["scene"])


def test_the_word_survives_the_tiny_tokenizer_s_16_tokens():
    from transformers import AutoTokenizer

    from app.tiny.flow_models import TEXT_MAX_LENGTH, resolve_flow_pretrained

    tokenizer = AutoTokenizer.from_pretrained(resolve_flow_pretrained("tiny-sd3"), subfolder="tokenizer")
    for word in WORDS:
        for scene in SCENES:
            ids = tokenizer(text_prompt(word, scene), max_length=TEXT_MAX_LENGTH, truncation=True).input_ids
            assert word in tokenizer.decode(ids).replace(" ", ""), (word, scene)


@pytest.mark.parametrize("image_size, font_fraction", [(64, 0.34), (128, 0.34), (64, 0.45)])  # 0.45: the quickstart's
def test_the_real_ocr_reads_every_target(image_size, font_fraction):
    dataset = TextRenderDataset(len(WORDS) * len(SCENES), seed=0, image_size=image_size, font_fraction=font_fraction)
    samples = list(dataset)
    reward = OCRReward()
    values = reward.score([np.asarray(s.images[0]) for s in samples], samples)
    assert values.tolist() == [1.0] * len(samples) and reward.num_unread == 0


def test_targets_are_the_word_centred_on_the_scene_s_background():
    image = np.asarray(render_text("cat", "shirt", 64))
    ink = (image != SCENES["shirt"]).any(axis=2)  # every other pixel is the background colour
    assert tuple(image[0, 0]) == SCENES["shirt"] and ink.any()
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    # placed by its text box, rounded to whole pixels, with at most one pixel of anti-aliasing on each side
    assert abs((rows[0] + rows[-1] + 1) / 2 - 32) <= 1.5 and abs((cols[0] + cols[-1] + 1) / 2 - 32) <= 1.5
    jittered = [np.asarray(render_text("cat", "sign", 64, rng=random.Random(i), jitter=4)) for i in (0, 1)]
    assert not np.array_equal(*jittered)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(words=['a"b']), "without double quotes"),
        (dict(words=[]), "without double quotes"),
        (dict(scenes=["beach"]), "scenes must be some of"),
        (dict(font_fraction=2.0), "font_fraction in"),
        (dict(image_size=8), "image_size >= 16"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TextRenderDataset(4, **kwargs)


SMALL = [
    "--trainer.max_steps",
    "2",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.val_check_interval",
    "2",
    "--data.init_args.train_size",
    "16",
    "--data.init_args.val_size",
    "2",
    "--data.init_args.batch_size",
    "2",
]


@pytest.mark.slow
def test_text_render_quickstart_two_stages_with_the_real_ocr_reward(tmp_path, monkeypatch):
    from app.command_line.commands import AppCLI

    monkeypatch.chdir(tmp_path)  # the recipes' relative paths (logger, export) land in tmp_path
    stage1 = [
        "--config",
        str(CONFIGS / "text_render_pretrain.yaml"),
        *SMALL,
        "--model.init_args.num_steps",
        "2",
        "--model.init_args.vae_warmup_steps",
        "1",
    ]
    cli = AppCLI(args=stage1, run=False)
    assert cli.model.eval_rewards.names == ["ocr"]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert (tmp_path / "runs/text_render_pretrain/policy/model_index.json").exists()

    stage2 = [
        "--config",
        str(CONFIGS / "text_render_flow.yaml"),
        *SMALL,
        "--model.init_args.sampling.group_size",
        "2",
        "--model.init_args.sampling.num_steps",
        "2",
    ]
    cli = AppCLI(args=stage2, run=False)
    assert cli.model.policy.uses_lora and cli.model.rewards.names == ["ocr"]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    reward = float(cli.trainer.callback_metrics["train/reward/ocr"])
    assert math.isfinite(reward) and 0.0 <= reward <= 1.0
    ocr = cli.model.rewards.components[0]
    # the 2 steps x 2 prompts x 2 samples of a 2-step pretrained model are noise-like: OCR ran on each, read no text
    # on them (counted), and none was malformed
    assert ocr.num_malformed == 0 and ocr.num_unread + ocr.num_degenerate >= 8
