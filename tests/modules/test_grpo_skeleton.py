"""The GRPO skeleton both families share (app.modules.grpo), called directly on toy modules (no trainer): scoring into
group advantages, share-weighted gradient accumulation, the updates a step makes, the exact values and flags it logs,
the seconds it reports per phase, records, train end and the checks on rewards and gradients; and that each family
supplies only what differs."""

import dataclasses
import logging
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import SimpleNamespace

import pytest
import torch
from doubles import (
    TOY_ADVANTAGES,
    TOY_LOGGED,
    TOY_OUTPUTS,
    TOY_REWARDS,
    K,
    LinearPolicy,
    Logs,
    Recorder,
    ToyGRPO,
    ToyPipelined,
    ValueReward,
    attach,
    driver,
    features_of,
    samples,
    toy_batch,
)
from torch import nn

from app.algorithms import group_advantages, grpo_loss
from app.models import Policy
from app.modules import FlowGRPOModule, FlowNFTModule, GRPOModule, NonFiniteTrainingError, VLMGRPOModule
from app.rewards import PendingRewards, RewardError
from app.rewards.base import PartialScores
from app.rewards.groups import split_groups
from app.settings import GRPOSettings, OptimizerSettings, PipelineSettings
from app.types import Generation, RewardOutput, VisualSample


# ------------------------------------------------------------------------------------------------ scoring
def test_score_gives_group_advantages_and_drops_equal_groups_only_when_asked():
    module = ToyGRPO(LinearPolicy())
    scored = module.score(module.outputs, samples())
    assert scored.rewards.total.tolist() == [1, 2, 6, 5, 5, 5]
    first = torch.tensor([1.0, 2.0, 6.0])
    torch.testing.assert_close(scored.advantages[:3], (first - first.mean()) / (first.std(unbiased=False) + 1e-4))
    assert scored.advantages[3:].abs().max() == 0 and scored.keep.all()
    dropped = ToyGRPO(LinearPolicy(), grpo=GRPOSettings(drop_zero_std_groups=True)).score(module.outputs, samples())
    assert dropped.keep.tolist() == [True, True, True, False, False, False]


class SkipsFirstGroup(ValueReward):
    """The completion values, but the rows of the first group left unscored (a remote reward whose request failed)."""

    def score(self, completions, samples):
        unscored = torch.zeros(len(completions), dtype=torch.bool)
        unscored[:K] = True
        return PartialScores(super().score(completions, samples), unscored)


def test_a_group_a_reward_could_not_score_is_left_out_of_the_update_counted_and_logged(caplog):
    module = ToyGRPO(LinearPolicy(), rewards=[SkipsFirstGroup(name="value"), ValueReward(name="other")])
    with caplog.at_level(logging.WARNING, logger="app.modules.grpo"):
        scored = module.score(module.outputs, samples())
    assert scored.rewards.unscored.tolist() == [True] * K + [False] * K
    assert scored.keep.tolist() == [False] * K + [True] * K and scored.advantages[:K].abs().max() == 0
    assert scored.rewards.components["value"][:K].tolist() == [0.0] * K  # placeholders, in no loss and no mean
    assert module.skipped_groups == 1 and "1 of 2 groups left out of this update" in caplog.text
    rollout = module.finish_rollout(Generation(samples(), None), scored)
    logs = Logs(module)
    stats = {term: torch.tensor(0.0) for term in ("policy_loss", "kl", "clip_fraction", "ratio_mean")}
    module._log_step(rollout, stats, batch_size=2)
    ((logged, _),) = logs.dicts
    assert logged["train/skipped_groups"] == 1.0
    assert logged["train/reward/value"] == logged["train/reward/other"] == 5.0  # the scored group's 5, 5, 5 only
    assert logged["train/reward/total"] == 10.0


def test_a_rollout_no_reward_could_score_updates_nothing():
    class SkipsAll(ValueReward):
        def score(self, completions, samples):
            return PartialScores(super().score(completions, samples), torch.ones(len(completions), dtype=torch.bool))

    module = ToyGRPO(LinearPolicy(), rewards=[SkipsAll()])
    attach(module)
    logs = Logs(module)
    before = module.policy.weight.detach().clone()
    module.training_step(samples(), 0)
    assert torch.equal(module.policy.weight, before) and module.skipped_groups == 2
    assert module.empty_updates == 1 and not module.optimizers().state  # no optimizer step: AdamW's state is empty
    ((logged, _),) = logs.dicts
    assert logged["train/skipped_groups"] == 2.0 and logged["train/empty_updates"] == 1.0
    assert not any(key.startswith("train/reward/") for key in logged)


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


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_scored_advantages_follow_the_module_s_advantage_scale(scale):
    module = ToyGRPO(LinearPolicy(), grpo=GRPOSettings(advantage_scale=scale))
    total = torch.tensor([1.0, 2.0, 6.0, 5.0, 5.0, 4.0])
    expected = group_advantages(total, 3, scale=scale)
    assert not torch.equal(expected, group_advantages(total, 3, scale="group"))  # the scale matters for these rewards
    assert torch.equal(module._scored(RewardOutput(total, {"value": total}), samples()).advantages, expected)


def test_global_scale_in_one_process_is_the_batch_scale():
    module = ToyGRPO(LinearPolicy(), grpo=GRPOSettings(advantage_scale="global"))
    total = torch.tensor([1.0, 2.0, 6.0, 5.0, 5.0, 4.0])
    expected = group_advantages(total, 3, scale="batch")
    torch.testing.assert_close(module._scored(RewardOutput(total, {"value": total}), samples()).advantages, expected)


def test_per_prompt_scale_uses_each_prompt_s_history_and_it_resumes_from_a_checkpoint():
    grpo = GRPOSettings(advantage_scale="per_prompt", prompt_history=6)
    module = ToyGRPO(LinearPolicy(), grpo=grpo)
    first, second = torch.tensor([1.0, 2.0, 6.0, 5.0, 5.0, 4.0]), torch.tensor([2.0, 2.0, 2.0, 7.0, 5.0, 6.0])
    module._scored(RewardOutput(first, {"value": first}), samples())
    state = module.rank_state()
    got = module._scored(RewardOutput(second, {"value": second}), samples()).advantages
    for b in range(2):  # each prompt against its own 6 rewards: the first step's 3 and this step's 3
        history = torch.cat([first[3 * b : 3 * b + 3], second[3 * b : 3 * b + 3]]).double()
        want = (second[3 * b : 3 * b + 3].double() - history.mean()) / (history.std(unbiased=False) + 1e-4)
        torch.testing.assert_close(got[3 * b : 3 * b + 3].double(), want, rtol=1e-6, atol=1e-6)
    assert got[:3].abs().min() > 0  # equal rewards, but below what the prompt got before: a signal
    resumed = ToyGRPO(LinearPolicy(), grpo=grpo)
    resumed.load_rank_state(state, fresh_seed=None)
    again = resumed._scored(RewardOutput(second, {"value": second}), samples()).advantages
    assert torch.equal(again, got)


# ------------------------------------------------------------------------------------------------ the update
@pytest.mark.parametrize("part_size", [1, 2, 6])
def test_the_update_accumulates_the_full_rollout_gradient_whatever_the_parts(part_size):
    grpo = GRPOSettings(drop_zero_std_groups=True, gradient_clip_val=0.0)
    module = ToyGRPO(LinearPolicy(), part_size=part_size, grpo=grpo)
    module.manual_backward = lambda loss: loss.backward()
    rollout = module.rollout(samples())
    optimizer = Recorder()
    stats = module._update([rollout], optimizer)
    expected_policy = LinearPolicy()
    logprobs = (features_of(rollout.sampled) @ expected_policy.weight)[:, None]
    full = grpo_loss(logprobs, logprobs.detach(), rollout.advantages, rollout.loss_mask[:, None])
    full.loss.backward()
    torch.testing.assert_close(module.policy.weight.grad, expected_policy.weight.grad)
    torch.testing.assert_close(stats["loss"], full.loss.detach())
    assert stats["ratio_mean"] == pytest.approx(1.0) and optimizer.steps == 1
    assert "grad_norm" not in stats  # gradient_clip_val = 0 disables clipping


def test_each_of_the_num_iterations_updates_steps_the_optimizer_and_the_learning_rate_schedule():
    module = ToyGRPO(LinearPolicy(), grpo=GRPOSettings(num_iterations=3))
    attach(module, optimizer := Recorder(), scheduler := Recorder())
    stats = module._train_on([module.rollout(samples())])
    assert (optimizer.steps, scheduler.steps) == (3, 3)
    assert stats["skipped"] is False and module.skipped_updates == 0


def test_a_skipped_update_leaves_the_learning_rate_schedule_where_it_was():
    module = attach(ToyGRPO(LinearPolicy()), optimizer := Recorder(), scheduler := Recorder())
    rollout = module.rollout(samples())
    with torch.no_grad():
        module.policy.weight.fill_(float("nan"))  # a non-finite loss and gradient
    stats = module._train_on([rollout])
    assert stats["skipped"] is True and module.skipped_updates == 1
    # one step of the optimizer without gradients (idle_step: the trainer counts it, nothing moves), none of the
    # schedule
    assert (optimizer.steps, scheduler.steps) == (1, 0)


def test_an_update_leaves_no_gradient_behind():
    """Gradients are released after each step (``set_to_none``), taken or skipped, so the next update starts from none
    and the memory is free while the next rollout is generated."""
    module = attach(ToyGRPO(LinearPolicy()))
    rollout = module.rollout(samples())
    assert module._update([rollout], module.optimizers())["skipped"] is False
    assert module.policy.weight.grad is None
    with torch.no_grad():
        module.policy.weight.fill_(float("nan"))
    assert module._update([rollout], module.optimizers())["skipped"] is True
    assert module.policy.weight.grad is None


def test_without_a_schedule_the_update_still_steps_the_optimizer():
    module = attach(ToyGRPO(LinearPolicy()), optimizer := Recorder(), scheduler=None)
    assert module._train_on([module.rollout(samples())])["skipped"] is False
    assert optimizer.steps == 1


def test_an_update_over_several_rollouts_weighs_each_by_its_share_of_the_loss_mass():
    """The skeleton's loss mass is a rollout's kept rows (``loss_mask.sum()``)."""
    module = attach(ToyGRPO(LinearPolicy()), optimizer=Recorder())  # no step: the gradients stay to be read
    whole = module.rollout(samples())  # 6 kept rows
    keep = whole.loss_mask.clone()
    keep[3:] = False
    half = dataclasses.replace(whole, loss_mask=keep)  # 3 kept rows: the first group only

    def gradient(rollouts):
        module.policy.weight.grad = None
        module._update(rollouts, Recorder())
        return module.policy.weight.grad.clone()

    expected = 6 / 9 * gradient([whole]) + 3 / 9 * gradient([half])
    assert torch.allclose(gradient([whole, half]), expected, atol=1e-7)
    assert not torch.allclose(gradient([whole, half]), 0.5 * gradient([whole]) + 0.5 * gradient([half]), atol=1e-7)


def test_with_clipping_off_a_non_finite_gradient_under_a_finite_loss_still_skips_the_update():
    module = attach(ToyGRPO(LinearPolicy(), grpo=GRPOSettings(gradient_clip_val=0.0)))
    rollout = module.rollout(samples())
    before = module.policy.weight.detach().clone()
    module.policy.weight.register_hook(lambda grad: grad * float("inf"))  # the loss stays finite
    stats = module._update([rollout], module.optimizers())
    assert torch.isfinite(stats["loss"]) and "grad_norm" not in stats
    assert stats["skipped"] is True and module.skipped_updates == 1
    assert torch.equal(module.policy.weight, before) and module.policy.weight.grad is None


# ------------------------------------------------------------------------------------------------ the logs
STATS = {"loss": 0.375, "policy_loss": 0.25, "kl": 0.5, "clip_fraction": 0.125, "ratio_mean": 1.5}
TWO_REWARDS = SimpleNamespace(  # two groups of K = 2, the second of equal totals; weights 2 (accuracy) and 1 (format)
    rewards=RewardOutput(
        torch.tensor([2.0, 1.0, 2.0, 2.0]),
        {"accuracy": torch.tensor([1.0, 0.0, 1.0, 1.0]), "format": torch.tensor([0.0, 1.0, 0.0, 0.0])},
    ),
    rows_per_prompt=2,
)
LOGGED = {
    "train/reward/total": 1.75,  # the mean over every row, the group of equal rewards included
    "train/loss/policy": 0.25,
    "train/kl": 0.5,
    "train/clip_fraction": 0.125,
    "train/ratio_mean": 1.5,
    "train/frac_zero_std": 0.5,
    "train/nonfinite_rewards": 3.0,
    "train/skipped_updates": 2.0,
    "train/skipped_groups": 0.0,
    "train/empty_updates": 0.0,
    "train/reward/accuracy": 0.75,  # each component unweighted
    "train/reward/format": 0.25,
}


def logged_step(module, stats: dict, **kwargs) -> Logs:
    logs = Logs(module)
    module.rewards.num_nonfinite, module.skipped_updates = 3, 2
    module._log_step(TWO_REWARDS, {k: torch.tensor(v) for k, v in stats.items()}, batch_size=2, **kwargs)
    return logs


def test_the_step_logs_each_reward_its_loss_terms_and_its_faults_and_shows_the_mean_reward_in_the_progress_bar():
    logs = logged_step(ToyGRPO(LinearPolicy()), STATS, extra={"train/policy_lag": torch.tensor(1.0)})
    assert logs.dicts == [(LOGGED | {"train/policy_lag": 1.0}, {"batch_size": 2})]
    assert logs.singles == [("reward", 1.75, {"prog_bar": True, "logger": False, "batch_size": 2})]


def test_the_gradient_norm_is_logged_when_the_update_clipped():
    logs = logged_step(ToyGRPO(LinearPolicy()), STATS | {"grad_norm": 4.0})
    assert logs.dicts == [(LOGGED | {"train/grad_norm": 4.0}, {"batch_size": 2})]


def test_statistics_the_loss_does_not_have_are_left_out_of_the_logs():
    """A loss without a likelihood ratio (DiffusionNFT) has no ratio or clip fraction to log."""
    stats = {k: v for k, v in STATS.items() if k not in ("ratio_mean", "clip_fraction")}
    logs = logged_step(ToyGRPO(LinearPolicy()), stats)
    ((values, _),) = logs.dicts
    assert values == {k: v for k, v in LOGGED.items() if k not in ("train/ratio_mean", "train/clip_fraction")}


def test_logged_values_are_moved_to_the_module_s_device():
    """The meta device stands in for an accelerator: values computed on the host are moved there too."""
    module = ToyGRPO(LinearPolicy())
    logged = []
    module.log_dict = lambda values, **kwargs: logged.append(values)
    module.log = lambda name, value, **kwargs: logged.append({name: value})
    module._device = torch.device("meta")
    module._log_step(TWO_REWARDS, {k: torch.tensor(v) for k, v in STATS.items()}, batch_size=2)
    assert [{value.device.type for value in values.values()} for values in logged] == [{"meta"}, {"meta"}]


class NoRatio(ToyPipelined):
    """A loss that never materialises the ratio (as a fused one): its output has no ``ratio_mean``."""

    def weighted_losses(self, rollout):
        for out, share in super().weighted_losses(rollout):
            yield dataclasses.replace(out, ratio_mean=None), share


def test_the_step_logs_the_gradient_norm_when_clipping_and_leaves_out_terms_the_loss_cannot_compute():
    module = NoRatio(delay=0, gradient_clip_val=100.0)
    logs = Logs(module)
    driver(module)(0)
    ((values, _),) = logs.dicts
    assert set(values) == TOY_LOGGED - {"train/ratio_mean"} | {"train/grad_norm"}
    f0 = torch.cat([s.meta["features"] for s in toy_batch(0)])
    gradient = -(torch.tensor(TOY_ADVANTAGES)[:, None] * f0).mean(dim=0)  # ratio 1: d(-mean(A * ratio)) / dw
    assert values["train/grad_norm"] == pytest.approx(float(torch.linalg.vector_norm(gradient)))


def test_a_rollout_s_own_logs_are_moved_to_the_module_s_device_with_the_rest():
    """The meta device stands in for an accelerator: the family's ``rollout_logs`` are moved there too."""
    module = ToyPipelined(delay=0)
    logged = []
    module.log_dict = lambda values, **kwargs: logged.append(values)
    module.log = lambda name, value, **kwargs: None
    rollout = module.rollout(toy_batch(0))
    stats = {key: torch.tensor(0.5) for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")}
    module._device = torch.device("meta")
    module._log_step(rollout, stats, batch_size=2)
    (values,) = logged
    assert set(values) == TOY_LOGGED - {"train/policy_lag", "train/reward_wait_s"}
    assert {value.device.type for value in values.values()} == {"meta"}


# ------------------------------------------------------------------------------------------------ the step
def test_a_plain_step_trains_logs_and_splits_its_seconds_between_rollout_reward_and_update(clock):
    """Readings: 0 the step starts, 1 rolled out, 2 rewards collected (scored inline), 3 refilled (nothing to refill),
    4 updated. A plain step (delay 0) logs and returns a policy lag of 0."""
    module = attach(ToyGRPO(LinearPolicy()))
    logs = Logs(module)
    before = module.policy.weight.detach().clone()
    out = module.training_step(batch(0), 0)
    assert out["timings"] == {"rollout": 9.0, "reward": 90.0, "update": 9000.0}
    assert not torch.equal(module.policy.weight.detach(), before)
    assert out["rewards"].total.tolist() == [1.0, 2.0, 6.0, 5.0, 5.0, 5.0]
    assert torch.equal(out["advantages"], group_advantages(out["rewards"].total, 3, scale="group"))
    records = [(r.question, r.completion) for r in out["records"]]
    assert records == [("p00", "1"), ("p00", "2"), ("p00", "6"), ("p01", "5")]
    assert out["policy_lag"] == 0
    ((values, kwargs),) = logs.dicts
    assert kwargs == {"batch_size": 2}  # the step's prompts
    assert values["train/reward/total"] == 4.0 and values["train/frac_zero_std"] == 0.5
    assert values["train/policy_lag"] == 0.0 and values["train/reward_wait_s"] == 90.0
    assert values["train/loss/policy"] == float(out["loss"])  # beta 0: the loss is the policy loss
    assert logs.singles == [("reward", 4.0, {"prog_bar": True, "logger": False, "batch_size": 2})]


class TimedValue(ValueReward):
    """Reads the skeleton's clock while it scores, as a reward that takes time would."""

    def __init__(self, clock, **kwargs):
        super().__init__(**kwargs)
        self.clock = clock

    def score(self, completions, samples):
        self.clock.perf_counter()
        return super().score(completions, samples)


def test_the_reward_seconds_of_a_plain_step_are_those_of_its_inline_scoring(clock):
    """Readings: 0 the step starts, 1 rolled out, 2 while the reward scores, 3 collected, 4 refilled, 5 updated."""
    module = attach(ToyGRPO(LinearPolicy(), rewards=[TimedValue(clock)]))
    out = module.training_step(batch(0), 0)
    assert out["timings"] == {"rollout": 9.0, "reward": 1000.0 - 10.0, "update": 1e5 - 1e4}


def test_the_reward_time_of_a_step_adds_up_every_scoring_of_its_rollout(clock):
    """Two rewards, each read the clock: readings 0 the step starts, 1 rolled out, 2 and 3 while they score, 4
    collected, 5 refilled, 6 updated."""
    module = ToyPipelined(delay=0, rewards=[TimedValue(clock, name="a"), TimedValue(clock, name="b")])
    out = driver(module)(0)
    assert out["rewards"].total.tolist() == [2 * r for r in TOY_REWARDS]
    assert out["timings"] == {"rollout": 9.0, "reward": 1e4 - 10.0, "update": 1e6 - 1e5}


def test_a_delayed_step_trains_the_rollout_of_the_step_before():
    module = attach(ToyGRPO(LinearPolicy(), pipeline=PipelineSettings(delay=1, workers="inline")))
    Logs(module)
    assert module.training_step(batch(0), 0) is None  # primes the pipeline
    out = module.training_step(batch(1), 1)
    assert out["policy_lag"] == 0
    assert [r.question for r in out["records"]] == ["p00"] * 3 + ["p01"]


def batch(step: int) -> list[VisualSample]:
    return [VisualSample([], f"p{step}{b}", "toy", answer=str(b)) for b in range(2)]


class Unfinished(Future):
    """A reward still being scored: waiting for it gives up at once, whatever the time limit."""

    def result(self, timeout=None):
        raise FutureTimeoutError


def pending_generation(module: ToyGRPO, rewards: PendingRewards) -> Generation:
    """The toy's rollout of :func:`samples`, its rewards still being scored."""
    return Generation(samples(), module.generate_rollout(samples()).sampled, version=0, rewards=rewards)


def test_a_checkpoint_waits_for_pending_rewards_no_longer_than_the_pipeline_s_time_limit():
    module = ToyGRPO(LinearPolicy(), pipeline=PipelineSettings(delay=1, workers="inline", reward_timeout_s=0.05))
    pending = PendingRewards({"value": Unfinished()}, num_completions=6)
    module.rollout_queue.pending.append(pending_generation(module, pending))
    with pytest.raises(RewardError, match=re.escape("reward 'value' gave no result within 0.05 s")):
        module.on_save_checkpoint({})


def test_train_end_drops_counts_and_logs_the_pending_rollout_and_stops_its_own_workers_without_waiting(caplog):
    """The rule for the last rollout: dropped (its queued rewards cancelled), added to the count, logged; the module's
    own reward workers are shut down at once, a reward still running is not waited for."""
    module = ToyGRPO(LinearPolicy(), pipeline=PipelineSettings(delay=1))
    module.rollout_queue.dropped = 2  # from the epochs before
    workers, release = ThreadPoolExecutor(1), threading.Event()
    running = workers.submit(release.wait, 2.0)  # holds the only worker
    queued = workers.submit(int)  # a reward of no pending rollout, still queued
    pending_reward = workers.submit(int)
    pending = PendingRewards({"value": pending_reward}, num_completions=6)
    queue = module.rollout_queue
    queue.pending.append(pending_generation(module, pending))
    queue.executor = queue.built_executor = workers  # as if built by the queue
    try:
        with caplog.at_level(logging.INFO, logger="app.modules.rollout_queue"):
            module.on_train_end()
        returned_while_running = not running.done()
    finally:
        release.set()
    assert returned_while_running  # shutdown(wait=False)
    assert pending_reward.cancelled() and queued.cancelled()  # the pending rollout's and every other queued reward
    assert module.dropped_rollouts == 3 and len(queue.pending) == 0
    assert module.reward_executor is None and queue.built_executor is None
    assert [r.getMessage() for r in caplog.records] == [
        "rollout pipeline: 1 generated rollout(s) left untrained at the end of fit"
    ]


# ------------------------------------------------------------------------------------------------ records
def test_records_show_each_output_with_its_prompt_reward_and_advantage():
    module = ToyGRPO(LinearPolicy())
    rollout = module.rollout(samples())
    module.outputs = ["drawn later"] * 6  # the records show the rollout's own outputs
    module._trainer = SimpleNamespace(global_step=7)
    records = module._records(rollout)
    assert len(records) == 4  # records_per_step
    assert [r.step for r in records] == [7] * 4
    assert [r.completion for r in records] == ["1", "2", "6", "5"]
    assert [r.question for r in records] == ["prompt 0"] * 3 + ["prompt 1"]
    assert [(r.task, r.answer) for r in records] == [("toy", "0")] * 3 + [("toy", "1")]
    assert [r.reward for r in records] == [1.0, 2.0, 6.0, 5.0]
    assert records[2].advantage == pytest.approx(float(rollout.advantages[2]))
    assert records[0].components == {"value": 1.0}


# ------------------------------------------------------------------------------------------ non-finite rewards
def nan_rewards(rows: int, components: int, nonfinite: int) -> RewardOutput:
    """Rewards of ``rows`` completions whose components returned ``nonfinite`` NaNs (replaced by 0)."""
    names = [f"r{i}" for i in range(components)]
    return RewardOutput(torch.zeros(rows), {name: torch.zeros(rows) for name in names}, num_nonfinite=nonfinite)


def module_with(components: int, group_size: int = 3, max_nonfinite_steps: int = 1):
    rewards = [ValueReward(name=f"r{i}") for i in range(components)]
    optimizer = OptimizerSettings(max_nonfinite_steps=max_nonfinite_steps)
    module = ToyGRPO(LinearPolicy(), rewards=rewards, optimizer=optimizer)
    module.sampling.group_size = group_size
    return module


def test_a_rollout_stops_training_only_when_every_value_of_every_reward_was_non_finite():
    module = module_with(components=2)
    module._scored(nan_rewards(rows=6, components=2, nonfinite=6))  # one reward of two broken: training goes on
    module._scored(nan_rewards(rows=6, components=2, nonfinite=11))
    with pytest.raises(NonFiniteTrainingError, match="every reward was non-finite .* in 1 consecutive rollouts"):
        module._scored(nan_rewards(rows=6, components=2, nonfinite=12))


@pytest.mark.filterwarnings("ignore:std:UserWarning")  # the empty rollout's advantages
def test_a_single_completion_whose_rewards_are_all_non_finite_counts_an_empty_rollout_does_not():
    module_with(components=1, group_size=1)._scored(nan_rewards(rows=0, components=1, nonfinite=0))
    with pytest.raises(NonFiniteTrainingError, match="in 1 consecutive rollouts"):
        module_with(components=1, group_size=1)._scored(nan_rewards(rows=1, components=1, nonfinite=1))


def test_a_rollout_with_a_finite_reward_resets_the_count_of_consecutive_non_finite_ones():
    module = module_with(components=1, max_nonfinite_steps=2)
    broken, fine = nan_rewards(rows=6, components=1, nonfinite=6), nan_rewards(rows=6, components=1, nonfinite=0)
    for rewards in (broken, fine, broken):  # never two broken rollouts in a row
        module._scored(rewards)
    assert module._consecutive_nonfinite_rewards == 1
    with pytest.raises(NonFiniteTrainingError, match="in 2 consecutive rollouts"):
        module._scored(broken)


@pytest.mark.filterwarnings("ignore:reward .r[01]. returned:RuntimeWarning")  # the NaNs are the point
def test_the_stop_for_non_finite_rewards_names_each_reward_s_count_of_non_finite_values():
    module = module_with(components=2)
    module.outputs = ["nan", "1", "nan", "nan", "nan", "nan"]  # every value non-finite but r0's and r1's second
    module._scored(module.rewards(module.outputs, [s for s in samples() for _ in range(3)], group_size=3))
    module.outputs = ["nan"] * 6
    message = "non-finite values per reward so far: {'r0': 11, 'r1': 11}"
    with pytest.raises(NonFiniteTrainingError, match=re.escape(message)):
        module.rollout(samples())


# ------------------------------------------------------------------------------------------------ the module
def test_hyper_parameters_hold_the_whole_chain_and_the_sampling_settings_as_data():
    module = ToyGRPO(LinearPolicy(), part_size=2)
    assert module.hparams["grpo"]["micro_batch_size"] == 2 and module.hparams["optimizer"]["learning_rate"] == 0.1
    assert module.hparams["sampling"] == {"group_size": K}
    assert "policy" not in module.hparams and "rewards" not in module.hparams
    assert module.group_size == K
    assert module.outputs == TOY_OUTPUTS


def test_hyper_parameters_hold_the_pipeline_and_records_per_step_given():
    pipeline = PipelineSettings(delay=1, workers="inline", max_extra_rollouts=2)
    module = ToyGRPO(LinearPolicy(), pipeline=pipeline, records_per_step=5)
    assert module.hparams["pipeline"] == dataclasses.asdict(pipeline) and module.pipeline == pipeline
    assert module.hparams["records_per_step"] == module.records_per_step == 5


class ReferenceCounting(LinearPolicy):
    """Counts the calls that make it keep a reference (a frozen copy of the weights under full fine-tuning)."""

    def __init__(self):
        super().__init__()
        self.references = 0

    def enable_reference(self):
        self.references += 1


@pytest.mark.parametrize(("beta", "references"), [(0.0, 0), (0.1, 1)])
def test_the_policy_keeps_a_reference_only_for_a_kl_term(beta, references):
    policy = ReferenceCounting()
    ToyGRPO(policy, grpo=GRPOSettings(beta=beta, gradient_clip_val=0.0))
    assert policy.references == references


SKELETON = (
    "training_step",
    "rollout",
    "finish_rollout",
    "_update",
    "_log_step",
    "_records",
    "score",
    "configure_optimizers",
)


def _family_layers(family: type) -> list[type]:
    """The classes between a family and the shared skeleton: the family itself and the parts it shares with its
    siblings (``FlowRLModule`` for the two flow objectives), not ``GRPOModule`` or what it builds on."""
    return [cls for cls in family.__mro__ if issubclass(cls, GRPOModule) and cls is not GRPOModule]


@pytest.mark.parametrize("family", [VLMGRPOModule, FlowGRPOModule, FlowNFTModule])
def test_each_family_supplies_only_what_differs(family):
    assert issubclass(family, GRPOModule)
    layers = _family_layers(family)
    for layer in layers:
        assert not set(SKELETON) & set(vars(layer)), f"{layer.__name__} re-implements part of the shared skeleton"
    for hook in ("generate_rollout", "loss_mask", "weighted_losses", "completion_text"):
        assert any(hook in vars(layer) for layer in layers), hook


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


# ---------------------------------------------------------------------------------- groups spread over ranks
class SpreadToy(ToyGRPO):
    """A toy whose sampler could draw a rank's part of a group."""

    spreads_groups = True


class PairReward(ValueReward):
    """A reward that compares the rows of a group with its twin's (as the consistency rewards do)."""

    scope = "group_pair"


@pytest.mark.parametrize(
    ("family", "grpo", "kwargs", "message"),
    [
        (ToyGRPO, GRPOSettings(group_ranks=3), {}, "is for the flow family"),
        (SpreadToy, GRPOSettings(group_ranks=2), {}, "group_ranks 2 must divide sampling.group_size 3"),
        (
            SpreadToy,
            GRPOSettings(group_ranks=3),
            {"rewards": [PairReward()]},
            "but pair compare the outputs of a group",
        ),
        (
            SpreadToy,
            GRPOSettings(group_ranks=3),
            {"pipeline": PipelineSettings(dynamic_sampling=True)},
            "pipeline.dynamic_sampling refills each rank",
        ),
    ],
)
def test_what_a_group_spread_over_ranks_cannot_do_is_refused_by_name(family, grpo, kwargs, message):
    with pytest.raises(ValueError, match=message):
        family(LinearPolicy(), grpo=grpo, **kwargs)


def test_a_served_reward_that_compares_a_group_s_outputs_is_refused_too():
    from app.rewards import RemoteReward  # noqa: PLC0415
    from app.rewards.serve import RewardServer  # noqa: PLC0415

    with RewardServer([PairReward()]) as server:
        served = RemoteReward(server.url, "pair", name="judge", retries=0)
        with pytest.raises(ValueError, match="but judge compare the outputs of a group"):
            SpreadToy(LinearPolicy(), grpo=GRPOSettings(group_ranks=3), rewards=[served])


def test_a_group_on_one_rank_has_no_share_and_all_its_rows_here():
    module = SpreadToy(LinearPolicy(), grpo=GRPOSettings(group_ranks=3))
    assert module.group_share.rows_per_prompt == 1 and module.rows_per_prompt == 1 and module.ranks_per_group == 3
    alone = ToyGRPO(LinearPolicy())
    assert alone.group_share is None and alone.rows_per_prompt == alone.group_size
