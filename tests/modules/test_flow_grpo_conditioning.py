"""Flow-GRPO and flow-matching on image-conditioned tiny models: every LoRA weight moves, the rollout keeps the image
conditioning for the update, pretraining learns problem -> solution pairs, and validation logs the rewards and returns
the samples for the callbacks."""

import math

import pytest
import torch
from torch.utils.data import DataLoader

from app.models.flow import FlowPolicy
from app.modules.flow_grpo import FlowGRPOModule
from app.modules.flow_matching import FlowMatchingModule
from app.rewards import RewardComponent
from app.settings import FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings
from app.tasks.vbvr import VBVRPromptDataset, VBVRScorerReward


def text_length(name):
    """Short prompts (the embedded tokenizer's 16 tokens), except Wan I2V, whose attention needs 512."""
    return 512 if name == "tiny-wan-i2v" else 16


class RednessReward(RewardComponent):
    """Mean red channel of the sample (its last frame for videos): a dense reward, so groups have non-zero spread."""

    def score(self, completions, samples):
        return torch.stack([(c[-1] if c.ndim == 4 else c)[0].mean() for c in completions]).float()


def vbvr_samples(n, image_size, split="in_domain", with_solution=False):
    dataset = VBVRPromptDataset(
        n,
        seed=0,
        image_size=image_size,
        tasks=["color_mixing", "object_counting"],
        split=split,
        with_solution=with_solution,
    )
    return [dataset[i] for i in range(n)]


@pytest.mark.parametrize("name", ["tiny-wan-i2v", "tiny-wan-ti2v", "tiny-flux-kontext"])
def test_grpo_fit_moves_every_lora_weight_of_a_conditioned_model(name, fit):
    torch.manual_seed(0)
    policy = FlowPolicy(name, lora=LoRASettings(r=4, alpha=8), max_sequence_length=text_length(name))
    size = policy.frame_size[0]
    module = FlowGRPOModule(
        policy,
        [RednessReward()],
        sampling=FlowGRPOSamplingSettings(group_size=2, num_steps=3),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    data = DataLoader(vbvr_samples(2, max(size, 32)), batch_size=2, collate_fn=list)
    trainer, recorder = fit(module, data, max_steps=2)
    after = {n: p.detach() for n, p in policy.named_parameters() if p.requires_grad}
    assert trainer.global_step == 2 and before and all("lora" in n for n in before)
    unchanged = sorted(n for n in before if torch.equal(before[n], after[n]))
    assert not unchanged, unchanged
    trajectory = module.rollout(vbvr_samples(2, max(size, 32))).sampled
    assert set(policy.encode_conditions(module.policy.condition_images(vbvr_samples(2, max(size, 32))))) <= set(
        trajectory.conditioning
    )


def test_conditioned_flow_matching_learns_from_problem_solution_pairs(fit):
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-flux-kontext", lora=None, max_sequence_length=16)
    module = FlowMatchingModule(policy, vae_warmup_steps=0, num_steps=2)
    data = DataLoader(vbvr_samples(4, 64, with_solution=True), batch_size=2, collate_fn=list)
    trainer, recorder = fit(module, data, max_steps=2)
    assert trainer.global_step == 2
    assert all(math.isfinite(v) for v in recorder.metric("train/loss/flow"))
    with pytest.raises(ValueError, match=r"needs images = \[problem, solution\] per sample; samples \[0, 1\]"):
        module.training_step(vbvr_samples(2, 64), 0)


def test_validation_logs_the_rewards_and_returns_the_samples_for_the_callbacks():
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-wan-ti2v", lora=None)
    module = FlowGRPOModule(
        policy,
        [VBVRScorerReward()],
        sampling=FlowGRPOSamplingSettings(group_size=2, num_steps=2, eval_sampler="unipc"),
    )
    samples = vbvr_samples(4, 64, split=["in_domain", "out_of_domain"])
    logged = {}
    module.log = lambda key, value, **kwargs: logged.__setitem__(key, float(value))
    module.generate = lambda batch, batch_idx=0: torch.rand(len(batch), 5, 3, 64, 64)  # 5-frame videos at 64 px
    out = module.validation_step(samples, 0)
    module.on_validation_epoch_end()
    assert out["images"].shape == (4, 5, 3, 64, 64)
    # the per split / task / regime scores are callbacks.vbvr_eval.VBVRScores', from out["images"]
    assert sorted(logged) == ["val/reward/total", "val/reward/vbvr_scorer"]
