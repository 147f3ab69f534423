"""How many transformer passes a flow-GRPO step makes: the old log-probs are never recomputed.

With one update per rollout and no delay the ratio's old log-probs are the current ones detached (ratio exactly 1);
otherwise they are the rollout's own per-step log-densities, stored when each transition was drawn by the very weights
the first update starts from. Either way no separate no-gradient pass over the trained steps happens before the
update (verl-omni's saving on flow models: its trainer recomputes them unless told the rollout's are exact)."""

import pytest
import torch
from doubles import RednessReward, StandInPolicy
from prompt_samples import prompt_loader

from app.modules.flow_grpo import FlowGRPOModule
from app.settings import FlowGRPOLossSettings, FlowGRPOSamplingSettings, GRPOSettings, PipelineSettings

K, T = 2, 4


def counted_passes(module: FlowGRPOModule) -> list[dict[str, int]]:
    """Per training step, the velocity evaluations without and with gradients."""
    counts: list[dict[str, int]] = []
    velocity = module.policy.velocity

    def spy(latents, sigma, conditioning):
        counts[-1]["grad" if torch.is_grad_enabled() else "no_grad"] += 1
        return velocity(latents, sigma, conditioning)

    module.policy.velocity = spy
    original = module.training_step

    def step(batch, batch_idx):
        counts.append({"no_grad": 0, "grad": 0})
        return original(batch, batch_idx)

    module.training_step = step
    return counts


@pytest.mark.parametrize("iterations, delay", [(1, 0), (2, 0), (1, 1)])
def test_a_step_evaluates_the_rollout_once_and_each_trained_step_once_per_update(fit, iterations, delay):
    """B = 2 prompts, K = 2, T = 4 denoising steps, every one but the last trained (S = 3), micro-batches of 2 rows:
    the rollout takes T passes per micro-batch of the B*K = 4 rows, each update S per micro-batch, and nothing else
    runs: no pass recomputes the old log-probs."""
    module = FlowGRPOModule(
        StandInPolicy(),
        [RednessReward()],
        FlowGRPOSamplingSettings(group_size=K, num_steps=T, timestep_fraction=1.0),
        grpo=GRPOSettings(num_iterations=iterations, micro_batch_size=2),
        loss=FlowGRPOLossSettings(eps_low=0.5, eps_high=0.5),
        pipeline=PipelineSettings(delay=delay, workers="thread"),
    )
    counts = counted_passes(module)
    fit(module, prompt_loader(n=6, batch_size=2), max_steps=2)
    micro_batches, trained_steps = 2 * K // 2, T - 1
    rollout = T * micro_batches
    update = trained_steps * micro_batches
    trained = counts[delay:]  # with delay 1 the first step only draws (primes the queue)
    assert all(c == {"no_grad": rollout, "grad": iterations * update} for c in trained), counts
    assert all(c == {"no_grad": rollout, "grad": 0} for c in counts[:delay]), counts
