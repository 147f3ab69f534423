"""Sampling: chunked per-token log-probs for VLM policies; ODE / SDE / CPS flow-matching steps with log-probs and the
denoising loop that runs them; micro-batching."""

from app.sampling.batching import micro_batches
from app.sampling.flow import StepOutput, cps_step, flow_sigmas, is_trainable_step, ode_step, sde_step
from app.sampling.flow_rollout import FlowSampler, FlowSamplingSettings, stochastic_steps, train_steps
from app.sampling.logprobs import chunked_token_logprobs, token_logprobs_naive

__all__ = [
    "FlowSampler",
    "FlowSamplingSettings",
    "StepOutput",
    "chunked_token_logprobs",
    "cps_step",
    "flow_sigmas",
    "is_trainable_step",
    "micro_batches",
    "ode_step",
    "sde_step",
    "stochastic_steps",
    "token_logprobs_naive",
    "train_steps",
]
