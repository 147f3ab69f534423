"""Training against rewards served by another process (``python -m app.rewards.serve``) gives the run the same
rewards in-process give it: same seed, same scores, same weights, the scorer's side state counted on the client."""

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from app.models.flow import FlowPolicy
from app.modules.flow_grpo import FlowGRPOModule
from app.rewards import RemoteReward
from app.rewards.serve import ServerProcess
from app.settings import FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings, PipelineSettings
from app.tasks.vbvr import VBVRPromptDataset, VBVRScorerReward

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SERVED = """\
rewards:
  - class_path: app.tasks.vbvr.VBVRScorerReward
  - class_path: dense_reward.RednessReward
"""


@pytest.fixture
def reward_server(tmp_path):
    """The URL of a reward server process serving the VBVR scorer and the fixtures' redness reward."""
    config = tmp_path / "rewards.yaml"
    config.write_text(SERVED)
    with ServerProcess(config, pythonpath=[FIXTURES]) as server:
        yield server.url


def train(rewards, fit):
    """Three steps of flow-GRPO under the delayed pipeline on the image-edit tiny model: its LoRA weights after, the
    rewards it logged, the module."""
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-flux-kontext", lora=LoRASettings(r=4, alpha=8), max_sequence_length=16)
    module = FlowGRPOModule(
        policy,
        rewards,
        sampling=FlowGRPOSamplingSettings(group_size=2, num_steps=3),
        optimizer=OptimizerSettings(learning_rate=1e-3),
        pipeline=PipelineSettings(delay=1),
    )
    dataset = VBVRPromptDataset(6, seed=0, image_size=64, tasks=["color_mixing", "object_counting"])
    data = DataLoader([dataset[i] for i in range(6)], batch_size=2, collate_fn=list)
    _, recorder = fit(module, data, max_steps=3)
    weights = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    logged = [{k: v for k, v in s["metrics"].items() if k.startswith("train/reward/")} for s in recorder.steps]
    return weights, logged, module


@pytest.mark.slow
def test_a_run_against_served_rewards_trains_the_weights_the_rewards_in_process_train(reward_server, fit, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    from dense_reward import RednessReward

    local_weights, local_logged, local = train([VBVRScorerReward(), RednessReward()], fit)
    remote_rewards = [RemoteReward(reward_server, "vbvr_scorer"), RemoteReward(reward_server, "redness")]
    remote_weights, remote_logged, remote = train(remote_rewards, fit)

    assert remote_logged == local_logged and any(step for step in local_logged)
    assert local_weights.keys() == remote_weights.keys()
    unequal = [name for name in local_weights if not torch.equal(local_weights[name], remote_weights[name])]
    assert not unequal, unequal
    initial = FlowPolicy("tiny-flux-kontext", lora=LoRASettings(r=4, alpha=8), max_sequence_length=16)
    moved = [n for n, p in initial.named_parameters() if p.requires_grad and not torch.equal(p, local_weights[n])]
    assert moved  # the runs trained: the equality is not that of two untouched models
    vbvr, served = local.rewards.components[0], remote.rewards.components[0]
    expected = {f"failed_checks/{task}/{check}": float(n) for (task, check), n in vbvr.failed_checks.items()}
    expected |= {"num_malformed": float(vbvr.num_malformed)} if vbvr.num_malformed else {}
    assert dict(served.server_counters) == expected and expected
    assert served.num_failed_requests == served.num_retries == 0
