"""VLM generation helpers and flow samplers; per-token log-probs of sampled completions."""

from app.sampling.logprobs import chunked_token_logprobs, token_logprobs_naive

__all__ = ["chunked_token_logprobs", "token_logprobs_naive"]
