"""The dot-triplet task: counts by construction, ground truth in the TriSR schema, determinism, registration."""

import functools
import random

import numpy as np
import pytest

from app.data import VisualTaskDataModule
from app.formats import TRIPLET_RESPONSE_INSTRUCTION
from app.rewards.triplet_parsing import parse_triplet_response
from app.rewards.trisr import TripletOverallAccuracy, TriSRReward
from app.rewards.trisr_scores import triplet_consistency_reward
from app.tasks.dots.triplets import DOT, TASK, TripletDotsDataset, make_dots_triplet_sample


def count_blobs(image) -> int:
    """Connected components of dot-coloured pixels (4-neighbourhood flood fill)."""
    mask = np.all(np.asarray(image) == np.array(DOT, dtype=np.uint8), axis=-1)
    seen = np.zeros_like(mask)
    blobs = 0
    for y, x in zip(*np.nonzero(mask), strict=True):
        if seen[y, x]:
            continue
        blobs += 1
        stack = [(y, x)]
        seen[y, x] = True
        while stack:
            cy, cx = stack.pop()
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
    return blobs


@pytest.mark.parametrize("seed", range(10))
def test_sample_counts_and_ground_truth(seed):
    sample = make_dots_triplet_sample(random.Random(seed), image_size=64)
    counts = sample.meta["attributes"]
    assert len(set(counts)) == 3 and all(1 <= c <= 6 for c in counts)
    assert [count_blobs(image) for image in sample.images] == counts
    assert all(image.size == (64, 64) for image in sample.images)
    for pair, winner in sample.meta["pair_answers"].items():
        i, j = int(pair[0]), int(pair[2])
        assert winner == str(i if counts[i - 1] > counts[j - 1] else j)
    assert sample.task == TASK and sample.question.endswith(TRIPLET_RESPONSE_INSTRUCTION)
    # the target response is in the documented format and earns the full TriSR reward available
    target = f"<think>{sample.reasoning}</think><answer>{sample.answer}</answer>"
    parsed = parse_triplet_response(target)
    assert parsed.attributes == tuple(float(c) for c in counts) and parsed.answers == sample.meta["pair_answers"]
    tc = triplet_consistency_reward([target]).item()
    assert tc in (0.0, 1.0)
    assert TriSRReward().score([target], [sample]).item() == pytest.approx(1.4 + 0.3 * tc)
    assert TripletOverallAccuracy().score([target], [sample]).item() == 1.0


def test_dataset_is_deterministic_and_registered():
    a, b = TripletDotsDataset(6, seed=3), TripletDotsDataset(6, seed=3)
    assert [s.meta["attributes"] for s in a] == [s.meta["attributes"] for s in b]
    assert np.array_equal(np.asarray(a[2].images[1]), np.asarray(b[2].images[1]))
    assert a[-1].meta == a[5].meta
    with pytest.raises(IndexError):
        a[6]
    unlabeled = TripletDotsDataset(2, seed=0, labeled=False)[0]
    assert unlabeled.answer is None and "pair_answers" not in unlabeled.meta
    data = VisualTaskDataModule(
        dataset=functools.partial(TripletDotsDataset, max_count=5),
        train_size=4,
        val_size=2,
        test_size=2,
        batch_size=2,
        image_size=64,
    )
    batch = next(iter(data.train_dataloader()))
    assert len(batch) == 2 and all(len(s.images) == 3 for s in batch)


def test_bad_arguments():
    with pytest.raises(ValueError, match="distinct"):
        make_dots_triplet_sample(random.Random(0), min_count=3, max_count=4)
    with pytest.raises(ValueError, match="cannot place"):
        make_dots_triplet_sample(random.Random(0), image_size=16, min_count=8, max_count=12, dot_radius=3)
