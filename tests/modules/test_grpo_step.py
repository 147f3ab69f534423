"""One GRPO training step of the skeleton, called directly on the toy module (no trainer): the updates it makes, the
exact values and flags it logs, the seconds it reports per phase, and the pipelined step's collection of rewards."""

import re
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import SimpleNamespace

import pytest
import test_pipeline
import torch
from test_grpo_skeleton import LinearPolicy, Recorder, ToyGRPO, ValueReward, samples  # the skeleton tests' toy module

from app.algorithms import group_advantages
from app.modules import NonFiniteTrainingError
from app.rewards import PendingRewards, RewardError
from app.settings import GRPOSettings, OptimizerSettings, PipelineSettings
from app.types import Generation, RewardOutput, VisualSample


class Logs:
    """Takes the place of the module's ``log_dict`` and ``log`` (there is no trainer here) and keeps every call, its
    values as floats."""

    def __init__(self, module):
        self.dicts: list[tuple[dict, dict]] = []
        self.singles: list[tuple[str, float, dict]] = []
        module.log_dict = lambda values, **kwargs: self.dicts.append(({k: float(v) for k, v in values.items()}, kwargs))
        module.log = lambda name, value, **kwargs: self.singles.append((name, float(value), kwargs))


clock = test_pipeline.clock  # the fake perf_counter fixture of the pipeline tests


def attach(module, optimizer=None, scheduler=None):
    """What the trainer would give a manually optimised module: its optimizer, schedule and backward."""
    optimizer = optimizer or torch.optim.SGD(module.policy.trainable_parameters(), lr=0.01)
    module.optimizers = lambda: optimizer
    module.lr_schedulers = lambda: scheduler
    module.manual_backward = lambda loss: loss.backward()
    return module


def batch(step: int) -> list[VisualSample]:
    return [VisualSample([], f"p{step}{b}", "toy", answer=str(b)) for b in range(2)]


# ------------------------------------------------------------------------------------------------ the update
def test_each_of_the_num_iterations_updates_steps_the_optimizer_and_the_learning_rate_schedule():
    module = attach(ToyGRPO(LinearPolicy(), grpo=GRPOSettings(num_iterations=3)), optimizer := Recorder(), scheduler := Recorder())
    stats = module._train_on(module.rollout(samples()))
    assert (optimizer.steps, scheduler.steps) == (3, 3)
    assert stats["skipped"] is False and module.skipped_updates == 0


def test_a_skipped_update_leaves_the_learning_rate_schedule_where_it_was():
    module = attach(ToyGRPO(LinearPolicy()), optimizer := Recorder(), scheduler := Recorder())
    rollout = module.rollout(samples())
    with torch.no_grad():
        module.policy.weight.fill_(float("nan"))  # a non-finite loss and gradient
    stats = module._train_on(rollout)
    assert stats["skipped"] is True and module.skipped_updates == 1
    assert (optimizer.steps, scheduler.steps) == (0, 0)


def test_an_update_leaves_no_gradient_behind():
    """Gradients are released after each step (``set_to_none``), taken or skipped, so the next update starts from none
    and the memory is free while the next rollout is generated."""
    module = attach(ToyGRPO(LinearPolicy()))
    rollout = module.rollout(samples())
    assert module._update(rollout, module.optimizers())["skipped"] is False
    assert module.policy.weight.grad is None
    with torch.no_grad():
        module.policy.weight.fill_(float("nan"))
    assert module._update(rollout, module.optimizers())["skipped"] is True
    assert module.policy.weight.grad is None


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_scored_advantages_follow_the_module_s_advantage_scale(scale):
    module = ToyGRPO(LinearPolicy(), grpo=GRPOSettings(advantage_scale=scale))
    total = torch.tensor([1.0, 2.0, 6.0, 5.0, 5.0, 4.0])
    expected = group_advantages(total, 3, scale=scale)
    assert not torch.equal(expected, group_advantages(total, 3, scale="group"))  # the scale matters for these rewards
    assert torch.equal(module._scored(RewardOutput(total, {"value": total})).advantages, expected)


def test_without_a_schedule_the_update_still_steps_the_optimizer():
    module = attach(ToyGRPO(LinearPolicy()), optimizer := Recorder(), scheduler=None)
    assert module._train_on(module.rollout(samples()))["skipped"] is False
    assert optimizer.steps == 1


# ------------------------------------------------------------------------------------------------ the logs
STATS = {"loss": 0.375, "policy_loss": 0.25, "kl": 0.5, "clip_fraction": 0.125, "ratio_mean": 1.5}
TWO_REWARDS = SimpleNamespace(  # two groups of K = 2, the second of equal totals; weights 2 (accuracy) and 1 (format)
    rewards=RewardOutput(
        torch.tensor([2.0, 1.0, 2.0, 2.0]),
        {"accuracy": torch.tensor([1.0, 0.0, 1.0, 1.0]), "format": torch.tensor([0.0, 1.0, 0.0, 0.0])},
    ),
    group_size=2,
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


class FusedToy(ToyGRPO):
    """A loss that never materialises the ratio or its clipping (as a fused one)."""

    @property
    def unlogged_loss_terms(self):
        return frozenset({"ratio_mean", "clip_fraction"})


def test_loss_terms_the_loss_cannot_compute_are_left_out_of_the_logs():
    logs = logged_step(FusedToy(LinearPolicy()), STATS)
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


# ------------------------------------------------------------------------------------------------ the step
def test_a_plain_step_trains_logs_and_splits_its_seconds_between_rollout_reward_and_update(clock):
    """Readings: 0 the step starts, 1-2 around the rewards, 3 rolled out, 4 updated."""
    module = attach(ToyGRPO(LinearPolicy()))
    logs = Logs(module)
    before = module.policy.weight.detach().clone()
    out = module.training_step(batch(0), 0)
    assert out["timings"] == {"rollout": 1000.0 - 1.0 - 90.0, "reward": 90.0, "update": 9000.0}
    assert not torch.equal(module.policy.weight.detach(), before)
    assert out["rewards"].total.tolist() == [1.0, 2.0, 6.0, 5.0, 5.0, 5.0]
    assert torch.equal(out["advantages"], group_advantages(out["rewards"].total, 3, scale="group"))
    assert [(r.question, r.completion) for r in out["records"]] == [("p00", "1"), ("p00", "2"), ("p00", "6"),
                                                                    ("p01", "5")]  # fmt: skip
    ((values, kwargs),) = logs.dicts
    assert kwargs == {"batch_size": 2}  # the step's prompts
    assert values["train/reward/total"] == 4.0 and values["train/frac_zero_std"] == 0.5
    assert values["train/loss/policy"] == float(out["loss"])  # beta 0: the loss is the policy loss
    assert logs.singles == [("reward", 4.0, {"prog_bar": True, "logger": False, "batch_size": 2})]


def test_the_reward_seconds_add_up_every_scoring(clock):
    """Readings 0-1 and 2-3 around the two scorings."""
    module = ToyGRPO(LinearPolicy())
    module.score(module.outputs, samples())
    module.score(module.outputs, samples())
    assert module._reward_seconds == (10.0 - 1.0) + (1000.0 - 100.0)


def test_a_delayed_step_trains_the_rollout_of_the_step_before():
    module = attach(ToyGRPO(LinearPolicy(), pipeline=PipelineSettings(delay=1, workers="inline")))
    Logs(module)
    assert module.training_step(batch(0), 0) is None  # primes the pipeline
    out = module.training_step(batch(1), 1)
    assert out["policy_lag"] == 0
    assert [r.question for r in out["records"]] == ["p00"] * 3 + ["p01"]


class Unfinished(Future):
    """A reward still being scored: waiting for it gives up at once, whatever the time limit."""

    def result(self, timeout=None):
        raise FutureTimeoutError


def test_a_checkpoint_waits_for_pending_rewards_no_longer_than_the_pipeline_s_time_limit():
    module = ToyGRPO(LinearPolicy(), pipeline=PipelineSettings(delay=1, workers="inline", reward_timeout_s=0.05))
    pending = PendingRewards({"value": Unfinished()}, num_completions=6)
    module.rollout_queue.pending.append(Generation(samples(), list(module.outputs), {}, version=0, rewards=pending))
    with pytest.raises(RewardError, match=re.escape("reward 'value' gave no result within 0.05 s")):
        module.on_save_checkpoint({})


def test_train_end_drops_counts_and_logs_the_pending_rollout_and_stops_its_own_workers_without_waiting(caplog):
    """The rule for the last rollout: dropped (its queued rewards cancelled), added to the count, logged; the module's
    own reward workers are shut down at once, a reward still running is not waited for."""
    import logging
    import threading
    from concurrent.futures import ThreadPoolExecutor

    module = ToyGRPO(LinearPolicy(), pipeline=PipelineSettings(delay=1))
    module.rollout_queue.dropped = 2  # from the epochs before
    workers, release = ThreadPoolExecutor(1), threading.Event()
    running = workers.submit(release.wait, 2.0)  # holds the only worker
    queued = workers.submit(int)  # a reward of no pending rollout, still queued
    pending_reward = workers.submit(int)
    pending = PendingRewards({"value": pending_reward}, num_completions=6)
    queue = module.rollout_queue
    queue.pending.append(Generation(samples(), list(module.outputs), {}, version=0, rewards=pending))
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


class MassWeighted(ToyGRPO):
    """Several rollouts in one update weigh by their kept rows."""

    def loss_mass(self, rollout):
        return rollout.keep.sum().float()


def test_an_update_over_several_rollouts_weighs_each_by_its_share_of_the_loss_mass():
    import dataclasses

    module = attach(MassWeighted(LinearPolicy()), optimizer=Recorder())  # no step: the gradients stay to be read
    whole = module.rollout(samples())  # 6 kept rows
    keep = whole.keep.clone()
    keep[3:] = False
    half = dataclasses.replace(whole, keep=keep)  # 3 kept rows: the first group only

    def gradient(rollouts):
        module.policy.weight.grad = None
        module._update(rollouts, Recorder())
        return module.policy.weight.grad.clone()

    expected = 6 / 9 * gradient(whole) + 3 / 9 * gradient(half)
    assert torch.allclose(gradient([whole, half]), expected, atol=1e-7)
    assert not torch.allclose(gradient([whole, half]), 0.5 * gradient(whole) + 0.5 * gradient(half), atol=1e-7)


def test_with_clipping_off_a_non_finite_gradient_under_a_finite_loss_still_skips_the_update():
    module = attach(ToyGRPO(LinearPolicy(), grpo=GRPOSettings(gradient_clip_val=0.0)), optimizer := Recorder())
    rollout = module.rollout(samples())
    module.policy.weight.register_hook(lambda grad: grad * float("inf"))  # the loss stays finite
    stats = module._update(rollout, optimizer)
    assert torch.isfinite(stats["loss"]) and "grad_norm" not in stats
    assert stats["skipped"] is True and optimizer.steps == 0 and module.skipped_updates == 1


# ------------------------------------------------------------------------------------------ non-finite rewards
def nan_rewards(rows: int, components: int, nonfinite: int) -> RewardOutput:
    """Rewards of ``rows`` completions whose components returned ``nonfinite`` NaNs (replaced by 0)."""
    names = [f"r{i}" for i in range(components)]
    return RewardOutput(torch.zeros(rows), {name: torch.zeros(rows) for name in names}, num_nonfinite=nonfinite)


def module_with(components: int, group_size: int = 3, max_nonfinite_steps: int = 1):
    rewards = [ValueReward(name=f"r{i}") for i in range(components)]
    module = ToyGRPO(LinearPolicy(), rewards=rewards, optimizer=OptimizerSettings(max_nonfinite_steps=max_nonfinite_steps))
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
