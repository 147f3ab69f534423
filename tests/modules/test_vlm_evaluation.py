"""pass@k (the unbiased estimator) and per-evaluation-set metrics of the VLM evaluation, with app.data.eval_sets."""

import functools
import itertools
import random

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from app.data.eval_sets import EvalSets
from app.modules import VLMGRPOModule, VLMSFTModule
from app.modules.vlm_evaluation import pass_at_k
from app.rewards import RewardComponent
from app.settings import PassAtK
from app.tasks.dots import DotsDataset


def brute_force(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n completions (c of them correct) that hold a correct one."""
    outcomes = [any(i < c for i in subset) for subset in itertools.combinations(range(n), k)]
    return sum(outcomes) / len(outcomes)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_completion(random_seed):
    rng = random.Random(random_seed)
    for _ in range(20):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        correct = [rng.randint(0, n) for _ in range(3)]
        got = pass_at_k(n, torch.tensor(correct), k).tolist()
        assert got == pytest.approx([brute_force(n, c, k) for c in correct], abs=1e-6)
    assert pass_at_k(5, torch.tensor([1]), 1).item() == pytest.approx(0.2)  # pass@1 is the share correct


def test_bad_pass_at_k_settings_are_named():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, torch.tensor([1]), 3)
    with pytest.raises(ValueError, match="every k in"):
        PassAtK(num_samples=4, k=(1, 8))


def test_eval_sets_tag_each_sample_with_its_set_from_its_own_seed():
    sets = {"big": functools.partial(DotsDataset, dot_radius=12), "small": functools.partial(DotsDataset, dot_radius=5)}
    data = EvalSets(3, 0, 64, sets)
    assert len(data) == 6
    assert [data[i].meta["eval_set"] for i in range(6)] == ["big"] * 3 + ["small"] * 3
    same = EvalSets(3, 0, 64, {"big": sets["big"], "other": sets["big"]})
    assert data[0].meta["red_xy"] == same[0].meta["red_xy"] and data[0].meta["red_xy"] != same[3].meta["red_xy"]
    with pytest.raises(ValueError, match="without '/'"):
        EvalSets(3, 0, 64, {"a/b": sets["big"]})
    with pytest.raises(IndexError):
        data[6]


class InSetA(RewardComponent):
    """1 for samples of evaluation set "a", whatever the completion: pass@k is then known exactly."""

    def score(self, completions, samples):
        return torch.tensor([float(s.meta.get("eval_set") == "a") for s in samples])


def test_pass_at_k_and_sets_are_logged_overall_per_set_and_per_task(tiny_policy):
    factory = functools.partial(DotsDataset, dot_radius=12)
    samples = list(EvalSets(2, 0, 64, {"a": factory, "b": factory}))
    module = VLMSFTModule(tiny_policy, eval_max_new_tokens=2, eval_rewards=[InSetA(name="accuracy")])
    module.pass_at_k = PassAtK(num_samples=3, k=(1, 2), temperature=1.0)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (results,) = trainer.test(module, dataloaders=DataLoader(samples, batch_size=4, collate_fn=list), verbose=False)
    task = samples[0].task
    for key in ("acc", "pass@1", "pass@2"):
        assert results[f"test/{key}"] == pytest.approx(0.5)
        assert results[f"test/a/{key}"] == 1.0 and results[f"test/b/{key}"] == 0.0
        assert results[f"test/a/{key}/{task}"] == 1.0
    assert module.eval_set_names == ["a", "b"]
    module.pass_at_k = PassAtK(num_samples=2, k=(1,), reward="missing")
    with pytest.raises(ValueError, match="'missing' is not one of the evaluation rewards"):
        trainer.test(module, dataloaders=DataLoader(samples, batch_size=4, collate_fn=list), verbose=False)


def test_the_grpo_module_takes_pass_at_k_as_plain_hyperparameters(tiny_policy):
    module = VLMGRPOModule(tiny_policy, [InSetA()], pass_at_k=PassAtK(num_samples=4, k=(1, 4)))
    assert module.pass_at_k.k == (1, 4)
    assert module.hparams["pass_at_k"] == {
        "num_samples": 4,
        "k": (1, 4),
        "temperature": 1.0,
        "reward": "accuracy",
        "threshold": 1.0,
    }
