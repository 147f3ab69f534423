"""Consistency twins of the motion tasks: the twin's clip is the original's frames cropped, repeated and reversed as its
transforms say, its answer (read back from its frames) is the original's or its negation as its relation says, and the
pairs go through the data module to the consistency reward's pairing."""

from __future__ import annotations

import numpy as np
import pytest

from app.data.datamodule import VisualTaskDataModule
from app.rewards.consistency import ConsistencyReward
from app.rewards.groups import pair_groups
from app.tasks.motion import PairedDirectionDataset, PairedEventCountDataset, PairedOrderDataset, centroids
from app.tasks.motion.clips import BLUE, RED, runs
from app.tasks.motion.pairs import TRANSFORMS

PAIRED = [PairedDirectionDataset, PairedOrderDataset, PairedEventCountDataset]
SPLIT_NAMES = ["in_domain", "shifted"]
N = 40
NEGATE = {"yes": "no", "no": "yes"}


def answer_from_frames(task: str, frames: np.ndarray, meta: dict) -> str:
    """The answer read off the frames alone (the asked direction and nothing else from ``meta``)."""
    if task.startswith("motion_direction"):
        (x0, y0), (x1, y1) = centroids(frames, RED)[0], centroids(frames, RED)[-1]
        along = {"right": x1 - x0, "left": x0 - x1, "down": y1 - y0, "up": y0 - y1}[meta["asked"]]
        return "yes" if along > 0 else "no"
    if task.startswith("motion_order"):
        line = int(np.unique(np.nonzero(np.all(frames == np.array((60, 60, 60), np.uint8), axis=-1))[2])[0])

        def crossing(color) -> int:
            xs = [x for x, _ in centroids(frames, color)]
            return next(t for t, x in enumerate(xs) if (x > line) != (xs[0] > line))

        return "yes" if crossing(RED) < crossing(BLUE) else "no"
    return str(runs([xy is not None for xy in centroids(frames, RED)]))


def expected_frames(x_frames: np.ndarray, twin_meta: dict) -> np.ndarray:
    start, stop = twin_meta["crop"]
    frames = x_frames[start:stop]
    if "double_rate" in twin_meta["transforms"]:
        frames = np.repeat(frames, 2, axis=0)
    if "reverse" in twin_meta["transforms"]:
        frames = frames[::-1]
    return frames


@pytest.mark.parametrize("split", SPLIT_NAMES)
@pytest.mark.parametrize("paired", PAIRED, ids=lambda c: c.__name__)
def test_twin_is_the_transformed_clip_and_its_answer_follows_the_relation(paired, split):
    data = paired(num_samples=N, seed=0, split=split)
    seen = set()
    for i in range(N):
        x, twin = data[i]
        assert x.meta["pair_id"] == twin.meta["pair_id"] == f"{data.task}:0:{i}"
        assert x.task == twin.task == data.task and x.meta["transforms"] == []
        assert twin.question == x.question
        transforms, relation = twin.meta["transforms"], twin.meta["relation"]
        x_frames, twin_frames = x.videos[0].frames, twin.videos[0].frames
        assert np.array_equal(twin_frames, expected_frames(x_frames, twin.meta))
        assert twin.videos[0].fps == x.videos[0].fps * (2 if "double_rate" in transforms else 1)
        start, stop = twin.meta["crop"]
        cropped = (start, stop) != (0, len(x_frames))
        assert cropped <= ("crop" in transforms) and stop - start >= max(2, len(x_frames) // 2)
        negates = "reverse" in transforms and paired is not PairedEventCountDataset
        assert relation == ("negation" if negates else "identity")
        assert x.answer == answer_from_frames(x.task, x_frames, x.meta)
        assert twin.answer == answer_from_frames(twin.task, twin_frames, twin.meta)
        assert twin.answer == (NEGATE[x.answer] if negates else x.answer)
        seen.add((tuple(transforms), cropped))
    assert {t for t, _ in seen} == {tuple(t for t in TRANSFORMS if t in s) for s, _ in seen}  # in TRANSFORMS' order
    assert len({t for t, _ in seen}) == 8 and any(c for _, c in seen)  # each subset drawn, some crops taken


@pytest.mark.parametrize("paired", [PairedDirectionDataset, PairedOrderDataset], ids=lambda c: c.__name__)
def test_reversal_alone_negates_every_answer_and_plays_the_frames_backwards(paired):
    data = paired(num_samples=N, seed=1, transform_prob=1.0, transforms=["reverse"])
    for i in range(N):
        x, twin = data[i]
        assert twin.meta["relation"] == "negation" and twin.meta["transforms"] == ["reverse"]
        assert np.array_equal(twin.videos[0].frames, x.videos[0].frames[::-1])
        assert twin.answer == NEGATE[x.answer] == NEGATE[answer_from_frames(x.task, x.videos[0].frames, x.meta)]
        assert twin.reasoning != x.reasoning


def test_count_twins_keep_the_count_under_every_transform():
    data = PairedEventCountDataset(num_samples=N, seed=2, transform_prob=1.0)
    for i in range(N):
        x, twin = data[i]
        assert twin.meta["relation"] == "identity" and twin.meta["transforms"] == list(TRANSFORMS)
        assert twin.answer == x.answer == str(twin.meta["count"])
        assert twin.answer == answer_from_frames(twin.task, twin.videos[0].frames, twin.meta)
        assert runs([xy is not None for xy in centroids(twin.videos[0].frames, BLUE)]) == twin.meta["blue_count"]


def test_pairs_are_rebuilt_from_seed_and_index_and_unlabeled_pairs_keep_the_clips():
    a, b = PairedOrderDataset(8, seed=4)[5], PairedOrderDataset(6, seed=4)[5]
    for one, other in zip(a, b, strict=True):
        assert np.array_equal(one.videos[0].frames, other.videos[0].frames) and one.meta == other.meta
    unlabeled = PairedOrderDataset(8, seed=4, labeled=False)[5]
    assert all(s.answer is None and s.reasoning is None for s in unlabeled)
    assert all(np.array_equal(s.videos[0].frames, t.videos[0].frames) for s, t in zip(a, unlabeled, strict=True))


def test_bad_twin_arguments_are_refused():
    with pytest.raises(ValueError, match=r"unknown transforms \['flip'\]"):
        PairedDirectionDataset(2, seed=0, transforms=["flip"])
    with pytest.raises(ValueError, match=r"transform_prob must be in \[0, 1\], got 1.5"):
        PairedDirectionDataset(2, seed=0, transform_prob=1.5)


@pytest.mark.parametrize("paired", PAIRED, ids=lambda c: c.__name__)
def test_data_module_serves_pairs_that_the_consistency_reward_pairs(paired):
    dm = VisualTaskDataModule(dataset=paired, train_size=6, val_size=2, test_size=2, batch_size=3, image_size=48)
    dm.setup("fit")
    k = 2
    answer_type = "count" if paired is PairedEventCountDataset else "bool"
    reward = ConsistencyReward(answer_type=answer_type, pairing="minimal")
    for batch in dm.train_dataloader():
        assert len(batch) == 6
        grouped = [s for s in batch for _ in range(k)]  # as the GRPO trainer repeats each prompt K times
        pairs = pair_groups(grouped)
        assert len(pairs) == 3 and [relation for *_, relation in pairs] == [s.meta["relation"] for s in batch[1::2]]
        consistent = [f"<think>{s.reasoning}</think><answer>{s.answer}</answer>" for s in grouped]
        assert reward.score(consistent, grouped, group_size=k).tolist() == [1.0] * len(grouped)
        # each twin answering as its original did: consistent where the relation is identity only
        copied = [f"<answer>{batch[2 * (r // (2 * k))].answer}</answer>" for r in range(len(grouped))]
        want = [float(batch[2 * (r // (2 * k)) + 1].meta["relation"] == "identity") for r in range(len(grouped))]
        assert reward.score(copied, grouped, group_size=k).tolist() == want


def test_a_twin_whose_clip_breaks_the_relation_is_never_emitted():
    """make_twin reads the twin's answer off its clip again: a task claiming that reversal keeps the direction fails."""
    import random

    from app.tasks.motion import DirectionDataset
    from app.tasks.motion.pairs import make_twin

    class Wrong(DirectionDataset):
        reverse_relation = "identity"

    task = Wrong(2, seed=0)
    clip, query = task.scene_for(0)
    with pytest.raises(RuntimeError, match=r"the twin \(\['reverse'\]\) answers .* relation 'identity'"):
        make_twin(task, clip, query, ["reverse"], random.Random(0))


@pytest.mark.parametrize("image_size", [32, 128])
@pytest.mark.parametrize("split", SPLIT_NAMES)
@pytest.mark.parametrize("paired", PAIRED, ids=lambda c: c.__name__)
def test_small_and_large_frames_still_decide_every_answer(paired, split, image_size):
    """At 32 px the shifted split's dots move under a pixel per frame: the crossings are still decided."""
    data = paired(num_samples=20, seed=5, image_size=image_size, split=split, transform_prob=0.7)
    for i in range(20):
        for sample in data[i]:
            assert sample.videos[0].frames.shape[1:] == (image_size, image_size, 3)
            assert sample.answer == answer_from_frames(sample.task, sample.videos[0].frames, sample.meta)
