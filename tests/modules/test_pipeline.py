"""The one-step-delayed rollout/reward pipeline (docs/algorithms.md#the-delayed-pipeline) and DAPO dynamic sampling:
update k uses rollout k and its rewards with a lag of exactly one rollout, the ratio uses the behaviour log-probs stored
at generation time, runs are deterministic and resume in the middle of the pipeline, delay 0 keeps the plain step."""

import functools
import io
import re
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_grpo_skeleton import LinearPolicy  # the skeleton tests' toy policy (a full Policy)
from torch.utils.data import DataLoader

from app.algorithms import grpo_loss, zero_std_groups
from app.modules import FlowGRPOModule, GRPOModule, VLMGRPOModule, grpo
from app.modules.grpo import ScoredGroups
from app.modules.plain_data import from_plain, to_plain
from app.rewards import RewardComponent, RewardError
from app.settings import GRPOSettings, OptimizerSettings, PipelineSettings, SamplingSettings
from app.types import Generation, RewardOutput, VisualSample

K = 4


def crc(text: str) -> float:
    return zlib.crc32(text.encode()) % 1000 / 1000


class SlowHashReward(RewardComponent):
    """Deterministic and slow: a hash of the completion in [0, 1) after a pause; remembers what it scored, where."""

    def __init__(self, pause: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.pause = pause
        self.calls: list[tuple[str, list[str]]] = []

    def score(self, completions, samples):
        time.sleep(self.pause)
        self.calls.append((threading.current_thread().name, list(completions)))
        return torch.tensor([crc(c) for c in completions])


def vlm_module(new_policy, pipeline=None, reward=None, **kwargs) -> VLMGRPOModule:
    return VLMGRPOModule(new_policy("tiny-qwen2-vl", lora_r=4), rewards=[reward or SlowHashReward()], sampling=SamplingSettings(group_size=K, max_new_tokens=8), eval_max_new_tokens=4, pipeline=pipeline, **kwargs, optimizer=OptimizerSettings(learning_rate=1e-2))


def trained(recorder) -> list[dict]:
    """The recorded steps that made an update (a delayed pipeline's first step only primes it)."""
    return [step for step in recorder.steps if step["outputs"]]  # Lightning hands callbacks {} for a None output


def test_settings_refuse_what_the_pipeline_cannot_do():
    with pytest.raises(ValueError, match="pipeline.delay must be 0 or 1, got 2"):
        PipelineSettings(delay=2)
    with pytest.raises(ValueError, match="pipeline.workers must be"):
        PipelineSettings(workers="gpu")
    with pytest.raises(ValueError, match="reward_timeout_s must be > 0"):
        PipelineSettings(reward_timeout_s=0)


# ------------------------------------------------------------------------------------------ the delayed pipeline
def test_delay_one_trains_rollout_k_with_its_own_rewards_one_rollout_late(new_policy, new_datamodule, fit):
    torch.manual_seed(0)
    reward = SlowHashReward()
    module = vlm_module(new_policy, PipelineSettings(delay=1, workers="thread"), reward)
    trainer, recorder = fit(module, new_datamodule(train_size=16), max_steps=3)
    assert trainer.global_step == 3
    assert len(recorder.steps) == 4 and not recorder.steps[0]["outputs"]  # the first batch primes
    steps = trained(recorder)
    assert [s["metrics"]["train/policy_lag"] for s in steps] == [0.0, 1.0, 1.0]
    assert [s["outputs"]["policy_lag"] for s in steps] == [0, 1, 1]
    for k, step in enumerate(steps):
        records = step["outputs"]["records"]
        scored_thread, scored_texts = reward.calls[k]  # rollout k, scored in a worker while rollout k+1 was drawn
        assert scored_thread.startswith("reward")
        assert [r.completion for r in records] == scored_texts[: len(records)]
        assert [r.reward for r in records] == pytest.approx([crc(r.completion) for r in records])
        assert step["metrics"]["train/reward_wait_s"] >= 0
    assert module.dropped_rollouts == 1  # the rule for the last rollout: generated, never trained


@dataclass
class Settings:
    group_size: int = 2


class ValueReward(RewardComponent):
    value_range = (-10.0, 10.0)

    def score(self, completions, samples):
        return torch.tensor([float(c) for c in completions])


@dataclass
class ToyRollout:
    features: torch.Tensor  # [N, 2]
    old_logprobs: torch.Tensor | None  # [N]
    rewards: RewardOutput
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    group_size: int


class ToyPipelined(GRPOModule):
    """Each prompt carries its outputs' features and rewards; one loss part over all rows. Logs its rollout's rows
    (``train/toy/rows``) and hands callbacks the features of the rollout it trained (``outputs["features"]``)."""

    def __init__(
        self, delay: int, rewards=None, workers="thread", records_per_step=0, gradient_clip_val=0.0, **pipeline
    ):
        super().__init__(
            LinearPolicy(), rewards or [ValueReward()], Settings(), eps_low=0.2, eps_high=0.2, beta=0.0, num_iterations=1,
            advantage_scale="none", drop_zero_std_groups=False, micro_batch_size=None,
            gradient_clip_val=gradient_clip_val, records_per_step=records_per_step, learning_rate=0.1, weight_decay=0.0,
            warmup_steps=0, pipeline=PipelineSettings(delay=delay, workers=workers, **pipeline),
        )  # fmt: skip

    @torch.no_grad()
    def generate_rollout(self, samples):
        features = torch.cat([s.meta["features"] for s in samples])  # [N, 2]
        old = features @ self.policy.weight if self.stores_behaviour_logprobs else None
        outputs = [str(v) for s in samples for v in s.meta["values"]]
        return Generation(samples, outputs, {"features": features, "old_logprobs": old}, version=0)

    def finish_rollout(self, generation, scored):
        return ToyRollout(**generation.parts, rewards=scored.rewards, advantages=scored.advantages,
                          loss_mask=scored.keep, group_size=self.group_size)  # fmt: skip

    def weighted_losses(self, rollout):
        logprobs = (rollout.features @ self.policy.weight)[:, None]  # [N, 1]
        old = rollout.old_logprobs[:, None] if rollout.old_logprobs is not None else logprobs.detach()
        yield grpo_loss(logprobs, old, rollout.advantages, rollout.loss_mask[:, None]), 1.0

    def completion_text(self, rollout, row):
        return ""

    def rollout_logs(self, rollout):
        return {"train/toy/rows": torch.tensor(float(len(rollout.features)))}

    def step_outputs(self, rollout):
        return {"features": rollout.features}


def toy_batch(step: int) -> list[VisualSample]:
    features = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.5, -1.5], [2.0, 1.0]]) * (1 + step)
    values = [[1.0, 3.0], [2.0, -2.0]]
    return [
        VisualSample([], f"p{step}{b}", "toy", meta={"features": features[2 * b : 2 * b + 2], "values": values[b]})
        for b in range(2)
    ]


def driver(module: GRPOModule):
    """``step(i)`` runs training step ``i`` on ``toy_batch(i)`` without a trainer: plain SGD (lr 0.01)."""
    optimizer = torch.optim.SGD(module.policy.trainable_parameters(), lr=0.01)
    module.optimizers = lambda: optimizer
    module.lr_schedulers = lambda: None
    module.manual_backward = lambda loss: loss.backward()
    return lambda i: module.training_step(toy_batch(i), i)


def test_the_ratio_of_a_stale_rollout_uses_the_behaviour_log_probs_stored_at_generation():
    """Hand-checked: rollout 1 is drawn by w0 and trained after the update of rollout 0 moved the policy to w1, so its
    ratio is exp(f . (w1 - w0)) and the SGD step is w1 + lr * mean_i(A_i * ratio_i * f_i) (no clipping here)."""
    module = ToyPipelined(delay=1)
    weight = module.policy.weight
    w0 = weight.detach().clone()
    step = driver(module)
    assert step(0) is None and torch.equal(weight.detach(), w0)  # priming: no update
    assert step(1)["policy_lag"] == 0
    f0 = torch.cat([s.meta["features"] for s in toy_batch(0)])
    a = torch.tensor([-1.0, 1.0, 2.0, -2.0])  # group-centred rewards (advantage_scale="none")
    w1 = w0 + 0.01 * (a[:, None] * f0).mean(dim=0)  # lag 0: ratio exactly 1
    torch.testing.assert_close(weight.detach(), w1)
    assert step(2)["policy_lag"] == 1
    f1 = torch.cat([s.meta["features"] for s in toy_batch(1)])
    ratio = torch.exp(f1 @ (w1 - w0))  # [N]
    assert ratio.min() > 0.8 and ratio.max() < 1.2 and (ratio - 1).abs().max() > 0.05
    w2 = w1 + 0.01 * (a[:, None] * ratio[:, None] * f1).mean(dim=0)
    torch.testing.assert_close(weight.detach(), w2)
    assert not torch.allclose(weight.detach(), w1 + 0.01 * (a[:, None] * f1).mean(dim=0))  # what ratio 1 would give


class FailingValue(ValueReward):
    def score(self, completions, samples):
        raise RuntimeError("scorer crashed")


class StuckValue(ValueReward):
    def score(self, completions, samples):
        time.sleep(1.0)
        return super().score(completions, samples)


def test_a_failing_or_stuck_reward_stops_the_step_with_its_name():
    failing = ToyPipelined(delay=1, rewards=[FailingValue(name="judge")])
    step = driver(failing)
    assert step(0) is None  # submitted; the error waits for the step that collects it
    with pytest.raises(RewardError, match="reward 'judge' failed: RuntimeError: scorer crashed"):
        step(1)
    stuck = ToyPipelined(delay=1, rewards=[StuckValue(name="slow_judge")], reward_timeout_s=0.05)
    step = driver(stuck)
    step(0)
    with pytest.raises(RewardError, match="reward 'slow_judge' gave no result within 0.05 s"):
        step(1)
    with pytest.raises(RewardError, match="reward 'slow_judge' gave no result within 0.05 s"):
        stuck.on_save_checkpoint({})  # a checkpoint collects the pending rewards, under the same time limit
    stuck.on_train_end()  # drops the pending rollout and shuts the workers down
    assert stuck.dropped_rollouts == 1


class GroupAwareValue(ValueReward):
    """The completion read as a number, by a reward that compares groups (so it is handed K); notes, per call, the
    thread it ran in, the prompt of each row and the K it was given."""

    scope = "group_pair"

    def __init__(self):
        super().__init__(name="value")
        self.calls: list[tuple[str, list[str], int | None]] = []

    def score(self, completions, samples, group_size=None):
        self.calls.append((threading.current_thread().name, [s.question for s in samples], group_size))
        return super().score(completions, samples)


class Clock:
    """Stands in for ``time.perf_counter`` in the GRPO skeleton: reading n (from 0, see ``readings``) is 10 ** n
    seconds, so every difference of two readings is a distinct number naming the stretch it measures."""

    def __init__(self):
        self.readings = 0

    def perf_counter(self) -> float:
        self.readings += 1
        return 10.0 ** (self.readings - 1)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(grpo, "time", fake)
    return fake


class Logs:
    """Takes the place of the module's ``log_dict`` and ``log`` (there is no trainer here) and keeps every call."""

    def __init__(self, module: GRPOModule):
        self.dicts: list[tuple[dict, dict]] = []
        self.singles: list[tuple[str, torch.Tensor, dict]] = []
        module.log_dict = lambda values, **kwargs: self.dicts.append((dict(values), kwargs))
        module.log = lambda name, value, **kwargs: self.singles.append((name, value, kwargs))


TOY_REWARDS, TOY_ADVANTAGES = [1.0, 3.0, 2.0, -2.0], [-1.0, 1.0, 2.0, -2.0]  # toy_batch's, group-centred
LOGGED = {"train/reward/total", "train/loss/policy", "train/kl", "train/clip_fraction", "train/ratio_mean",
          "train/frac_zero_std", "train/nonfinite_rewards", "train/skipped_updates", "train/reward/value",
          "train/toy/rows"}  # fmt: skip


def test_each_delayed_step_returns_and_logs_the_previous_rollout_with_its_lag_and_timings(clock):
    """Step i trains rollout i - 1 (drawn by the policy of one update earlier, lag 1 once the pipeline runs) and hands
    callbacks and the logger that rollout: its prompts, rewards, advantages, features, and the step's seconds split
    between rollout (reading 1 - reading 0), reward wait (2 - 1) and update (4 - 3)."""
    reward = GroupAwareValue()
    module = ToyPipelined(delay=1, rewards=[reward], records_per_step=3)
    logs = Logs(module)
    step = driver(module)
    assert step(0) is None and not logs.dicts
    outputs = []
    for i in (1, 2, 3):
        clock.readings = 0
        outputs.append(step(i))
    assert [out["policy_lag"] for out in outputs] == [0, 1, 1]
    assert [values["train/policy_lag"] for values, _ in logs.dicts] == [0.0, 1.0, 1.0]
    for k, (out, (values, kwargs), (name, reward_total, bar_kwargs)) in enumerate(
        zip(outputs, logs.dicts, logs.singles, strict=True)
    ):
        trained = toy_batch(k)
        assert torch.equal(out["features"], torch.cat([s.meta["features"] for s in trained]))
        assert out["rewards"].total.tolist() == TOY_REWARDS and out["advantages"].tolist() == TOY_ADVANTAGES
        assert [(r.question, r.reward, r.advantage) for r in out["records"]] == [
            (f"p{k}0", 1.0, -1.0), (f"p{k}0", 3.0, 1.0), (f"p{k}1", 2.0, 2.0)
        ]  # fmt: skip
        assert out["timings"] == {"rollout": 9.0, "reward": 90.0, "update": 9000.0}
        assert set(values) == LOGGED | {"train/policy_lag", "train/reward_wait_s"}
        assert values["train/reward_wait_s"] == 90.0 and values["train/toy/rows"] == 4
        assert values["train/reward/total"] == 1.0 and values["train/skipped_updates"] == 0
        assert out["loss"] == values["train/loss/policy"]  # beta 0: the loss is the policy loss
        assert kwargs == {"batch_size": 2}  # the trained rollout's prompts
        assert (name, float(reward_total), bar_kwargs) == ("reward", 1.0, {"prog_bar": True, "logger": False,
                                                                           "batch_size": 2})  # fmt: skip
    assert outputs[0]["loss"] == 0 and outputs[1]["loss"] != 0  # ratio exactly 1 at lag 0 only
    # each trained rollout was scored by the reward workers, row b * K + k from prompt b, with K
    assert reward.calls[:3] == [("reward_0", [f"p{i}0", f"p{i}0", f"p{i}1", f"p{i}1"], 2) for i in range(3)]


def test_a_delayed_pipeline_builds_its_reward_workers_once_and_shuts_them_down_at_train_end():
    module = ToyPipelined(delay=1)
    step = driver(module)
    step(0)
    workers = module.reward_executor
    assert isinstance(workers, ThreadPoolExecutor)
    for i in (1, 2):
        step(i)
    assert module.reward_executor is workers
    module.on_train_end()
    assert module.reward_executor is None and module.dropped_rollouts == 1
    with pytest.raises(RuntimeError, match="after shutdown"):
        workers.submit(int)


def test_inline_workers_or_an_executor_set_on_the_module_take_the_place_of_built_ones():
    inline_reward = GroupAwareValue()
    inline = ToyPipelined(delay=1, rewards=[inline_reward], workers="inline")
    step = driver(inline)
    step(0), step(1)
    assert inline.reward_executor is None
    assert {thread for thread, _, _ in inline_reward.calls} == {threading.main_thread().name}
    reward, mine = GroupAwareValue(), ThreadPoolExecutor(1, thread_name_prefix="mine")
    module = ToyPipelined(delay=1, rewards=[reward])
    module.reward_executor = mine
    step = driver(module)
    step(0), step(1)
    module.on_train_end()
    assert {thread for thread, _, _ in reward.calls} == {"mine_0"}
    assert module.reward_executor is mine and mine.submit(int).result() == 0  # not the module's to shut down
    mine.shutdown()


def test_a_checkpoint_carries_the_pending_rollout_the_version_and_the_prompt_sampler_to_a_new_module():
    """Saved after three steps (rollouts 0 and 1 trained, rollout 2 pending), the state goes through
    ``torch.load(weights_only=True)`` and a fresh module's next step is the one the saved module would take."""
    module = ToyPipelined(delay=1)
    step = driver(module)
    for i in range(3):
        step(i)
    torch.randint(10, (3,), generator=module.drawer.generator)  # the prompt sampler has drawn
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    (state,) = checkpoint["rollout_pipeline"]  # one process
    (pending,) = from_plain(state["pending"])
    assert state["version"] == 2 and pending.version == 1  # drawn by the policy of one update
    assert [s.question for s in pending.samples] == ["p20", "p21"]
    assert pending.rewards.total.tolist() == TOY_REWARDS  # collected before saving
    resumed = ToyPipelined(delay=1)
    resumed.policy.load_state_dict(module.policy.state_dict())
    resumed.on_load_checkpoint(checkpoint)
    draws = [torch.randint(10, (3,), generator=m.drawer.generator).tolist() for m in (module, resumed)]
    assert draws[0] == draws[1]
    expected, got = step(3), driver(resumed)(3)
    assert got["policy_lag"] == expected["policy_lag"] == 1  # no priming: the pending rollout came back
    assert torch.equal(got["features"], expected["features"]) and torch.equal(got["loss"], expected["loss"])
    assert torch.equal(resumed.policy.weight, module.policy.weight)


def test_each_rank_resumes_its_own_pending_rollout_and_another_world_size_is_refused():
    states = []
    for prompts in (toy_batch(0), toy_batch(5)):  # each rank primed with its own prompts
        rank = ToyPipelined(delay=1)
        driver(rank)
        rank.training_step(prompts, 0)
        saved = {}
        rank.on_save_checkpoint(saved)
        states += saved["rollout_pipeline"]
    checkpoint = {"rollout_pipeline": states}
    second = ToyPipelined(delay=1)
    second._trainer = SimpleNamespace(world_size=2, global_rank=1)
    second.on_load_checkpoint(checkpoint)
    second._trainer = None
    trained = driver(second)(1)["features"]
    assert torch.equal(trained, torch.cat([s.meta["features"] for s in toy_batch(5)]))
    message = (
        "the checkpoint holds the rollout pipeline of 2 processes, this run has 1: "
        "resume a pipelined run on as many processes as it was saved from"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        ToyPipelined(delay=1).on_load_checkpoint(checkpoint)


def test_under_torch_distributed_the_checkpoint_gathers_the_pipeline_state_of_every_rank():
    """A one-process gloo group, in this process: the checkpoint holds what ``all_gather_object`` brought back."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        module = ToyPipelined(delay=1)
        driver(module)(0)
        checkpoint = {}
        module.on_save_checkpoint(checkpoint)
    finally:
        torch.distributed.destroy_process_group()
    (state,) = checkpoint["rollout_pipeline"]
    (pending,) = from_plain(state["pending"])
    assert state["version"] == 0 and [s.question for s in pending.samples] == ["p00", "p01"]


def test_without_the_pipeline_no_pipeline_state_is_saved_or_restored():
    plain = ToyPipelined(delay=0)
    checkpoint = {}
    plain.on_save_checkpoint(checkpoint)
    assert "rollout_pipeline" not in checkpoint
    delayed = ToyPipelined(delay=1)
    delayed.on_load_checkpoint(checkpoint)  # a checkpoint of a run without the pipeline
    assert driver(delayed)(0) is None  # primes, as a fresh run does
    saved = {}
    delayed.on_save_checkpoint(saved)  # one rollout pending
    plain.on_load_checkpoint(saved)
    plain.on_train_end()
    assert plain.dropped_rollouts == 0  # the plain run took no pending rollout


def test_the_plain_step_scores_inline_and_splits_its_time_between_rollout_reward_and_update(clock):
    """Readings: 0 the step starts, 1-2 around the rewards, 3 rolled out, 4 updated."""
    reward = GroupAwareValue()
    module = ToyPipelined(delay=0, rewards=[reward], records_per_step=1)
    logs = Logs(module)
    out = driver(module)(0)
    assert out["timings"] == {"rollout": 1000.0 - 1.0 - 90.0, "reward": 90.0, "update": 9000.0}
    assert set(out) == {"loss", "records", "rewards", "advantages", "timings", "features"}  # no policy_lag
    ((values, kwargs),) = logs.dicts
    assert set(values) == LOGGED and kwargs == {"batch_size": 2}
    assert reward.calls == [(threading.main_thread().name, ["p00", "p00", "p01", "p01"], 2)]
    assert module.reward_executor is None


class ScoredPromptByPrompt(ToyPipelined):
    """Scores each prompt's group with its own call of :meth:`score`, as a family scoring in parts would."""

    def rollout(self, samples):
        generation, k = self._generate(samples), self.group_size
        parts = [self.score(generation.outputs[b * k : (b + 1) * k], [s]) for b, s in enumerate(samples)]
        total = torch.cat([p.rewards.total for p in parts])
        rewards = RewardOutput(total, {"value": torch.cat([p.rewards.components["value"] for p in parts])})
        scored = ScoredGroups(rewards, torch.cat([p.advantages for p in parts]), torch.cat([p.keep for p in parts]))
        return self.finish_rollout(generation, scored)


def test_the_reward_time_of_a_step_adds_up_every_scoring_of_its_rollout(clock):
    """Readings: 0 the step starts, 1-2 and 3-4 around the two scorings, 5 rolled out, 6 updated."""
    module = ScoredPromptByPrompt(delay=0, rewards=[GroupAwareValue()])
    out = driver(module)(0)
    assert out["rewards"].total.tolist() == TOY_REWARDS
    reward = 90.0 + 9000.0
    assert out["timings"] == {"rollout": 1e5 - 1.0 - reward, "reward": reward, "update": 1e6 - 1e5}


class NoRatio(ToyPipelined):
    """A loss that never materialises the ratio (as a fused one)."""

    @property
    def unlogged_loss_terms(self):
        return frozenset({"ratio_mean"})


def test_the_step_logs_the_gradient_norm_when_clipping_and_leaves_out_terms_the_loss_cannot_compute():
    module = NoRatio(delay=0, gradient_clip_val=100.0)
    logs = Logs(module)
    driver(module)(0)
    ((values, _),) = logs.dicts
    assert set(values) == LOGGED - {"train/ratio_mean"} | {"train/grad_norm"}
    f0 = torch.cat([s.meta["features"] for s in toy_batch(0)])
    gradient = -(torch.tensor(TOY_ADVANTAGES)[:, None] * f0).mean(dim=0)  # ratio 1: d(-mean(A * ratio)) / dw
    torch.testing.assert_close(values["train/grad_norm"], torch.linalg.vector_norm(gradient))


def test_logged_values_are_moved_to_the_module_s_device():
    """The meta device stands in for an accelerator: values computed on the host are moved there too."""
    module = ToyPipelined(delay=0)
    logs = Logs(module)
    total = torch.tensor(TOY_REWARDS)
    rollout = ToyRollout(torch.zeros(4, 2), None, RewardOutput(total, {"value": total}), torch.zeros(4),
                         torch.ones(4, dtype=torch.bool), group_size=2)  # fmt: skip
    stats = {key: torch.tensor(0.5) for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")}
    module._device = torch.device("meta")
    module._log_step(rollout, stats, batch_size=2)
    ((values, _),) = logs.dicts
    assert set(values) == LOGGED and {value.device.type for value in values.values()} == {"meta"}


def test_delay_zero_takes_the_plain_step_with_rewards_in_the_training_thread(new_policy, new_datamodule, fit):
    runs = {}
    for name, pipeline in (("default", None), ("delay0", PipelineSettings(delay=0, workers="process"))):
        L.seed_everything(0)
        reward = SlowHashReward(pause=0)
        module = vlm_module(new_policy, pipeline, reward)
        _, recorder = fit(module, new_datamodule(), max_steps=2)
        runs[name] = module, recorder, reward
    (plain, _, _), (zero, zero_rec, reward) = runs["default"], runs["delay0"]
    assert {thread for thread, _ in reward.calls} == {threading.main_thread().name}
    assert (
        zero.reward_executor is None
        and len(zero_rec.steps) == 2
        and "train/policy_lag" not in zero_rec.steps[-1]["metrics"]
    )
    for (name, a), b in zip(plain.named_parameters(), zero.parameters(), strict=True):
        assert torch.equal(a, b), name


def straight_or_resumed(new_policy, new_datamodule, fit, max_steps, ckpt_path=None, callbacks=()):
    L.seed_everything(0)
    module = vlm_module(new_policy, PipelineSettings(delay=1, workers="thread", num_workers=2))
    trainer, recorder = fit(
        module, new_datamodule(train_size=16), max_steps=max_steps, ckpt_path=ckpt_path, callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
    )  # fmt: skip
    return module, trainer, recorder


def test_delayed_runs_are_deterministic_and_resume_in_the_middle_of_the_pipeline(
    new_policy, new_datamodule, fit, params_snapshot, tmp_path
):
    first, _, first_rec = straight_or_resumed(new_policy, new_datamodule, fit, 4)
    second, _, second_rec = straight_or_resumed(new_policy, new_datamodule, fit, 4)
    saving = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    straight_or_resumed(new_policy, new_datamodule, fit, 2, callbacks=[saving])
    step2 = tmp_path / "epoch=0-step=2.ckpt"
    assert torch.load(step2, weights_only=True)["rollout_pipeline"][0]["version"] == 2  # plain data
    resumed, trainer, resumed_rec = straight_or_resumed(new_policy, new_datamodule, fit, 4, ckpt_path=str(step2))
    assert trainer.global_step == 4 and len(resumed_rec.steps) == 2  # no priming: the pending rollout came back

    def texts(recorder):
        return [[r.completion for r in s["outputs"]["records"]] for s in trained(recorder)]

    assert texts(first_rec) == texts(second_rec)
    assert texts(resumed_rec) == texts(first_rec)[-2:]
    assert [s["metrics"]["train/policy_lag"] for s in trained(resumed_rec)] == [1.0, 1.0]
    assert resumed_rec.steps[-1]["metrics"]["train/loss/policy"] == first_rec.steps[-1]["metrics"]["train/loss/policy"]
    params = [params_snapshot(m.policy.model) for m in (first, second, resumed)]
    for name, value in params[0].items():
        assert torch.equal(value, params[1][name]), name
        torch.testing.assert_close(params[2][name], value, atol=1e-6, rtol=0, msg=name)


def test_a_pending_rollout_round_trips_through_plain_data(new_policy, samples):
    module = vlm_module(new_policy, PipelineSettings(delay=1))
    generation = module.generate_rollout(samples[:2])
    generation.rewards = module.rewards(generation.outputs, [s for s in samples[:2] for _ in range(K)])
    restored = from_plain(to_plain(generation))
    assert restored.outputs == generation.outputs and restored.samples[0].question == samples[0].question
    assert list(restored.samples[0].images[0].get_flattened_data()) == list(samples[0].images[0].get_flattened_data())
    assert torch.equal(restored.parts["old_logprobs"], generation.parts["old_logprobs"])
    assert torch.equal(restored.parts["prompt_inputs"].tensors["pixel_values"],
                       generation.parts["prompt_inputs"].tensors["pixel_values"])  # fmt: skip
    assert restored.rewards.total.tolist() == generation.rewards.total.tolist()


def test_the_flow_family_trains_with_delay_one_on_stored_log_densities(fit, params_snapshot):
    from app.models import FlowPolicy
    from app.settings import FlowSamplingSettings, LoRASettings

    class Redness(RewardComponent):
        def score(self, completions, samples):
            return torch.stack([image[0].float().mean() for image in completions]).cpu()

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    module = FlowGRPOModule(policy, [Redness()], FlowSamplingSettings(group_size=2, num_steps=4), pipeline=PipelineSettings(delay=1, workers="thread"), grpo=GRPOSettings(eps_low=0.5, eps_high=0.5), optimizer=OptimizerSettings(learning_rate=0.05))  # fmt: skip
    before = params_snapshot(module)
    prompts = [VisualSample(images=[], question=f"a red square {i}", task="red") for i in range(3)]
    _, recorder = fit(module, DataLoader(prompts, batch_size=1, collate_fn=list), max_steps=2)
    steps = trained(recorder)
    assert [s["metrics"]["train/policy_lag"] for s in steps] == [0.0, 1.0]
    assert steps[0]["metrics"]["train/ratio_mean"] == 1.0  # drawn by the policy it trains: stored == recomputed
    assert steps[1]["metrics"]["train/ratio_mean"] != 1.0  # drawn before the first update
    after = params_snapshot(module)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora" in n)


# -------------------------------------------------------------------------------------------- dynamic sampling
class HalfFlatReward(RewardComponent):
    """Flat (0.5) for prompts whose question hashes even, a hash of the completion otherwise."""

    def score(self, completions, samples):
        return torch.tensor(
            [
                0.5 if zlib.crc32(s.question.encode()) % 2 == 0 else crc(c)
                for c, s in zip(completions, samples, strict=True)
            ]
        )


class TrainedGroups(VLMGRPOModule):
    """Keeps, per update, the rollouts that made it."""

    def _train_on(self, rollouts):
        self.seen = getattr(self, "seen", []) + [rollouts if isinstance(rollouts, list) else [rollouts]]
        return super()._train_on(rollouts)


def dots_with_distinct_questions(train_size: int, batch_size: int):
    from app.data import VisualTaskDataModule
    from app.tasks.dots import DotsDataset

    class Numbered(DotsDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            sample.question = f"[{index}] {sample.question}"
            return sample

    return VisualTaskDataModule(functools.partial(Numbered, dot_radius=12), train_size=train_size, val_size=2, test_size=2, batch_size=batch_size,
                                seed=0, image_size=64)  # fmt: skip


@pytest.mark.parametrize("delay", [0, 1])
def test_dynamic_sampling_fills_the_batch_with_informative_groups(new_policy, fit, delay):
    L.seed_everything(0)
    module = TrainedGroups(
        new_policy("tiny-qwen2-vl", lora_r=4), rewards=[HalfFlatReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8), eval_max_new_tokens=4,
        pipeline=PipelineSettings(delay=delay, dynamic_sampling=True, max_extra_rollouts=6),
    )  # fmt: skip
    batch_size = 4
    _, recorder = fit(module, dots_with_distinct_questions(64, batch_size), max_steps=3)
    extra = [s["metrics"]["train/dynamic/extra_rollouts"] for s in trained(recorder)]
    assert [s["metrics"]["train/dynamic/informative_groups"] for s in trained(recorder)] == [batch_size] * 3
    assert any(extra), "no step met a flat group: the test does not exercise the refill"
    for rollouts, n_extra in zip(module.seen, extra, strict=True):
        assert len(rollouts) == 1 + n_extra
        kept = 0
        for rollout in rollouts:
            flat = zero_std_groups(rollout.rewards.total, K)
            in_loss = rollout.loss_mask.view(-1, K, rollout.loss_mask.shape[1]).sum(dim=(1, 2)) > 0  # [B]
            assert not (in_loss & flat).any(), "a flat group entered the loss"
            kept += int(in_loss.sum())
        assert kept == batch_size


def test_dynamic_sampling_stops_at_its_cap(new_policy, fit):
    L.seed_everything(0)
    module = TrainedGroups(
        new_policy("tiny-qwen2-vl", lora_r=4), rewards=[HalfFlatReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8), eval_max_new_tokens=4,
        pipeline=PipelineSettings(dynamic_sampling=True, max_extra_rollouts=0),
    )  # fmt: skip
    _, recorder = fit(module, dots_with_distinct_questions(64, 4), max_steps=3)
    informative = [s["metrics"]["train/dynamic/informative_groups"] for s in recorder.steps]
    assert all(len(r) == 1 for r in module.seen) and min(informative) < 4
    assert all(s["metrics"]["train/dynamic/extra_rollouts"] == 0 for s in recorder.steps)


FLAT, SPREAD = [1.0, 1.0], [0.0, 2.0]  # the rewards of a toy prompt's two outputs: no signal, or some


def toy_prompts(rewards: list[list[float]], name: str) -> list[VisualSample]:
    features = torch.randn(len(rewards), 2, 2, generator=torch.Generator().manual_seed(len(name)))  # [B, K, 2]
    return [
        VisualSample([], f"{name}{b}", "toy", meta={"features": features[b], "values": values})
        for b, values in enumerate(rewards)
    ]


class InOrder:
    """Stands in for the seeded prompt sampler: draws the data set's prompts in order, and fails past its end."""

    def __init__(self):
        self.next = 0

    def draw(self, dataset, num_items, collate):
        items = [dataset[i] for i in range(self.next, self.next + num_items)]  # IndexError past the end
        self.next += num_items
        return collate(items)


class ToyDynamic(ToyPipelined):
    """The toy with dynamic sampling, outside a trainer: extra prompts come in order from ``dataset`` in loader
    batches of ``batch_size``; keeps the loss masks of the rollouts each update trained on and the logged metrics."""

    def __init__(self, dataset: list[VisualSample], batch_size: int, max_extra_rollouts: int):
        super().__init__(delay=0, dynamic_sampling=True, max_extra_rollouts=max_extra_rollouts)
        self.loader = DataLoader(dataset, batch_size=batch_size, collate_fn=list)
        self.in_order = InOrder()
        self.masks: list[list[list[int]]] = []
        self.logged: dict[str, float] = {}

    @property
    def trainer(self):
        return SimpleNamespace(train_dataloader=self.loader)

    @property
    def drawer(self):
        return self.in_order

    def _train_on(self, rollouts):
        self.masks.append(
            [r.loss_mask.int().tolist() for r in (rollouts if isinstance(rollouts, list) else [rollouts])]
        )
        return super()._train_on(rollouts)

    def log_dict(self, values, **kwargs):
        self.logged.update({name: float(value) for name, value in values.items()})


def dynamic_step(batch: list[VisualSample], module: ToyDynamic) -> tuple[list[list[int]], float, float]:
    """One training step: the loss masks of the rollouts it trained on, the extra rollouts and informative groups."""
    driver(module)  # the optimizer and backward of a trainer
    module.training_step(batch, 0)
    (masks,) = module.masks
    return masks, module.logged["train/dynamic/extra_rollouts"], module.logged["train/dynamic/informative_groups"]


def test_dynamic_sampling_trains_on_the_first_b_informative_groups_in_order():
    """B = 3 with one informative group: the first extra rollout brings none, the second three, of which the first
    two fill the batch and the third is left out of the loss, as the flat groups are."""
    data = toy_prompts([FLAT] * 3 + [SPREAD] * 3, "data")
    module = ToyDynamic(data, batch_size=3, max_extra_rollouts=4)
    masks, extra, informative = dynamic_step(toy_prompts([FLAT, FLAT, SPREAD], "batch"), module)
    assert masks == [[0, 0, 0, 0, 1, 1], [0] * 6, [1, 1, 1, 1, 0, 0]]
    assert (extra, informative) == (2.0, 3.0)


def test_dynamic_sampling_draws_nothing_for_a_batch_of_informative_groups():
    module = ToyDynamic(toy_prompts([SPREAD] * 3, "data"), batch_size=3, max_extra_rollouts=4)
    masks, extra, informative = dynamic_step(toy_prompts([SPREAD] * 3, "batch"), module)
    assert masks == [[1] * 6] and module.drawer.next == 0
    assert (extra, informative) == (0.0, 3.0)
    assert module.reward_executor is None  # delay 0: rewards scored in the training thread, no workers built


def test_dynamic_sampling_trains_on_both_rollouts_when_one_refill_completes_the_batch():
    module = ToyDynamic(toy_prompts([SPREAD, FLAT], "data"), batch_size=2, max_extra_rollouts=4)
    masks, extra, informative = dynamic_step(toy_prompts([FLAT, SPREAD], "batch"), module)
    assert masks == [[0, 0, 1, 1], [1, 1, 0, 0]]
    assert (extra, informative) == (1.0, 2.0)


def test_dynamic_sampling_refills_a_short_last_batch_with_whole_loader_batches_up_to_its_cap():
    """The epoch's last batch holds 2 prompts, the loader's batches 3: each extra rollout draws 3; with only flat
    prompts to draw, the refill stops after ``max_extra_rollouts`` (the data set holds no more than that)."""
    module = ToyDynamic(toy_prompts([FLAT] * 6, "data"), batch_size=3, max_extra_rollouts=2)
    masks, extra, informative = dynamic_step(toy_prompts([FLAT, SPREAD], "batch"), module)
    assert masks == [[0, 0, 1, 1], [0] * 6, [0] * 6]
    assert (extra, informative) == (2.0, 1.0)


# ------------------------------------------------------------------------------------------------------------ DDP
DDP_SCRIPT = """
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from conftest import make_policy, tiny_datamodule
from ddp_probe import LengthReward
from app.settings import SamplingSettings
from app.modules import VLMGRPOModule
from app.settings import PipelineSettings

out = sys.argv[1]


def run(name, max_steps, callbacks=(), ckpt_path=None):
    L.seed_everything(0)
    module = VLMGRPOModule(
        make_policy(), rewards=[LengthReward()], sampling=SamplingSettings(group_size=4, max_new_tokens=8),
        learning_rate=1e-2, eval_max_new_tokens=4, pipeline=PipelineSettings(delay=1, workers="thread"),
    )
    trainer = L.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", max_steps=max_steps, logger=False, callbacks=list(callbacks),
        enable_checkpointing=bool(callbacks), enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=out,
    )
    trainer.fit(module, datamodule=tiny_datamodule(train_size=16), ckpt_path=ckpt_path)
    weights = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    torch.save({"weights": weights, "global_step": trainer.global_step, "dropped": module.dropped_rollouts},
               f"{out}/{name}{trainer.global_rank}.pt")


run("saved", 2, [ModelCheckpoint(dirpath=out, every_n_train_steps=1, save_top_k=-1)])
run("resumed", 3, ckpt_path=f"{out}/epoch=0-step=2.ckpt")
run("straight", 3)
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ddp_ranks_pipeline_their_own_rollouts_and_resume_them(new_policy, tmp_path, app_env):
    """Two gloo ranks with delay 1: both end with the same weights, the checkpoint holds each rank's pending rollout
    (rollouts never cross ranks), a rank takes its own back on load, and resuming at step 2 reproduces the straight
    3-step run on every rank."""
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    tests = Path(__file__).resolve().parents[1]
    script = tmp_path / "pipeline_ddp.py"
    script.write_text(DDP_SCRIPT)
    env = app_env(OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{tests}:{tests / 'fixtures'}"
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    runs = {name: [torch.load(tmp_path / f"{name}{r}.pt") for r in (0, 1)] for name in ("saved", "resumed", "straight")}
    assert [r["global_step"] for r in runs["saved"]] == [2, 2] and [r["dropped"] for r in runs["saved"]] == [1, 1]
    assert [r["global_step"] for r in runs["resumed"]] == [3, 3]
    for name, value in runs["straight"][0]["weights"].items():
        assert torch.equal(value, runs["straight"][1]["weights"][name]), f"{name} differs between ranks"
        for rank in (0, 1):
            torch.testing.assert_close(runs["resumed"][rank]["weights"][name], value, atol=1e-6, rtol=0, msg=name)
    checkpoint = torch.load(tmp_path / "epoch=0-step=2.ckpt", weights_only=True)
    states = checkpoint["rollout_pipeline"]
    pending = [from_plain(state["pending"]) for state in states]
    assert len(states) == 2 and all(len(p) == 1 for p in pending) and [s["version"] for s in states] == [2, 2]
    questions = [{s.question + str(s.answer) + str(s.meta) for s in p[0].samples} for p in pending]
    assert not questions[0] & questions[1], "the ranks' pending rollouts hold the same prompts"
    module = vlm_module(new_policy, PipelineSettings(delay=1))
    module._trainer = SimpleNamespace(world_size=2, global_rank=1)
    module.on_load_checkpoint(checkpoint)
    module._trainer = None
    assert [s.question for s in module.rollout_queue.pending[0].samples] == [s.question for s in pending[1][0].samples]
    single = vlm_module(new_policy, PipelineSettings(delay=1))
    with pytest.raises(ValueError, match="pipeline of 2 processes, this run has 1"):
        single.on_load_checkpoint(checkpoint)
