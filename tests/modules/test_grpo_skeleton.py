"""The GRPO skeleton both families share: scoring into group advantages, share-weighted gradient accumulation, logging
and records; and that each family supplies only what differs."""

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from app.algorithms import grpo_loss
from app.models import Policy
from app.modules import FlowGRPOModule, GRPOModule, VLMGRPOModule
from app.parallel import ShardingPlan
from app.rewards import RewardComponent
from app.rewards.groups import split_groups
from app.settings import GRPOSettings
from app.types import Generation, RewardOutput, VisualSample

K = 3


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
class Settings:
    group_size: int = K


@dataclass
class ToyRollout:
    features: torch.Tensor  # [N, 2]
    outputs: list[str]  # [N]
    rewards: RewardOutput
    advantages: torch.Tensor
    keep: torch.Tensor
    group_size: int


class ToyGRPO(GRPOModule):
    """Outputs are fixed numbers; the loss parts are rows in pairs, each weighted by its share of kept rows.
    ``settings`` overrides the skeleton's other arguments (``num_iterations``, ``pipeline``...)."""

    def __init__(self, policy, drop_zero_std_groups=False, part_size=2, rewards=None, **settings):
        defaults = dict(eps_low=0.2, eps_high=0.2, beta=0.0, num_iterations=1, advantage_scale="group",
                        gradient_clip_val=0.0, records_per_step=4, learning_rate=0.1, weight_decay=0.0,
                        warmup_steps=0)  # fmt: skip
        super().__init__(
            policy, rewards or [ValueReward()], Settings(), drop_zero_std_groups=drop_zero_std_groups,
            micro_batch_size=part_size, **(defaults | settings),
        )  # fmt: skip
        self.outputs = ["1", "2", "6", "5", "5", "5"]  # two groups of K = 3; the second has equal rewards

    def generate_rollout(self, samples):
        return Generation(samples, list(self.outputs), {"features": torch.arange(12.0).reshape(6, 2) / 10}, version=0)

    def finish_rollout(self, generation, scored):
        return ToyRollout(generation.parts["features"], generation.outputs, scored.rewards, scored.advantages,
                          scored.keep, self.group_size)  # fmt: skip

    def loss_terms(self, rollout, rows):
        logprobs = (rollout.features[rows] @ self.policy.weight)[:, None]  # [n, 1]
        return grpo_loss(logprobs, logprobs.detach(), rollout.advantages[rows], rollout.keep[rows, None])

    def weighted_losses(self, rollout):
        total = rollout.keep.sum()
        for start in range(0, 6, self.hparams.micro_batch_size):
            rows = slice(start, start + self.hparams.micro_batch_size)
            yield self.loss_terms(rollout, rows), rollout.keep[rows].sum() / total

    def completion_text(self, rollout, row):
        return rollout.outputs[row]


def samples():
    return [VisualSample([], f"prompt {i}", "toy", answer=str(i)) for i in range(2)]


class Recorder:
    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1

    def zero_grad(self, set_to_none=True):
        pass


def test_score_gives_group_advantages_and_drops_equal_groups_only_when_asked():
    module = ToyGRPO(LinearPolicy())
    scored = module.score(module.outputs, samples())
    assert scored.rewards.total.tolist() == [1, 2, 6, 5, 5, 5]
    first = torch.tensor([1.0, 2.0, 6.0])
    torch.testing.assert_close(scored.advantages[:3], (first - first.mean()) / (first.std(unbiased=False) + 1e-4))
    assert scored.advantages[3:].abs().max() == 0 and scored.keep.all()
    dropped = ToyGRPO(LinearPolicy(), grpo=GRPOSettings(drop_zero_std_groups=True)).score(module.outputs, samples())
    assert dropped.keep.tolist() == [True, True, True, False, False, False]


@pytest.mark.parametrize("part_size", [1, 2, 6])
def test_the_update_accumulates_the_full_rollout_gradient_whatever_the_parts(part_size):
    module = ToyGRPO(LinearPolicy(), part_size=part_size, grpo=GRPOSettings(drop_zero_std_groups=True))
    module.manual_backward = lambda loss: loss.backward()
    rollout = module.rollout(samples())
    optimizer = Recorder()
    stats = module._update(rollout, optimizer)
    expected_policy = LinearPolicy()
    logprobs = (rollout.features @ expected_policy.weight)[:, None]
    full = grpo_loss(logprobs, logprobs.detach(), rollout.advantages, rollout.keep[:, None])
    full.loss.backward()
    torch.testing.assert_close(module.policy.weight.grad, expected_policy.weight.grad)
    torch.testing.assert_close(stats["loss"], full.loss.detach())
    assert stats["ratio_mean"] == pytest.approx(1.0) and optimizer.steps == 1
    assert "grad_norm" not in stats  # gradient_clip_val = 0 disables clipping


class GroupMean(ValueReward):
    """A reward that compares the outputs of a group (so it is handed K): each output scores its group's mean."""

    scope = "group_pair"

    def score(self, completions, samples, group_size=None):
        values = super().score(completions, samples)
        return torch.cat(
            [values[rows].mean().expand(rows.stop - rows.start) for rows in split_groups(samples, group_size)]
        )


def test_score_hands_the_rewards_k_so_a_prompt_drawn_twice_makes_two_groups():
    module = ToyGRPO(LinearPolicy(), rewards=[GroupMean(name="group_mean")])
    prompt = VisualSample([], "prompt", "toy", answer="5")
    scored = module.score(module.outputs, [prompt, prompt])  # without K the six rows would read as one group
    assert scored.rewards.components["group_mean"].tolist() == [3.0, 3.0, 3.0, 5.0, 5.0, 5.0]


def test_records_show_each_output_with_its_prompt_reward_and_advantage():
    module = ToyGRPO(LinearPolicy())
    rollout = module.rollout(samples())
    module.outputs = ["drawn later"] * 6  # the records show the rollout's own outputs
    module._trainer = SimpleNamespace(global_step=7)
    records = module._records(samples(), rollout)
    assert len(records) == 4  # records_per_step
    assert [r.step for r in records] == [7] * 4
    assert [r.completion for r in records] == ["1", "2", "6", "5"]
    assert [r.question for r in records] == ["prompt 0"] * 3 + ["prompt 1"]
    assert [(r.task, r.answer) for r in records] == [("toy", "0")] * 3 + [("toy", "1")]
    assert [r.reward for r in records] == [1.0, 2.0, 6.0, 5.0]
    assert records[2].advantage == pytest.approx(float(rollout.advantages[2]))
    assert records[0].components == {"value": 1.0}


def test_hyper_parameters_hold_the_whole_chain_and_the_sampling_settings_as_data():
    module = ToyGRPO(LinearPolicy(), part_size=2)
    assert module.hparams.micro_batch_size == 2 and module.hparams.learning_rate == 0.1
    assert module.hparams.sampling == {"group_size": K}
    assert "policy" not in module.hparams and "rewards" not in module.hparams
    assert module.group_size == K


def test_the_skeleton_refuses_bad_iteration_and_micro_batch_settings():
    with pytest.raises(ValueError, match="num_iterations must be >= 1"):
        GRPOModule(LinearPolicy(), [ValueReward()], Settings(), 0.2, 0.2, 0.0, 0, "group", False, None, 1.0, 4, 0.1,
                   0.0, 0)  # fmt: skip
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        GRPOModule(LinearPolicy(), [ValueReward()], Settings(), 0.2, 0.2, 0.0, 1, "group", False, 0, 1.0, 4, 0.1,
                   0.0, 0)  # fmt: skip


SKELETON = ("training_step", "_update", "_log_step", "_records", "score", "configure_optimizers")


@pytest.mark.parametrize("family", [VLMGRPOModule, FlowGRPOModule])
def test_each_family_supplies_only_what_differs(family):
    assert issubclass(family, GRPOModule)
    assert not set(SKELETON) & set(vars(family)), "a family re-implements part of the shared skeleton"
    for hook in ("generate_rollout", "finish_rollout", "weighted_losses", "completion_text"):
        assert hook in vars(family), hook


def test_both_policies_satisfy_the_policy_protocol():
    from app.models import FlowPolicy, VLMPolicy
    from app.settings import LoRASettings

    assert isinstance(LinearPolicy(), Policy)
    assert isinstance(VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=2, alpha=4)), Policy)
    assert isinstance(FlowPolicy("tiny-sd3", lora=LoRASettings(r=2, alpha=4)), Policy)


def test_only_trainable_modules_left_in_eval_mode_are_warned_about(caplog):
    module = ToyGRPO(LinearPolicy())
    module.frozen_part = nn.Linear(2, 2).requires_grad_(False).eval()  # frozen and in eval mode on purpose
    with caplog.at_level("WARNING", logger="app.modules.policy_module"):
        module.on_train_start()
    assert not caplog.records
    module.policy.eval()  # the policy holds the trainable weight
    with caplog.at_level("WARNING", logger="app.modules.policy_module"):
        module.on_train_start()
    assert "1 module(s) with trainable parameters are in eval mode at the start of training" in caplog.text
    assert "policy" in caplog.text


def test_the_warning_names_up_to_three_stray_modules_and_never_a_container_for_its_childrens_weights(caplog):
    module = ToyGRPO(LinearPolicy())
    module.extra = nn.Sequential(*[nn.Linear(2, 2) for _ in range(4)]).eval()  # four trainable layers in eval mode
    with caplog.at_level("WARNING", logger="app.modules.policy_module"):
        module.on_train_start()
    assert [r.getMessage() for r in caplog.records] == [
        "4 module(s) with trainable parameters are in eval mode at the start of training (dropout and normalisation "
        "statistics act as in evaluation): extra.0, extra.1, extra.2, ..."
    ]
    caplog.clear()
    module.extra.train()
    module.extra.training = False  # the container alone in eval mode: it holds no parameter of its own
    module.extra[1].eval()
    with caplog.at_level("WARNING", logger="app.modules.policy_module"):
        module.on_train_start()
    assert [r.getMessage().rsplit(": ", 1)[1] for r in caplog.records] == ["extra.1"]
    caplog.clear()
    for layer in (0, 2):  # exactly three in eval mode: all named, nothing left to elide
        module.extra[layer].eval()
    with caplog.at_level("WARNING", logger="app.modules.policy_module"):
        module.on_train_start()
    assert [r.getMessage().rsplit(": ", 1)[1] for r in caplog.records] == ["extra.0, extra.1, extra.2"]
