"""The motion tasks: samples well formed and rebuilt from (seed, index) alone, every answer read back from the rendered
frames (the centroids of the red and blue pixels per frame, the line's column, the frames where red shows), the splits'
ranges, and the accuracy and format rewards scoring the target response 1 and a wrong answer 0.

Centroids are compared exactly: a dot is the disc ``dx^2 + dy^2 <= r^2`` around an integer centre, kept whole inside
the frame and drawn in a colour nothing else uses, so its pixels are symmetric about the centre and their mean (sums of
integers below 2^53, divided once) is the centre in floating point too. The red dot is drawn last, so no other dot hides
any of its pixels; where the blue one is measured (the order task) the lanes keep the two apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.rewards import AccuracyReward, FormatReward
from app.tasks.motion import SPLITS, DirectionDataset, EventCountDataset, OrderDataset, centroids
from app.tasks.motion.clips import BLUE, LINE, RED, runs
from app.types import VIDEO_TOKEN, Video

TASKS = [DirectionDataset, OrderDataset, EventCountDataset]
SPLIT_NAMES = ["in_domain", "shifted"]
N = 40
PHRASES = {"right": "to the right", "left": "to the left", "up": "up", "down": "down"}


def same_sample(a, b) -> bool:
    return (
        np.array_equal(a.videos[0].frames, b.videos[0].frames)
        and a.videos[0].fps == b.videos[0].fps
        and (a.question, a.answer, a.reasoning, a.meta) == (b.question, b.answer, b.reasoning, b.meta)
    )


def direction_from_frames(frames: np.ndarray, asked: str) -> str:
    """yes/no read off the frames: the sign of the red centroid's displacement along the asked axis."""
    (x0, y0), (x1, y1) = centroids(frames, RED)[0], centroids(frames, RED)[-1]
    along = {"right": x1 - x0, "left": x0 - x1, "down": y1 - y0, "up": y0 - y1}[asked]
    return "yes" if along > 0 else "no"


def line_column(frames: np.ndarray) -> int:
    columns = np.unique(np.nonzero(np.all(frames == np.array(LINE, dtype=np.uint8), axis=-1))[2])
    assert len(columns) == 1, columns
    return int(columns[0])


def crossing_from_frames(frames: np.ndarray, color, line_x: int) -> int:
    """The first frame where the dot's centroid is on the other side of the line than in the first frame."""
    xs = [xy[0] for xy in centroids(frames, color)]
    assert all(x != line_x for x in xs)
    start = xs[0] > line_x
    return next(t for t, x in enumerate(xs) if (x > line_x) != start)


def count_from_frames(frames: np.ndarray) -> int:
    return runs([xy is not None for xy in centroids(frames, RED)])


@pytest.mark.parametrize("split", SPLIT_NAMES)
@pytest.mark.parametrize("task", TASKS, ids=lambda c: c.__name__)
def test_samples_hold_one_video_and_a_question_that_places_it(task, split):
    low, high = SPLITS[split].frames
    for i in range(8):
        sample = task(num_samples=8, seed=3, image_size=64, split=split, fps=5.0)[i]
        assert sample.images == [] and len(sample.videos) == 1 and isinstance(sample.videos[0], Video)
        video = sample.videos[0]
        assert video.frames.dtype == np.uint8 and video.frames.shape[1:] == (64, 64, 3) and video.fps == 5.0
        assert low <= video.num_frames <= high
        assert video.num_frames == sample.meta["num_frames"] == len(sample.meta["red_xy"])
        assert sample.question.startswith(VIDEO_TOKEN) and sample.question.count(VIDEO_TOKEN) == 1
        assert "<image>" not in sample.question
        assert sample.task == task.task and sample.meta["split"] == split
        assert sample.answer in ("yes", "no") or sample.answer.isdigit()
        assert sample.reasoning.startswith("the ")


@pytest.mark.parametrize("task", TASKS, ids=lambda c: c.__name__)
def test_a_sample_depends_only_on_seed_and_index(task):
    a, b = task(num_samples=10, seed=7), task(num_samples=4, seed=7)
    assert same_sample(a[3], b[3]) and same_sample(a[-1], a[9])
    assert not same_sample(a[3], a[2])
    assert not same_sample(a[3], task(num_samples=10, seed=8)[3])


@pytest.mark.parametrize("split", SPLIT_NAMES)
def test_direction_answer_is_the_sign_of_the_red_displacement_in_the_frames(split):
    data = DirectionDataset(num_samples=N, seed=0, split=split)
    margin = data.min_displacement
    for i in range(N):
        sample = data[i]
        frames, meta = sample.videos[0].frames, sample.meta
        assert centroids(frames, RED) == [tuple(map(float, xy)) for xy in meta["red_xy"]]
        assert sample.answer == direction_from_frames(frames, meta["asked"])
        (x0, y0), (x1, y1) = meta["red_xy"][0], meta["red_xy"][-1]
        dx, dy = x1 - x0, y1 - y0
        along, sideways = (dx, dy) if meta["asked"] in ("left", "right") else (dy, dx)
        assert abs(along) >= margin and abs(sideways) < abs(along)
        assert meta["displacement"] == (dx, dy)
        assert (meta["moving"] == meta["asked"]) == (sample.answer == "yes")
        assert sample.question == f"{VIDEO_TOKEN}Is the red dot moving {PHRASES[meta['asked']]}?"
    assert sorted(data[i].answer for i in range(N)) == ["no"] * (N // 2) + ["yes"] * (N // 2)


@pytest.mark.parametrize("split", SPLIT_NAMES)
def test_order_answer_is_which_centroid_crosses_the_line_first(split):
    data = OrderDataset(num_samples=N, seed=0, split=split)
    for i in range(N):
        sample = data[i]
        frames, meta = sample.videos[0].frames, sample.meta
        line_x = line_column(frames)
        assert line_x == meta["line_x"]
        red, blue = crossing_from_frames(frames, RED, line_x), crossing_from_frames(frames, BLUE, line_x)
        assert red != blue and meta["crossings"] == {"red": red, "blue": blue}
        assert sample.answer == ("yes" if red < blue else "no")
        assert centroids(frames, BLUE) == [tuple(map(float, xy)) for xy in meta["blue_xy"]]
        reds = centroids(frames, RED)
        assert len({y for _, y in reds}) == 1 and len({y for _, y in centroids(frames, BLUE)}) == 1  # horizontal
        # each crosses once: its side of the line changes in one frame only
        for color in (RED, BLUE):
            sides = [x > line_x for x, _ in centroids(frames, color)]
            assert sum(a != b for a, b in zip(sides[:-1], sides[1:], strict=True)) == 1
    assert sorted(data[i].answer for i in range(N)) == ["no"] * (N // 2) + ["yes"] * (N // 2)


@pytest.mark.parametrize("split", SPLIT_NAMES)
def test_count_answer_is_the_number_of_runs_of_frames_showing_red(split):
    data = EventCountDataset(num_samples=N, seed=0, split=split)
    low, high = SPLITS[split].counts
    counts = set()
    for i in range(N):
        sample = data[i]
        frames, meta = sample.videos[0].frames, sample.meta
        count = count_from_frames(frames)
        assert sample.answer == str(count) == str(meta["count"]) and low <= count <= high
        assert [xy is not None for xy in centroids(frames, RED)] == meta["red_visible"]
        assert runs([xy is not None for xy in centroids(frames, BLUE)]) == meta["blue_count"]
        shown = [xy for xy in centroids(frames, RED) if xy is not None]
        assert shown == [tuple(map(float, xy)) for xy in meta["red_xy"] if xy is not None]
        counts.add(count)
    assert counts == set(range(low, high + 1))  # every count of the split occurs in 40 draws


def disc_pixels(radius: int) -> int:
    return sum(
        dx * dx + dy * dy <= radius * radius for dx in range(-radius, radius + 1) for dy in range(-radius, radius + 1)
    )


def test_splits_differ_in_frames_sizes_backgrounds_and_drift():
    for split in SPLIT_NAMES:
        ranges = SPLITS[split]
        for task in TASKS:
            data = task(num_samples=12, seed=1, split=split)
            for sample in (data[i] for i in range(12)):
                frames, radius = sample.videos[0].frames, sample.meta["radius"]
                corner = tuple(int(c) for c in frames[0, 0, 0])  # no dot reaches a corner: each stays whole inside
                assert corner == sample.meta["background"] and corner in ranges.backgrounds
                assert ranges.radius[0] <= radius <= ranges.radius[1]
                red_pixels = np.all(frames == np.array(RED, dtype=np.uint8), axis=-1).sum(axis=(1, 2))
                assert red_pixels.max() == disc_pixels(radius)
    assert set(SPLITS["in_domain"].backgrounds).isdisjoint(SPLITS["shifted"].backgrounds)
    assert SPLITS["in_domain"].frames[1] < SPLITS["shifted"].frames[0]
    assert SPLITS["shifted"].radius[1] < SPLITS["in_domain"].radius[0]
    assert SPLITS["shifted"].speed[1] <= SPLITS["in_domain"].speed[0]

    def sideways(sample) -> int:
        dx, dy = sample.meta["displacement"]
        return dy if sample.meta["asked"] in ("left", "right") else dx

    in_domain, shifted = (DirectionDataset(num_samples=N, seed=0, split=split) for split in SPLIT_NAMES)
    assert all(sideways(in_domain[i]) == 0 for i in range(N))  # along the asked axis only
    assert sum(sideways(shifted[i]) != 0 for i in range(N)) > N // 2  # a drift of up to 0.4 of the speed


def test_frame_size_follows_image_size_and_lengths_scale():
    sample = DirectionDataset(num_samples=2, seed=0, image_size=128)[0]
    assert sample.videos[0].frames.shape[1:] == (128, 128, 3)
    assert 2 * SPLITS["in_domain"].radius[0] <= sample.meta["radius"] <= 2 * SPLITS["in_domain"].radius[1]


def test_unlabeled_keeps_the_clip_and_drops_the_labels():
    labeled, unlabeled = OrderDataset(4, seed=2)[1], OrderDataset(4, seed=2, labeled=False)[1]
    assert unlabeled.answer is None and unlabeled.reasoning is None
    assert np.array_equal(labeled.videos[0].frames, unlabeled.videos[0].frames)
    assert labeled.meta == unlabeled.meta


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"split must be one of \['in_domain', 'shifted'\], got 'ood'"):
        DirectionDataset(4, seed=0, split="ood")
    with pytest.raises(ValueError, match="image_size must be >= 32 for the motion tasks, got 16"):
        OrderDataset(4, seed=0, image_size=16)
    with pytest.raises(ValueError, match="fps must be > 0, got 0"):
        EventCountDataset(4, seed=0, fps=0)
    with pytest.raises(IndexError, match="DirectionDataset: index 4 out of range for 4 samples"):
        DirectionDataset(4, seed=0)[4]


def wrong(answer: str) -> str:
    return {"yes": "no", "no": "yes"}.get(answer) or str(int(answer) + 1)


@pytest.mark.parametrize("task", TASKS, ids=lambda c: c.__name__)
def test_accuracy_reward_scores_the_target_one_and_a_wrong_answer_zero(task):
    samples = [task(num_samples=6, seed=0)[i] for i in range(6)]
    target = [f"<think>{s.reasoning}</think><answer>{s.answer}</answer>" for s in samples]
    other = [f"<think>{s.reasoning}</think><answer>{wrong(s.answer)}</answer>" for s in samples]
    assert AccuracyReward().score(target, samples).tolist() == [1.0] * 6
    assert AccuracyReward().score(other, samples).tolist() == [0.0] * 6
    assert FormatReward().score(target, samples).tolist() == [1.0] * 6
    assert FormatReward().score([s.answer for s in samples], samples).tolist() == [0.0] * 6


def test_clips_that_do_not_decide_the_answer_are_never_emitted():
    """A red dot that barely moves has no direction, a dot centred on the line has not crossed it, crossings in one
    frame have no order: label() says None and build() refuses them."""
    from app.tasks.motion import Clip, Track

    def dot(color, xs, y=20, visible=None):
        return Track(color, 3, tuple((x, y) for x in xs), tuple(visible or [True] * len(xs)))

    direction, order = DirectionDataset(2, seed=0), OrderDataset(2, seed=0)
    still = Clip(64, 4.0, (230, 230, 230), (dot(BLUE, [10, 20, 30], 50), dot(RED, [30, 31, 33])))
    assert direction.label(still, {"asked": "right"}) is None  # 3 px < 64 / 16
    with pytest.raises(ValueError, match="DirectionDataset: the clip does not decide the answer"):
        direction.build(still, {"asked": "right"})
    moving = Clip(64, 4.0, (230, 230, 230), (dot(BLUE, [10, 20, 30], 50), dot(RED, [30, 33, 36])))
    assert direction.label(moving, {"asked": "right"}) is True and direction.label(moving, {"asked": "left"}) is False
    on_line = Clip(64, 4.0, (230, 230, 230), (dot(BLUE, [20, 30, 40], 50), dot(RED, [26, 32, 38])), line_x=32)
    assert order.label(on_line, {}) is None
    same_frame = Clip(64, 4.0, (230, 230, 230), (dot(BLUE, [22, 34, 40], 50), dot(RED, [27, 33, 39])), line_x=32)
    assert order.label(same_frame, {}) is None
    red_first = Clip(64, 4.0, (230, 230, 230), (dot(BLUE, [20, 30, 40], 50), dot(RED, [30, 34, 38])), line_x=32)
    assert order.label(red_first, {}) is True and order.label(red_first.reversed(), {}) is False
    never = Clip(64, 4.0, (230, 230, 230), (dot(BLUE, [20, 30], 50), dot(RED, [20, 30], visible=[False, False])))
    assert EventCountDataset(2, seed=0).label(never, {}) is None
