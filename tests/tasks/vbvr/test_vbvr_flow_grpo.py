"""The task scorers plug into flow-GRPO: two training steps of the tiny SD3 policy rewarded by VBVR scorers."""

import torch
from torch.utils.data import DataLoader

from app.models.flow import FlowPolicy
from app.modules.flow_grpo import FlowGRPOModule
from app.settings import FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings
from app.tasks.vbvr import get_task
from app.tasks.vbvr.reward import VBVRScorerReward
from app.types import VisualSample


def vbvr_samples(n: int) -> list[VisualSample]:
    samples = []
    for name in ("object_counting", "color_mixing"):
        task = get_task(name, image_size=64)
        params = {"image_size": 64, **task.params}
        for seed in range(n):
            instance = task.generate(seed)
            spec = {"task": name, "params": params, "config": instance.config}
            samples.append(VisualSample([], instance.prompt, name, meta={"vbvr": spec}))
    return samples


def test_two_flow_grpo_steps_with_vbvr_scorer_rewards(fit):
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    reward = VBVRScorerReward()
    module = FlowGRPOModule(
        policy,
        [reward],
        sampling=FlowGRPOSamplingSettings(group_size=2, num_steps=3),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )
    data = DataLoader(vbvr_samples(2), batch_size=2, shuffle=False, collate_fn=list)

    trainer, recorder = fit(module, data, max_steps=2)

    assert trainer.global_step == 2
    scores = recorder.metric("train/reward/vbvr_scorer")
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
    assert reward.num_malformed == 0, "decoded images must reach the scorers in a readable format"
    # The untrained tiny model draws noise, so most groups score alike; that the loop runs and reports it is the point
    # here (parameter updates under non-zero advantages are tested in tests/modules/test_flow_grpo.py).
    assert len(recorder.metric("train/frac_zero_std")) == 2
