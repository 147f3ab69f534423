"""VBVR data for conditioned generation: problem frames (and solutions for pretraining) per sample, both splits in one
evaluation set, and the three evaluation regimes scored from one generated rendering."""

import numpy as np
import pytest

from app.tasks.vbvr import VBVRPromptDataset
from app.tasks.vbvr.regimes import REGIMES, failed_check_names, regime_renderings, score_regimes


def test_samples_carry_the_problem_frame_the_solution_and_their_split():
    data = VBVRPromptDataset(
        8,
        seed=0,
        image_size=64,
        tasks=["color_mixing", "object_counting"],
        split=["in_domain", "out_of_domain"],
        with_solution=True,
    )
    samples = [data[i] for i in range(8)]
    assert [s.task for s in samples[:4]] == ["color_mixing", "object_counting"] * 2
    assert [s.meta["split"] for s in samples[:4]] == ["in_domain", "in_domain", "out_of_domain", "out_of_domain"]
    assert all(len(s.images) == 2 and s.images[0].size == (64, 64) for s in samples)
    assert samples[2].meta["vbvr"]["params"]["extended_mixes"] is True  # color mixing's out-of-domain parameters
    for sample in samples:
        spec = sample.meta["vbvr"]
        solution = np.asarray(sample.images[1])
        assert score_regimes(solution, spec)["last_frame"].score == 1.0  # the solution is what the scorer wants
        assert score_regimes(np.asarray(sample.images[0]), spec)["last_frame"].score < 0.5  # the problem is not
    assert len(VBVRPromptDataset(2, seed=0, image_size=64, tasks=["color_mixing"])[0].images) == 1


def test_regimes_pick_last_key_and_all_frames():
    frames = np.arange(5)[:, None, None, None] * np.ones((5, 4, 4, 3), np.uint8)  # frame i is filled with i
    out = regime_renderings(frames, key_frame_indices=[0, 6, 12], num_source_frames=13)
    assert set(out) == set(REGIMES)
    assert out["last_frame"][0, 0, 0] == 4
    assert [int(f[0, 0, 0]) for f in out["key_frame"]] == [0, 2, 4]  # 6 of 13 source frames -> 2 of 5
    assert len(out["multi_frame"]) == 5
    assert set(regime_renderings(frames[:1])) == {"last_frame"}


def test_a_video_is_scored_in_every_regime_with_its_failed_checks():
    data = VBVRPromptDataset(1, seed=0, image_size=64, tasks=["object_counting"])
    sample = data[0]
    problem = np.asarray(sample.images[0])
    results = score_regimes(np.stack([problem] * 5), sample.meta["vbvr"])  # a video that never draws the answer
    assert set(results) == set(REGIMES)
    assert all(r.score < 0.5 for r in results.values())
    assert "red_count_matches" in failed_check_names(results["last_frame"])
    assert failed_check_names(None) == []


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split must be one of"):
        VBVRPromptDataset(2, seed=0, image_size=64, tasks=["color_mixing"], split=["in_domain", "sideways"])
