"""Sampling helpers: chunked per-token log-probs for VLM policies; ODE / SDE / CPS flow-matching steps with log-probs."""

from app.sampling.flow import StepOutput, cps_step, flow_sigmas, is_trainable_step, ode_step, sde_step
from app.sampling.logprobs import chunked_token_logprobs, token_logprobs_naive

__all__ = [
    "StepOutput",
    "chunked_token_logprobs",
    "cps_step",
    "flow_sigmas",
    "is_trainable_step",
    "ode_step",
    "sde_step",
    "token_logprobs_naive",
]
