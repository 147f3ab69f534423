"""Test doubles the module tests share: a plain helper module, not a test file (pytest collects nothing here).

Test files in this folder import it as ``from doubles import ...``: pytest puts the folder of a test file that is not in
a package (``tests/modules`` has no ``__init__.py``) on ``sys.path`` before importing it.

- :class:`LinearPolicy`: a two-weight policy (a full :class:`~app.models.Policy`) whose log-prob of output ``i`` is
  ``w . features[i]``.
- :class:`ValueReward`: the completion text read as a number.
- :func:`toy_draw` / :func:`features_of`: what a toy samples, a :class:`~app.types.SampledCompletions` of tiny tensors
  that carries each row's features, so a toy's pending rollouts go into a checkpoint (``app.modules.plain_data``
  stores only the package's own containers) and come back.
- :class:`ToyGRPO`: the GRPO skeleton over six fixed outputs (two groups of K = 3, the second of equal rewards).
- :class:`ToyPipelined` and :func:`toy_batch`: the skeleton over prompts that carry their outputs' features and values
  (the values are the rewards), for the delayed pipeline, its checkpoints and dynamic sampling.
- :func:`attach`: what a trainer gives a manually optimised module (optimizer, schedule, backward).
- :class:`Recorder`: an optimizer or schedule that only counts its steps.
- :class:`Logs`: takes the place of a module's ``log_dict`` and ``log`` and keeps every call.
- :class:`Clock`: stands in for ``time.perf_counter`` in the skeleton (the ``clock`` fixture of ``conftest.py``).
- :func:`samples`: the two prompts of :class:`ToyGRPO`.
- :class:`StandInPolicy` and :class:`RednessReward`: a FlowPolicy-shaped stand-in (a frozen 1x1 conv and a rank-2
  adapter) and a reward for its decoded images, for the flow modules.
- :func:`as_rank_0_of`: ``torch.distributed`` as rank 0 of several processes, the others' gathered objects given.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from app.algorithms import grpo_loss
from app.modules import GRPOModule
from app.parallel import ShardingPlan
from app.rewards import RewardComponent
from app.sampling.flow import flow_sigmas
from app.settings import GRPOSettings, OptimizerSettings, PipelineSettings
from app.types import CompletionBatch, Generation, PromptInputs, SampledCompletions, VisualSample

K = 3
""":class:`ToyGRPO`'s group size."""
TOY_OUTPUTS = ["1", "2", "6", "5", "5", "5"]
""":class:`ToyGRPO`'s outputs: two groups of K = 3; the second has equal rewards."""
TOY_FEATURES = torch.arange(12.0).reshape(6, 2) / 10
""":class:`ToyGRPO`'s features, one row per output."""


class ValueReward(RewardComponent):
    """The completion text read as a number."""

    value_range = (-10.0, 10.0)

    def score(self, completions, samples):
        return torch.tensor([float(c) for c in completions])


class LinearPolicy(nn.Module):
    """A policy whose log-prob of output ``i`` is ``w . features[i]``."""

    uses_lora = True
    frozen_reference = None

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([0.5, -0.25]))

    @property
    def device(self):
        return self.weight.device

    def trainable_parameters(self):
        return [self.weight]

    def enable_reference(self):
        pass

    @contextlib.contextmanager
    def reference(self):
        yield

    def export(self, output_dir):
        return output_dir

    def sharding_plan(self):
        return ShardingPlan(units=[], roots=[self])


@dataclass
class ToySampling:
    """The sampling settings of a toy: only the group size."""

    group_size: int = K


# ------------------------------------------------------------------------------------------------ the draw
def toy_draw(
    features: torch.Tensor, texts: list[str], rows_per_prompt: int, old_logprobs: torch.Tensor | None = None
) -> SampledCompletions:
    """N outputs ``texts`` with their ``[N, 2]`` features (kept beside one-token prompts and completions) and, when
    given, their ``[N, 1]`` behaviour log-probs."""
    n = len(texts)
    prompts = PromptInputs({"input_ids": torch.zeros(n, 1, dtype=torch.long), "features": features}, [0] * n)
    completions = CompletionBatch(
        torch.zeros(n, 1, dtype=torch.long),
        torch.ones(n, 1, dtype=torch.long),
        list(texts),
        torch.zeros(n, dtype=torch.bool),
        rows_per_prompt,
    )
    return SampledCompletions(prompts, completions, old_logprobs, None)


def features_of(sampled: SampledCompletions) -> torch.Tensor:
    """The ``[N, 2]`` features of a :func:`toy_draw`."""
    return sampled.prompt_inputs.tensors["features"]


# ------------------------------------------------------------------------------------------------ the toys
class ToyGRPO(GRPOModule):
    """Outputs are fixed numbers (:data:`TOY_OUTPUTS`, ``self.outputs``); the loss parts are rows in groups of
    ``part_size`` (the micro-batch size), each weighted by its share of kept rows.

    ``grpo`` defaults to no gradient clipping (``gradient_clip_val=0``); given, it is used as it is (its own clipping
    included) but for its micro-batch size, which is ``part_size``. The learning rate defaults to 0.1,
    ``records_per_step`` to 4.
    """

    sampling_settings = ToySampling

    def __init__(
        self,
        policy,
        rewards=None,
        part_size: int = 2,
        grpo: GRPOSettings | None = None,
        optimizer: OptimizerSettings | None = None,
        pipeline: PipelineSettings | None = None,
        records_per_step: int = 4,
    ):
        grpo = dataclasses.replace(grpo or GRPOSettings(gradient_clip_val=0.0), micro_batch_size=part_size)
        super().__init__(
            policy,
            rewards or [ValueReward()],
            ToySampling(),
            grpo,
            optimizer,
            0.1,
            pipeline,
            records_per_step,
        )
        self.outputs = list(TOY_OUTPUTS)

    def generate_rollout(self, samples):
        return Generation(samples, toy_draw(TOY_FEATURES, self.outputs, self.group_size))

    def loss_mask(self, generation, keep):
        return keep

    def loss_terms(self, rollout, rows):
        logprobs = (features_of(rollout.sampled)[rows] @ self.policy.weight)[:, None]  # [n, 1]
        return grpo_loss(logprobs, logprobs.detach(), rollout.advantages[rows], rollout.loss_mask[rows, None])

    def weighted_losses(self, rollout):
        total = rollout.loss_mask.sum()
        size = self.grpo.micro_batch_size
        for start in range(0, len(rollout.loss_mask), size):
            rows = slice(start, start + size)
            yield self.loss_terms(rollout, rows), rollout.loss_mask[rows].sum() / total

    def completion_text(self, rollout, row):
        return rollout.sampled.outputs[row]


def samples() -> list[VisualSample]:
    """:class:`ToyGRPO`'s two prompts (answers "0" and "1")."""
    return [VisualSample([], f"prompt {i}", "toy", answer=str(i)) for i in range(2)]


class ToyPipelined(GRPOModule):
    """Each prompt carries its outputs' features and values (``meta``, see :func:`toy_batch`; the values are the
    rewards under :class:`ValueReward`), K = 2; one loss part over all rows. The behaviour log-probs are stored when
    :attr:`stores_behaviour_logprobs`. Logs its rollout's rows (``train/toy/rows``) and hands callbacks the features of
    the rollout it trained (``outputs["features"]``). ``pipeline`` holds the rest of :class:`PipelineSettings`."""

    sampling_settings = ToySampling

    def __init__(
        self, delay: int, rewards=None, workers="thread", records_per_step=0, gradient_clip_val=0.0, **pipeline
    ):
        super().__init__(
            LinearPolicy(),
            rewards or [ValueReward()],
            ToySampling(group_size=2),
            GRPOSettings(advantage_scale="none", gradient_clip_val=gradient_clip_val),
            None,
            0.1,
            PipelineSettings(delay=delay, workers=workers, **pipeline),
            records_per_step,
        )

    @torch.no_grad()
    def generate_rollout(self, samples):
        features = torch.cat([s.meta["features"] for s in samples])  # [N, 2]
        old = (features @ self.policy.weight)[:, None] if self.stores_behaviour_logprobs else None  # [N, 1]
        outputs = [str(v) for s in samples for v in s.meta["values"]]
        return Generation(samples, toy_draw(features, outputs, self.group_size, old))

    def loss_mask(self, generation, keep):
        return keep

    def weighted_losses(self, rollout):
        sampled = rollout.sampled
        logprobs = (features_of(sampled) @ self.policy.weight)[:, None]  # [N, 1]
        old = sampled.old_logprobs if sampled.old_logprobs is not None else logprobs.detach()
        yield grpo_loss(logprobs, old, rollout.advantages, rollout.loss_mask[:, None]), 1.0

    def completion_text(self, rollout, row):
        return ""

    def rollout_logs(self, rollout):
        return {"train/toy/rows": torch.tensor(float(len(features_of(rollout.sampled))))}

    def step_outputs(self, rollout):
        return {"features": features_of(rollout.sampled)}


TOY_REWARDS, TOY_ADVANTAGES = [1.0, 3.0, 2.0, -2.0], [-1.0, 1.0, 2.0, -2.0]  # toy_batch's, group-centred
TOY_LOGGED = {
    "train/reward/total",
    "train/loss/policy",
    "train/kl",
    "train/clip_fraction",
    "train/ratio_mean",
    "train/frac_zero_std",
    "train/nonfinite_rewards",
    "train/skipped_updates",
    "train/skipped_groups",
    "train/empty_updates",
    "train/reward/value",
    "train/toy/rows",
    "train/policy_lag",
    "train/reward_wait_s",
}
"""What a step of :class:`ToyPipelined` logs (its ``rollout_logs`` included), without clipping."""


def toy_batch(step: int) -> list[VisualSample]:
    """Two prompts ``p{step}0``, ``p{step}1`` for :class:`ToyPipelined`, two outputs each: rewards 1, 3 and 2, -2, and
    features that grow with ``step``."""
    features = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.5, -1.5], [2.0, 1.0]]) * (1 + step)
    values = [[1.0, 3.0], [2.0, -2.0]]
    return [
        VisualSample([], f"p{step}{b}", "toy", meta={"features": features[2 * b : 2 * b + 2], "values": values[b]})
        for b in range(2)
    ]


# ----------------------------------------------------------------------------------- what a trainer would give
class Recorder:
    """An optimizer or learning-rate schedule that only counts its steps."""

    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1

    def zero_grad(self, set_to_none=True):
        pass


def attach(module: GRPOModule, optimizer=None, scheduler=None) -> GRPOModule:
    """What the trainer would give a manually optimised module: its optimizer (default: plain SGD, lr 0.01), schedule
    and backward."""
    optimizer = optimizer or torch.optim.SGD(module.policy.trainable_parameters(), lr=0.01)
    module.optimizers = lambda: optimizer
    module.lr_schedulers = lambda: scheduler
    module.manual_backward = lambda loss: loss.backward()
    return module


def driver(module: GRPOModule):
    """``step(i)`` runs training step ``i`` on ``toy_batch(i)`` without a trainer (:func:`attach`'s SGD)."""
    attach(module)
    return lambda i: module.training_step(toy_batch(i), i)


class Logs:
    """Takes the place of the module's ``log_dict`` and ``log`` (there is no trainer here) and keeps every call, its
    values as floats."""

    def __init__(self, module):
        self.dicts: list[tuple[dict, dict]] = []
        self.singles: list[tuple[str, float, dict]] = []
        module.log_dict = lambda values, **kwargs: self.dicts.append(({k: float(v) for k, v in values.items()}, kwargs))
        module.log = lambda name, value, **kwargs: self.singles.append((name, float(value), kwargs))


class Clock:
    """Stands in for ``time.perf_counter`` in the GRPO skeleton: reading n (from 0, see ``readings``) is 10 ** n
    seconds, so every difference of two readings is a distinct number naming the stretch it measures."""

    def __init__(self):
        self.readings = 0

    def perf_counter(self) -> float:
        self.readings += 1
        return 10.0 ** (self.readings - 1)


def as_rank_0_of(monkeypatch, others: list) -> list:
    """``torch.distributed`` as rank 0 of ``1 + len(others)`` processes (one process cannot hold two ranks): an
    initialised group whose ``all_gather_object`` fills its output list, which must have one slot per rank, with this
    process's object and then ``others``, the objects of the other ranks. Returns the objects this process gave."""
    world_size = 1 + len(others)
    given = []

    def all_gather_object(objects: list, obj) -> None:
        assert len(objects) == world_size, "one slot per rank"
        given.append(obj)
        for rank, value in enumerate([obj, *others]):
            objects[rank] = value

    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: world_size)
    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    return given


class RednessReward(RewardComponent):
    """Mean red channel of the decoded image (``[3, H, W]`` in [0, 1])."""

    def score(self, completions, samples):
        return torch.stack([image[0].float().mean() for image in completions]).cpu()


class StandInPolicy(nn.Module):
    """A FlowPolicy-shaped stand-in: a frozen 1x1 conv plus a rank-2 adapter, prompts embedded by a frozen table."""

    is_video = False
    latent_shape = (4, 8, 8)

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng():  # the same weights for every instance
            torch.manual_seed(0)
            self.base = nn.Conv2d(4, 4, 1).requires_grad_(False)
            self.text = nn.Embedding(16, 4).requires_grad_(False)
            self.lora_A = nn.Parameter(torch.randn(2, 4) * 0.3)  # non-zero, so both get gradients
            self.lora_B = nn.Parameter(torch.randn(4, 2) * 0.3)
        self.adapter = True

    @property
    def device(self):
        return self.base.weight.device

    def sigmas(self, num_steps):
        return flow_sigmas(num_steps, shift=3.0)

    def encode_prompts(self, prompts):
        ids = torch.tensor([sum(map(ord, p)) % 16 for p in prompts], device=self.base.weight.device)
        return {"embeds": self.text(ids)}  # [B, 4]

    def condition_images(self, samples):
        return None  # text only, as FlowPolicy.condition_images for a text-to-image model

    def initial_noise(self, batch, generator=None):
        return torch.randn(batch, *self.latent_shape, generator=generator, device=self.base.weight.device)

    def velocity(self, latents, sigma, conditioning):
        h = self.base(latents) + conditioning["embeds"][:, :, None, None] * sigma[:, None, None, None]
        if self.adapter:
            h = h + torch.einsum("oc,cr,brhw->bohw", self.lora_B, self.lora_A, latents)
        return h.float()

    def decode(self, latents):
        return torch.sigmoid(latents[:, :3]).repeat_interleave(2, dim=-1).repeat_interleave(2, dim=-2)  # [B, 3, 16, 16]

    def trainable_parameters(self):
        return [self.lora_A, self.lora_B]

    uses_lora = True  # the reference is the adapter switched off
    frozen_reference = None

    def enable_reference(self):
        pass

    @contextlib.contextmanager
    def reference(self):
        self.adapter = False
        try:
            yield
        finally:
            self.adapter = True
