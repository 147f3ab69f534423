"""Flow-GRPO on the embedded tiny video model: clips of frames scored by a per-frame reward."""

import torch
from torch.utils.data import DataLoader

from app.models.flow import FlowPolicy
from app.modules.flow_grpo import FlowGRPOModule
from app.rewards import RewardComponent
from app.settings import FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings
from app.types import VisualSample


class FrameRednessReward(RewardComponent):
    """Mean red channel over the frames of a decoded clip (``[T, 3, H, W]`` in [0, 1])."""

    def score(self, completions, samples):
        return torch.stack([clip[:, 0].float().mean() for clip in completions]).cpu()


def test_two_grpo_steps_on_the_tiny_video_model_move_every_adapter(fit):
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-wan", lora=LoRASettings(r=4, alpha=8))
    assert policy.is_video
    module = FlowGRPOModule(
        policy,
        [FrameRednessReward()],
        sampling=FlowGRPOSamplingSettings(group_size=2, num_steps=3),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )
    prompts = [VisualSample([], f"a red ball moving right, clip {i}", "video") for i in range(2)]
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}

    trainer, recorder = fit(module, DataLoader(prompts, batch_size=1, collate_fn=list), max_steps=2)

    assert trainer.global_step == 2
    assert recorder.metric("train/ratio_mean") == [1.0, 1.0]
    unchanged = [n for n, p in policy.named_parameters() if p.requires_grad and torch.equal(before[n], p)]
    assert before and not unchanged, unchanged
    clip = recorder.steps[-1]["outputs"]["images"][0]
    assert clip.ndim == 4 and clip.shape[1] == 3  # [T, 3, H, W]: the reward saw frames
