"""Next-token sampling by inverse transform: one uniform number per row instead of one per vocabulary entry.

``torch.multinomial(probs, 1)`` draws an exponential variate for every entry of ``probs`` and takes the argmax of
``probs / E``: 32 rows x 151,936 tokens is 4.9 M random numbers per decoding step, which on a CPU costs more than a
small model's forward. Inverse-transform sampling draws ``u ~ U[0, 1)`` per row and takes the first token whose
cumulative probability exceeds ``u * total``: the same distribution (exactly, up to float64 rounding of the cumulative
sums) from one random number per row. The tokens differ from ``torch.multinomial``'s for the same seed, not their law.

:class:`InverseCDFSampling` plugs it into Hugging Face ``generate`` as the last logits processor of a greedy search:
it applies temperature and top-p with transformers' own warpers, draws the token and returns scores whose argmax is the
drawn token, so ``generate`` keeps its loop, caches, stopping criteria and padding of finished rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` ``[N, V]`` (non-negative, e.g. a softmax; any positive total), drawn with
    probability ``probs[n, v] / probs[n].sum()``. Returns ``[N]`` int64. Raises ``ValueError`` when a row holds NaN
    or inf (both reach the row's total) or sums to 0."""
    cdf = probs.to(torch.float64).cumsum(dim=-1)  # [N, V]; float64 so that tokens of tiny probability keep their share
    total = cdf[:, -1:]  # [N, 1]
    if not bool((torch.isfinite(total) & (total > 0)).all()):
        raise ValueError(
            "cannot sample the next token: its probabilities hold NaN or inf or a row sums to 0 "
            "(the policy's logits are not finite)"
        )
    uniform = torch.rand(total.shape, dtype=torch.float64, device=probs.device, generator=generator)  # [N, 1]
    # uniform <= 1 - 2**-53, so uniform * total < total in float64; the first v with cdf[v] > target then has
    # cdf[v - 1] <= target < cdf[v]: a token of positive probability, never one past the end
    return torch.searchsorted(cdf, uniform * total, right=True).squeeze(1)  # [N]


class InverseCDFSampling(LogitsProcessor):
    """The last logits processor of a greedy ``generate``: the suppressed tokens' scores set to ``-inf`` (as
    transformers' ``SuppressTokensLogitsProcessor`` does, here without a second processor per decoding step), then
    temperature and top-p (transformers' warpers, applied as ``generate(do_sample=True)`` would), then one token per row
    by :func:`sample_from_probs`. Returns scores that are 0 at the drawn token and ``-inf`` elsewhere, so greedy's
    argmax picks it.

    Args:
        temperature: divides the logits (> 0).
        top_p: nucleus sampling's probability mass (1: off).
        suppressed_token_ids: tokens never drawn.
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, suppressed_token_ids: Sequence[int] = ()):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        warpers = []
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.suppressed = torch.tensor(list(suppressed_token_ids), dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if len(self.suppressed):
            if self.suppressed.device != scores.device:
                self.suppressed = self.suppressed.to(scores.device)
            scores = scores.index_fill(1, self.suppressed, float("-inf"))  # [N, V]
        scores = self.warpers(input_ids, scores)  # [N, V]
        tokens = sample_from_probs(torch.softmax(scores.float(), dim=-1))  # [N]
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens[:, None], 0.0)
