"""group_heads: the first row of each group when a group's rows are identical (tokens, images and videos), else None."""

import pytest
import torch

from app.models.shared_prefix import group_heads
from app.types import IMAGE_INPUTS, PromptInputs

D = 2  # values per image patch


def prompt_inputs(rows, images=None, **extra):
    """PromptInputs of the token rows ``rows``; row r has the images ``images[r]``, each a (grid, patches) pair."""
    ids = torch.tensor(rows)
    tensors = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **extra}
    if images is None:
        return PromptInputs(tensors, [0] * len(rows))
    tensors["image_grid_thw"] = torch.tensor([grid for row in images for grid, _ in row])
    tensors["pixel_values"] = torch.cat([patches for row in images for _, patches in row])
    return PromptInputs(tensors, [len(row) for row in images])


def image(t, h, w, first):
    """An image of grid ``(t, h, w)`` whose patches hold the values first, first + 1, ..."""
    return [t, h, w], torch.arange(first, first + t * h * w * D, dtype=torch.float32).view(-1, D)


def assert_same(got, want):
    assert got is not None and got.images_per_row == want.images_per_row
    assert got.tensors.keys() == want.tensors.keys()
    for key, value in want.tensors.items():
        assert torch.equal(got.tensors[key], value), key


TEXT = [[1, 2, 3], [4, 5, 6]]  # two prompts of 3 tokens


def text_groups(k):
    """Each prompt of TEXT repeated k times, with (all-text) token types."""
    rows = [row for row in TEXT for _ in range(k)]
    return prompt_inputs(rows, mm_token_type_ids=torch.zeros(len(rows), 3, dtype=torch.long))


# Three prompts with 2, 1 and 2 images of 4 + 2, 4 and 2 + 6 patches (each image's patches distinct).
IMAGE_PROMPTS = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def layout(b):
    return [
        [image(1, 2, 2, 0), image(1, 1, 2, 100)],
        [image(1, 2, 2, 200)],
        [image(1, 1, 2, 300), image(2, 1, 3, 400)],
    ][b]


def image_groups(images=None):
    """Each prompt of IMAGE_PROMPTS twice (rows 0-1, 2-3, 4-5) with its images (fresh tensors), unless ``images``."""
    images = images or [layout(b) for b in range(3) for _ in range(2)]
    mm = torch.tensor([[0, 1, 0]] * 6)  # an image token inside the prompt, a text token last
    return prompt_inputs([row for row in IMAGE_PROMPTS for _ in range(2)], images, mm_token_type_ids=mm)


@pytest.mark.parametrize("k", [2, 3])
def test_text_groups_give_their_first_rows(k):
    want = prompt_inputs(TEXT, mm_token_type_ids=torch.zeros(2, 3, dtype=torch.long))
    assert_same(group_heads(text_groups(k), k), want)


def test_two_token_prompts_are_shareable():
    assert_same(group_heads(prompt_inputs([[5, 6], [5, 6], [7, 8], [7, 8]]), 2), prompt_inputs([[5, 6], [7, 8]]))


def test_image_groups_give_their_first_rows_with_only_their_images():
    want = prompt_inputs(IMAGE_PROMPTS, [layout(b) for b in range(3)], mm_token_type_ids=torch.tensor([[0, 1, 0]] * 3))
    assert_same(group_heads(image_groups(), 2), want)


@pytest.mark.parametrize("k", [0, 1])
def test_groups_of_fewer_than_two_rows_share_nothing(k):
    assert group_heads(text_groups(2), k) is None


def test_rows_not_divisible_into_groups_give_none():
    assert group_heads(text_groups(2), 3) is None  # 4 rows


def test_one_token_prompts_give_none():
    assert group_heads(prompt_inputs([[5], [5]]), 2) is None


def test_unknown_inputs_give_none():
    assert group_heads(prompt_inputs([[5, 6], [5, 6]], input_features=torch.zeros(2, 3)), 2) is None  # audio


def video_groups(seconds=(1.0, 1.0, 0.5, 0.5), second_patches=None):
    """Two groups of two rows, one video each (grid (2, 2, 2), 8 patches): the first group's video, then the second's;
    ``seconds``: each row's seconds per temporal patch (Qwen2.5-VL)."""
    patches = [torch.arange(16, dtype=torch.float32).view(8, D), torch.arange(16, 32, dtype=torch.float32).view(8, D)]
    rows = [patches[0], patches[0], patches[1], second_patches if second_patches is not None else patches[1]]
    tensors = {
        "input_ids": torch.tensor([[1, 2, 3]] * 2 + [[4, 5, 6]] * 2),
        "attention_mask": torch.ones(4, 3, dtype=torch.long),
        "video_grid_thw": torch.tensor([[2, 2, 2]] * 4),
        "pixel_values_videos": torch.cat(rows),
        "second_per_grid_ts": torch.tensor(seconds),
    }
    return PromptInputs(tensors, [0] * 4, videos_per_row=[1] * 4)


def test_video_groups_give_their_first_rows_with_only_their_videos():
    heads = group_heads(video_groups(), 2)
    assert heads is not None and heads.videos_per_row == [1, 1]
    assert torch.equal(heads.tensors["pixel_values_videos"], torch.arange(32, dtype=torch.float32).view(16, D))
    assert heads.tensors["second_per_grid_ts"].tolist() == [1.0, 0.5]


def test_a_video_that_differs_in_a_group_in_its_patches_or_its_time_gives_none():
    assert group_heads(video_groups(second_patches=torch.zeros(8, D)), 2) is None
    assert group_heads(video_groups(seconds=(1.0, 1.0, 0.5, 1.0)), 2) is None


@pytest.mark.parametrize(
    ("key", "row", "col"),
    [
        ("input_ids", 5, 2),  # last row of the last group
        ("input_ids", 1, 0),
        ("attention_mask", 4, 0),
        ("mm_token_type_ids", 2, 1),  # not the last token
    ],
)
def test_a_row_that_differs_from_its_group_gives_none(key, row, col):
    inputs = text_groups(3)
    inputs.tensors[key][row, col] = 1 - inputs.tensors[key][row, col]
    assert group_heads(inputs, 3) is None


def test_a_last_prompt_token_that_is_an_image_token_gives_none():
    inputs = text_groups(2)
    inputs.tensors["mm_token_type_ids"][:, -1] = 1
    assert group_heads(inputs, 2) is None


def test_image_slices_give_each_rows_images_and_patches():
    images, patches = image_groups().slices(IMAGE_INPUTS)  # 6 + 6, 4 + 4, 8 + 8 patches
    assert images == [slice(0, 2), slice(2, 4), slice(4, 5), slice(5, 6), slice(6, 8), slice(8, 10)]
    assert patches == [slice(0, 6), slice(6, 12), slice(12, 16), slice(16, 20), slice(20, 28), slice(28, 36)]


def test_image_slices_of_rows_without_images_are_empty():
    inputs = prompt_inputs([[1], [2], [3]], [[], [image(1, 1, 3, 0), image(1, 2, 1, 10)], []])
    assert inputs.slices(IMAGE_INPUTS) == (
        [slice(0, 0), slice(0, 2), slice(2, 2)],
        [slice(0, 0), slice(0, 5), slice(5, 5)],
    )


def test_a_different_patch_in_a_non_head_row_gives_none():
    inputs = image_groups()
    inputs.tensors["pixel_values"][32, 1] += 1  # row 5 has patches 28-35: a middle patch of its second image
    assert group_heads(inputs, 2) is None


def test_a_different_grid_with_the_same_patches_gives_none():
    images = [layout(b) for b in range(3) for _ in range(2)]
    images[3] = [([1, 1, 4], layout(1)[0][1])]  # 4 patches as (1, 2, 2), the same values
    assert group_heads(image_groups(images), 2) is None


def test_the_same_patches_split_into_other_images_give_none():
    images = [layout(b) for b in range(3) for _ in range(2)]
    images[1] = [([1, 2, 3], torch.cat([patches for _, patches in layout(0)]))]  # one image of 6 patches, not 4 + 2
    assert group_heads(image_groups(images), 2) is None
