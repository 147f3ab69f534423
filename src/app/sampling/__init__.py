"""Sampling: ODE / SDE / CPS flow-matching steps with log-probs and the denoising loop that runs them; micro-batching.
(The VLM policies' chunked per-token log-probs are pure math: :mod:`app.algorithms.logprobs`.)"""

from app.sampling.batching import micro_batches
from app.sampling.flow import StepOutput, cps_step, flow_sigmas, is_trainable_step, ode_step, sde_step
from app.sampling.flow_rollout import FlowSampler, stochastic_steps, train_steps
from app.sampling.vlm_rollout import VLMSampler

__all__ = [
    "FlowSampler",
    "VLMSampler",
    "StepOutput",
    "cps_step",
    "flow_sigmas",
    "is_trainable_step",
    "micro_batches",
    "ode_step",
    "sde_step",
    "stochastic_steps",
    "train_steps",
]
