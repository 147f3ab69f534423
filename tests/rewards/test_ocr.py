"""OCRReward with the real OCR model (RapidOCR's PP-OCRv4 from its wheel, offline): rendered text scores 1 against its
own text and less against another, noise / constant / non-finite / malformed images score 0 and are counted, the
normalisation is Flow-GRPO's, and the reward scores alike in a process pool and behind the reward server. The engine
loads once per process (app.rewards.ocr keeps it), about 0.2 s."""

import pickle
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont
from reward_contract import assert_well_behaved

from app.rewards import RemoteReward, WeightedReward
from app.rewards import ocr as ocr_module
from app.rewards.functional import ocr_reward
from app.rewards.ocr import OCRReward, edit_distance, expected_text, normalize_text, ocr_similarity
from app.rewards.serve import RewardServer
from app.types import VisualSample


def render_text(text: str, size: int = 128, font_size: int = 24) -> torch.Tensor:
    """Black ``text`` centred on white, PIL's default font: ``[3, size, size]`` float in [0, 1]."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=font_size)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    draw.text(((size - right + left) / 2 - left, (size - bottom + top) / 2 - top), text, font=font, fill="black")
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1)


def sign(text: str) -> VisualSample:
    return VisualSample(images=[], question=f'A sign that says "{text}"', task="text_render")


NOISE = torch.rand(3, 128, 128, generator=torch.Generator().manual_seed(0))
CONSTANT = torch.full((3, 128, 128), 0.5)


# ------------------------------------------------------------------------------------------------ normalisation
@pytest.mark.parametrize(
    "read, expected, score",
    [
        ("Hello", "Hello", 1.0),
        ("HELLO", "hello", 1.0),  # case is ignored
        ("H e l l o", "Hello", 1.0),  # so is whitespace, on both sides
        ("OPEN 24", "open24", 1.0),
        ("the cat sat", "cat", 1.0),  # the expected text inside what was read: extra text costs nothing
        ("Helo", "Hello", 1 - 1 / 5),  # one deletion in five characters
        ("Hxllo", "Hello", 1 - 1 / 5),  # one substitution
        ("ca", "cat", 1 - 1 / 3),
        ("cta", "cat", 1 - 2 / 3),  # a transposition is two edits
        ("dog", "cat", 0.0),  # three substitutions in three characters
        ("", "cat", 0.0),  # nothing read
        ("xyzxyzxyz", "ab", 0.0),  # distance 9, capped at the length 2: never below 0
        ("sitting", "kitten", 1 - 3 / 6),  # kitten -> sitting: 2 substitutions + 1 insertion
    ],
)
def test_similarity_is_one_minus_the_capped_edit_distance_over_the_expected_length(read, expected, score):
    assert ocr_similarity(read, expected) == pytest.approx(score, abs=1e-12)  # exact fractions, float rounding only


def test_edit_distance_hand_computed():
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("sitting", "kitten") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "abc") == 0 and edit_distance("flaw", "lawn") == 2
    assert normalize_text(" Hello\tWorld\n") == "helloworld"


def test_expected_text_comes_from_meta_or_the_first_quoted_span():
    assert expected_text('A sign that says "Hello" and "World"') == "Hello"
    assert expected_text("a mug with \u201cGood morning\u201d on it") == "Good morning"
    assert expected_text({"text": "cat"}) == "cat"
    reward = OCRReward()
    sample = VisualSample(images=[], question='A sign that says "Hello"', task="t", meta={"text": "cat"})
    assert reward.score([render_text("cat")], [sample]).tolist() == [1.0]  # meta wins over the prompt


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("A sign with a word on it", r"needs the text to draw in double quotes .* the prompt 'A sign with a word"),
        ('A sign that says "  "', r"expected text is blank: '  '"),
        ({"text": None}, r"needs meta\['text'\] as a string, got None"),
    ],
)
def test_a_prompt_without_text_is_a_clear_error(prompt, message):
    with pytest.raises(ValueError, match=message):
        expected_text(prompt)
    with pytest.raises(ValueError, match=message):
        ocr_reward([render_text("cat")], [prompt])


def test_a_sample_without_text_fails_the_reward_naming_the_prompt():
    with pytest.raises(ValueError, match="the prompt 'Draw a cat' has neither"):
        OCRReward().score([render_text("cat")], [VisualSample([], "Draw a cat", "t")])


# ----------------------------------------------------------------------------------------------- the real model
def test_rendered_text_scores_one_against_its_text_and_lower_against_another():
    reward = OCRReward()
    images = [render_text("Hello"), render_text("Hello"), render_text("river", 64, 14), render_text("OPEN 24", 256, 40)]
    values = assert_well_behaved(reward, images, [sign("Hello"), sign("World"), sign("river"), sign("open24")])
    assert values[[0, 2, 3]].tolist() == [1.0, 1.0, 1.0]
    # "hello" vs "world": the edit distance is 4 of 5 ('l' at index 3 is shared), 0.2 if read exactly
    assert values[1] <= 0.2
    assert (reward.num_malformed, reward.num_degenerate, reward.num_unread) == (0, 0, 0)


def test_uint8_arrays_score_as_the_float_tensor_of_the_same_pixels():
    tensor = render_text("Zebra")
    array = (tensor.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    assert ocr_reward([tensor, array], ['a zebra saying "Zebra"', {"text": "Zebra"}]).tolist() == [1.0, 1.0]


def test_noise_constant_and_non_finite_images_score_zero_and_are_counted(caplog):
    nan = render_text("cat")
    nan[0, 5, 5] = float("nan")
    inf = render_text("cat")
    inf[1, 0, 0] = float("inf")
    reward = OCRReward()
    with caplog.at_level("WARNING", logger="app.rewards.ocr"):
        values = assert_well_behaved(reward, [NOISE, CONSTANT, nan, inf, render_text("cat")], [sign("cat")] * 5)
    assert values.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert (reward.num_unread, reward.num_degenerate, reward.num_malformed) == (1, 3, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "ocr reward: 3 of 5 images degenerate (a non-finite value or one colour), scored 0 (3 so far)"
    ]
    reward.score([CONSTANT], [sign("cat")])
    assert reward.num_degenerate == 4  # cumulative


def test_malformed_completions_score_zero_are_counted_and_logged(caplog):
    reward = OCRReward()
    completions = ["Hello", torch.zeros(3, 0, 0), np.zeros((8, 8, 3), dtype=np.float64), torch.zeros(5)]
    with caplog.at_level("WARNING", logger="app.rewards.ocr"):
        values = assert_well_behaved(reward, completions, [sign("Hello")] * 4)
    assert values.tolist() == [0.0] * 4 and reward.num_malformed == 4
    assert "completion 2 scored 0 (malformed; 3 so far): ValueError: numpy renderings must be uint8" in (
        caplog.records[2].getMessage()
    )
    assert "text" not in reward.completion_kinds


def test_a_missing_engine_names_the_extra(monkeypatch):
    monkeypatch.setattr(ocr_module, "_ENGINES", {})
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"^the OCR reward needs RapidOCR .*: pip install app\[ocr\]$"):
        OCRReward().score([render_text("cat")], [sign("cat")])


def test_bad_options_are_refused_when_the_reward_is_built():
    with pytest.raises(ValueError, match="min_confidence must be in"):
        OCRReward(min_confidence=2.0)
    with pytest.raises(ValueError, match="detection_side >= 32"):
        OCRReward(detection_side=8)


# -------------------------------------------------------------------------------- process pool and reward server
BATCH = [render_text("Hello"), NOISE, CONSTANT, "not an image"]
PROMPTS = [sign("Hello"), sign("Hello"), sign("Hello"), sign("Hello")]
EXPECTED = [1.0, 0.0, 0.0, 0.0]


def counters(reward):
    return reward.num_malformed, reward.num_degenerate, reward.num_unread


def test_the_reward_pickles_without_its_engine_and_the_copy_scores():
    reward = OCRReward()
    reward.score(BATCH[:1], PROMPTS[:1])  # the engine is built, in this process's cache only
    copy = pickle.loads(pickle.dumps(reward))
    assert copy.score(BATCH, PROMPTS).tolist() == EXPECTED


def test_a_process_pool_scores_alike_and_brings_the_counters_back():
    rewards = WeightedReward([OCRReward()])
    with ProcessPoolExecutor(1) as executor:
        out = rewards.gather(rewards.submit(BATCH, PROMPTS, executor=executor))
    assert out.total.tolist() == EXPECTED
    assert counters(rewards.components[0]) == (1, 1, 1)


def test_behind_the_reward_server_it_scores_alike_and_the_counters_come_back():
    with RewardServer([OCRReward()]) as server:
        remote = RemoteReward(server.url, "ocr", retries=0, timeout_s=60.0)
        rewards = WeightedReward([remote])
        out = rewards.gather(rewards.submit(BATCH[:3], PROMPTS[:3]))  # tensors travel as arrays; text is no image
        assert remote.name == "ocr" and remote.value_range == (0.0, 1.0)
    assert out.total.tolist() == EXPECTED[:3]
    assert remote.server_counters == {"num_degenerate": 1.0, "num_unread": 1.0}
