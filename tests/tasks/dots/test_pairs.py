"""Paired dots prompts: twins carry the right answer effect, the flip moves the dots, pairs stay adjacent in batches."""

import pytest
from PIL import ImageOps

from app.data.datamodule import VisualTaskDataModule, collate_visual_samples
from app.rewards.groups import pair_groups
from app.tasks.dots.dots import BLUE, RED, DotsDataset
from app.tasks.dots.pairs import SWAPPED_QUESTION, PairedDotsDataset


def scene_answer(sample) -> str:
    """Ground truth read off the scene (dot positions) and the question, independently of the stored label."""
    red_x, blue_x = sample.meta["red_xy"][0], sample.meta["blue_xy"][0]
    first_left = red_x < blue_x if sample.question != SWAPPED_QUESTION else blue_x < red_x
    return "yes" if first_left else "no"


def apply_relation(relation: str, answer: str) -> str:
    return answer if relation == "identity" else {"yes": "no", "no": "yes"}[answer]


@pytest.mark.parametrize("seed", range(12))
def test_twin_ground_truth_is_the_relation_of_the_original(seed):
    dataset = PairedDotsDataset(num_samples=16, seed=seed, image_size=48, dot_radius=4)
    seen = set()
    for i in range(len(dataset)):
        x, twin = dataset[i]
        relation, transforms = twin.meta["relation"], twin.meta["transforms"]
        assert relation == ("negation" if len(transforms) == 1 else "identity")
        assert scene_answer(x) == x.answer
        assert scene_answer(twin) == apply_relation(relation, scene_answer(x)) == twin.answer
        assert x.meta["pair_id"] == twin.meta["pair_id"] and x is not twin
        seen.add(tuple(transforms))
    if seed == 0:
        assert seen == {(), ("hflip",), ("swap_objects",), ("hflip", "swap_objects")}


def test_flip_moves_the_red_dot():
    dataset = PairedDotsDataset(num_samples=40, seed=3, image_size=64, dot_radius=6)
    flipped = [pair for pair in (dataset[i] for i in range(40)) if "hflip" in pair[1].meta["transforms"]]
    assert flipped
    for x, twin in flipped:
        assert twin.images[0].tobytes() == ImageOps.mirror(x.images[0]).tobytes()
        (rx, ry), (bx, by) = twin.meta["red_xy"], twin.meta["blue_xy"]
        assert twin.images[0].getpixel((rx, ry)) == RED and twin.images[0].getpixel((bx, by)) == BLUE
        assert rx == 63 - x.meta["red_xy"][0] and ry == x.meta["red_xy"][1]
        assert rx != x.meta["red_xy"][0]  # 63 - x != x for integers: the red dot really moved


def test_original_is_the_dots_sample_and_items_are_reproducible():
    paired = PairedDotsDataset(num_samples=6, seed=1, image_size=48)
    plain = DotsDataset(num_samples=6, seed=1, image_size=48)
    for i in range(6):
        x, twin = paired[i]
        assert x.images[0].tobytes() == plain[i].images[0].tobytes() and x.answer == plain[i].answer
        again = paired[i][1]
        assert twin.images[0].tobytes() == again.images[0].tobytes() and twin.question == again.question
    assert paired[-1][0].meta["pair_id"] == paired[5][0].meta["pair_id"]
    with pytest.raises(IndexError):
        paired[6]


def test_unlabeled_pairs_have_no_labels():
    x, twin = PairedDotsDataset(num_samples=2, seed=0, image_size=48, labeled=False)[1]
    assert x.answer is None and twin.answer is None and twin.reasoning is None
    assert twin.meta["relation"] in ("identity", "negation")


def test_pairs_stay_adjacent_after_collate():
    dataset = PairedDotsDataset(num_samples=4, seed=0, image_size=48)
    batch = collate_visual_samples([dataset[i] for i in range(4)])
    assert len(batch) == 8
    assert all(batch[2 * j].meta["pair_id"] == batch[2 * j + 1].meta["pair_id"] for j in range(4))
    assert "relation" in batch[1].meta and "relation" not in batch[0].meta
    plain = [DotsDataset(3, seed=0, image_size=48)[i] for i in range(3)]
    assert collate_visual_samples(plain) == plain  # plain samples pass through


def test_data_module_serves_flattened_pairs_that_pair_groups_accepts():
    dm = VisualTaskDataModule(
        dataset=PairedDotsDataset, train_size=12, val_size=4, test_size=4, batch_size=3, image_size=48
    )
    dm.setup("fit")
    k = 4
    for batch in dm.train_dataloader():
        assert len(batch) == 6
        grouped = [s for s in batch for _ in range(k)]  # as the GRPO trainer repeats each prompt K times
        pairs = pair_groups(grouped)
        assert len(pairs) == 3 and all(r0.stop == r1.start for r0, r1, _ in pairs)


def test_pair_augmenter_makes_consistent_twins_from_the_scene_only():
    import random

    from app.tasks.dots.dots import DotsDataset
    from app.tasks.dots.pairs import DotsPairAugmenter, negate
    from app.types import VisualSample

    labeled, unlabeled = DotsDataset(40, seed=3, image_size=64), DotsDataset(40, seed=3, image_size=64, labeled=False)
    augment, relations = DotsPairAugmenter(), set()
    for i in range(40):
        x, twin = augment(labeled[i], random.Random(i))
        expected = x.answer if twin.meta["relation"] == "identity" else negate(x.answer)
        assert twin.answer == expected and x.meta["pair_id"] == twin.meta["pair_id"]
        bare_x, bare_twin = augment(unlabeled[i], random.Random(i))  # the same draws without labels
        assert bare_twin.answer is None and bare_twin.meta["relation"] == twin.meta["relation"]
        assert bare_twin.images[0].tobytes() == twin.images[0].tobytes() and bare_twin.question == twin.question
        relations.add(twin.meta["relation"])
    assert relations == {"identity", "negation"}
    with pytest.raises(ValueError, match="needs a dots sample with meta \\['red_xy', 'blue_xy'\\]"):
        augment(VisualSample(images=[], question="q", task="other"), random.Random(0))
    with pytest.raises(ValueError, match="transform_prob"):
        DotsPairAugmenter(transform_prob=1.5)


def test_transforms_option_keeps_the_scenes_and_drops_the_left_out_transform():
    full = PairedDotsDataset(num_samples=40, seed=2, image_size=48)
    flips = PairedDotsDataset(num_samples=40, seed=2, image_size=48, transforms=["hflip"])
    for i in range(40):
        (x, twin), (x_f, twin_f) = full[i], flips[i]
        assert x.images[0].tobytes() == x_f.images[0].tobytes() and x.answer == x_f.answer
        assert twin_f.question == x.question  # never the swapped wording
        assert twin_f.meta["transforms"] == [t for t in twin.meta["transforms"] if t == "hflip"]
        assert scene_answer(twin_f) == twin_f.answer == apply_relation(twin_f.meta["relation"], x.answer)
    assert {tuple(flips[i][1].meta["transforms"]) for i in range(40)} == {(), ("hflip",)}
    with pytest.raises(ValueError, match="unknown transforms"):
        PairedDotsDataset(num_samples=2, seed=0, transforms=["rotate"])


def dominant(pixel) -> str:
    """Which of red / blue a pixel shows most (jitter and resizing change the exact colour, not the dominant one)."""
    r, _, b = pixel
    return "red" if r > b + 40 else "blue" if b > r + 40 else "other"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("radius", [3, 8])
def test_answer_preserving_views_keep_the_answer_and_both_dots(seed, radius):
    transforms = ["hflip", "translate", "crop", "jitter"]
    dataset = PairedDotsDataset(
        num_samples=24, seed=seed, image_size=64, dot_radius=radius, transforms=transforms, transform_prob=0.5
    )
    seen = set()
    for i in range(len(dataset)):
        x, twin = dataset[i]
        negations = "hflip" in twin.meta["transforms"]
        assert twin.meta["relation"] == ("negation" if negations else "identity")
        assert scene_answer(twin) == apply_relation(twin.meta["relation"], x.answer) == twin.answer
        (rx, ry), (bx, by) = twin.meta["red_xy"], twin.meta["blue_xy"]
        assert all(0 <= v < 64 for v in (rx, ry, bx, by))
        assert dominant(twin.images[0].getpixel((rx, ry))) == "red"
        assert dominant(twin.images[0].getpixel((bx, by))) == "blue"
        assert "twin_dot_radius" not in twin.meta
        seen.update(twin.meta["transforms"])
    assert seen == set(transforms)


def test_each_view_changes_what_a_mirror_keeps():
    """Translation moves the dots' centroid and height (features a mirror-consistent wrong rule could read); a crop
    enlarges the dots; jitter changes the background colour."""
    for name in ("translate", "crop", "jitter"):
        dataset = PairedDotsDataset(
            num_samples=30, seed=0, image_size=64, dot_radius=4, transforms=[name], transform_prob=1.0
        )
        pairs = [dataset[i] for i in range(30)]
        assert all(twin.meta["relation"] == "identity" and twin.answer == x.answer for x, twin in pairs)
        if name == "translate":
            assert sum(twin.meta["red_xy"] != x.meta["red_xy"] for x, twin in pairs) >= 25
        if name == "crop":
            enlarged = [
                abs(t.meta["red_xy"][0] - t.meta["blue_xy"][0]) > abs(x.meta["red_xy"][0] - x.meta["blue_xy"][0])
                for x, t in pairs
            ]
            assert sum(enlarged) >= 20
        if name == "jitter":
            assert sum(twin.images[0].getpixel((0, 0)) != x.images[0].getpixel((0, 0)) for x, twin in pairs) >= 25


def test_views_need_the_scene_radius():
    from app.tasks.dots.pairs import make_twin

    x, _ = PairedDotsDataset(num_samples=2, seed=0, image_size=48)[0]
    with pytest.raises(ValueError, match="rng and dot_radius"):
        make_twin(x, ("crop",), "p")
