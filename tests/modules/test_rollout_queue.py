"""The rollout queue (app.modules.rollout_queue) and the delayed pipeline it runs (docs/algorithms.md#the-delayed-
pipeline): on its own (no module, no Trainer), the order and priming of a delayed queue, rewards submitted to the right
workers and collected once, the policy lag, the state a checkpoint carries and the rule for the last rollout; in a
module, update k uses rollout k and its rewards with a lag of exactly one rollout, the ratio uses the behaviour
log-probs stored at generation time, delay 0 scores inline, and the pending rollout, policy version and prompt sampler
travel through a checkpoint (each rank its own), so runs are deterministic and resume in the middle of the pipeline.
Dynamic sampling (the queue's refill) is in test_dynamic_sampling.py."""

import io
import logging
import os
import re
import threading
import time
import zlib
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from doubles import (
    TOY_ADVANTAGES,
    TOY_LOGGED,
    TOY_REWARDS,
    Logs,
    ToyPipelined,
    ValueReward,
    attach,
    driver,
    features_of,
    toy_batch,
    toy_draw,
)
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from app.modules import FlowGRPOModule, VLMGRPOModule
from app.modules.plain_data import from_plain, to_plain
from app.modules.rollout_queue import RolloutQueue, reward_executor
from app.rewards import PendingRewards, RewardComponent, RewardError, WeightedReward
from app.settings import OptimizerSettings, PipelineSettings, SamplingSettings
from app.types import Generation, RewardOutput, VisualSample


class ThreadNamedValue(ValueReward):
    """Records the thread each batch is scored in."""

    def __init__(self):
        super().__init__()
        self.threads: list[str] = []

    def score(self, completions, samples):
        self.threads.append(threading.current_thread().name)
        return super().score(completions, samples)


def queue_of(delay: int = 1, workers: str = "thread", reward: ValueReward | None = None, seed: int = 0) -> RolloutQueue:
    settings = PipelineSettings(delay=delay, workers=workers, seed=seed)
    return RolloutQueue(settings, WeightedReward([reward or ValueReward()]))


def generation(step: int) -> Generation:
    """Two prompts, K = 2: outputs ``step``, ``step + 1``, ``step + 2``, ``step + 3``, each with features (1, 1)."""
    samples = [VisualSample([], f"p{step}{b}", "toy") for b in range(2)]
    outputs = [str(float(step + i)) for i in range(4)]
    return Generation(samples, toy_draw(torch.ones(4, 2), outputs, rows_per_prompt=2), version=-1)


def submitted(queue: RolloutQueue, step: int) -> Generation:
    g = generation(step)
    queue.submit(g, rows_per_prompt=2)
    return g


def test_submit_stamps_the_version_and_scores_each_output_with_its_own_prompt():
    seen = []

    class Recording(ValueReward):
        def score(self, completions, samples):
            seen.append([s.question for s in samples])
            return super().score(completions, samples)

    queue = queue_of(delay=0, reward=Recording())
    queue.version = 5
    g = submitted(queue, 1)
    assert g.version == 5 and list(queue.pending) == [g]
    assert seen == [["p10", "p10", "p11", "p11"]]  # row b * K + k answers prompt b
    assert queue.collect(g).total.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_delayed_queue_primes_then_hands_out_the_oldest_generation():
    queue = queue_of(delay=1)
    first = submitted(queue, 0)
    assert queue.take(torch.device("cpu")) is None  # priming: nothing to train yet
    second = submitted(queue, 10)
    taken = queue.take(torch.device("cpu"))
    assert [s.question for s in taken.samples] == ["p00", "p01"] and taken.outputs == first.outputs
    assert list(queue.pending) == [second]
    assert queue.take(torch.device("cpu")) is None  # one newer generation must stay behind
    assert queue.collect(taken).total.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_without_delay_the_generation_of_this_step_is_taken_at_once_and_scored_inline():
    reward = ThreadNamedValue()
    queue = queue_of(delay=0, reward=reward)
    g = submitted(queue, 3)
    assert queue.take(torch.device("cpu")).outputs == g.outputs and not queue.pending
    assert reward.threads == [threading.main_thread().name] and queue.executor is None


def test_delayed_rewards_run_in_workers_the_queue_builds_once_and_collect_waits_once():
    reward = ThreadNamedValue()
    queue = queue_of(delay=1, reward=reward)
    g = submitted(queue, 0)
    workers = queue.executor
    assert isinstance(workers, ThreadPoolExecutor) and queue.built_executor is workers
    assert isinstance(g.rewards, PendingRewards)
    collected = queue.collect(g)
    assert isinstance(collected, RewardOutput) and g.rewards is collected
    assert queue.collect(g) is collected  # collected once, not scored again
    queue.collect(submitted(queue, 1))
    assert queue.executor is workers
    assert [name.startswith("reward") for name in reward.threads] == [True, True]
    queue.close()


def test_inline_workers_score_in_the_training_thread_and_build_nothing():
    reward = ThreadNamedValue()
    queue = queue_of(delay=1, workers="inline", reward=reward)
    submitted(queue, 0)
    assert queue.executor is None and queue.built_executor is None
    assert reward.threads == [threading.main_thread().name]


def test_an_executor_set_on_the_queue_is_used_and_left_running():
    reward = ThreadNamedValue()
    queue = queue_of(delay=1, reward=reward)
    mine = ThreadPoolExecutor(1, thread_name_prefix="mine")
    queue.executor = mine
    queue.collect(submitted(queue, 0))
    queue.close()
    assert reward.threads == ["mine_0"] and queue.executor is mine
    assert mine.submit(int).result() == 0  # still running: not the queue's to shut down
    mine.shutdown()


def test_trained_counts_the_version_and_gives_the_lag_of_the_generation():
    queue = queue_of(delay=1)
    old = submitted(queue, 0)
    assert queue.trained(old) == 0 and queue.version == 1
    new = submitted(queue, 1)
    assert new.version == 1
    assert queue.trained(old) == 1 and queue.version == 2  # old was sampled two updates ago, one before this one
    assert queue.trained(new) == 1


def test_the_prompt_sampler_is_seeded_with_seed_plus_rank_once():
    queue = queue_of(seed=7)
    drawer = queue.drawer(rank=3)
    assert torch.equal(drawer.generator.get_state(), torch.Generator().manual_seed(10).get_state())
    assert queue.drawer(rank=5) is drawer  # created once: a later rank argument changes nothing


def through_a_file(state: dict) -> dict:
    """``state`` as Lightning writes and reads a checkpoint back (``weights_only=True``)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_saved_state_holds_collected_rewards_and_restores_into_a_fresh_queue():
    queue = queue_of(delay=1, seed=2)
    queue.version = 4
    submitted(queue, 0)
    submitted(queue, 1)
    torch.randint(10, (3,), generator=queue.drawer(rank=1).generator)  # the prompt sampler has drawn
    state = through_a_file(queue.state(rank=1))
    assert state["version"] == 4 and len(state["pending"]) == 2
    assert torch.equal(state["drawer"], queue.drawer(rank=1).generator.get_state())
    fresh = queue_of(delay=1, seed=0)
    fresh.load_state(state, rank=1)
    assert fresh.version == 4
    restored = list(fresh.pending)
    assert [g.outputs for g in restored] == [generation(0).outputs, generation(1).outputs]
    assert [g.rewards.total.tolist() for g in restored] == [[0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]]
    assert [g.version for g in restored] == [4, 4]
    draws = [torch.randint(10, (3,), generator=q.drawer(rank=1).generator).tolist() for q in (queue, fresh)]
    assert draws[0] == draws[1]
    taken = fresh.take(torch.device("cpu"))
    assert taken.outputs == generation(0).outputs and torch.equal(features_of(taken.sampled), torch.ones(4, 2))
    assert fresh.collect(taken).total.tolist() == [0.0, 1.0, 2.0, 3.0]  # no workers needed: collected before saving
    queue.close()


def test_close_drops_counts_and_logs_pending_rollouts_and_cancels_their_queued_rewards(caplog):
    queue = queue_of(delay=1)
    workers, release = ThreadPoolExecutor(1), threading.Event()
    queue.executor = queue.built_executor = workers  # as if built by the queue
    running = workers.submit(release.wait, 2.0)  # holds the only worker
    queued: Future = workers.submit(int)
    g = generation(0)
    g.rewards = PendingRewards({"value": queued}, num_completions=4)
    queue.pending.extend([g, generation(1)])
    queue.dropped = 1
    try:
        with caplog.at_level(logging.INFO, logger="app.modules.rollout_queue"):
            queue.close()
        returned_while_running = not running.done()
    finally:
        release.set()
    assert returned_while_running and queued.cancelled()
    assert queue.dropped == 3 and not queue.pending
    assert queue.executor is None and queue.built_executor is None
    assert [r.getMessage() for r in caplog.records] == [
        "rollout pipeline: 2 generated rollout(s) left untrained at the end of fit"
    ]
    with pytest.raises(RuntimeError, match="after shutdown"):
        workers.submit(int)


def test_close_with_nothing_pending_logs_nothing_and_counts_nothing(caplog):
    queue = queue_of(delay=1)
    with caplog.at_level(logging.INFO, logger="app.modules.rollout_queue"):
        queue.close()
    assert queue.dropped == 0 and not caplog.records


# ---------------------------------------------------------------------------------- in a module: the delayed pipeline

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
    return VLMGRPOModule(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards=[reward or SlowHashReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        eval_max_new_tokens=4,
        pipeline=pipeline,
        **kwargs,
        optimizer=OptimizerSettings(learning_rate=1e-2),
    )


def trained(recorder) -> list[dict]:
    """The recorded steps that made an update (a delayed pipeline's first step only primes it)."""
    return [step for step in recorder.steps if step["outputs"]]  # Lightning hands callbacks {} for a None output


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


"""What every step of :class:`ToyPipelined` logs, delay 0 included."""


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
            (f"p{k}0", 1.0, -1.0),
            (f"p{k}0", 3.0, 1.0),
            (f"p{k}1", 2.0, 2.0),
        ]
        assert out["timings"] == {"rollout": 9.0, "reward": 90.0, "update": 9000.0}
        assert set(values) == TOY_LOGGED
        assert values["train/reward_wait_s"] == 90.0 and values["train/toy/rows"] == 4
        assert values["train/reward/total"] == 1.0 and values["train/skipped_updates"] == 0
        assert out["loss"] == values["train/loss/policy"]  # beta 0: the loss is the policy loss
        assert kwargs == {"batch_size": 2}  # the trained rollout's prompts
        assert (name, float(reward_total), bar_kwargs) == (
            "reward",
            1.0,
            {"prog_bar": True, "logger": False, "batch_size": 2},
        )
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


def test_the_reward_workers_are_threads_of_the_number_asked_for():
    """``num_workers: 2`` threads: four rewards submitted while none can finish (each waits until all are submitted)
    run on the two threads; a pool of more workers would start a thread for each."""
    workers = reward_executor(PipelineSettings(delay=1, workers="thread", num_workers=2))
    submitted = threading.Event()

    def reward(_):
        submitted.wait(timeout=30)
        return threading.current_thread().name

    try:
        futures = [workers.submit(reward, i) for i in range(4)]
        submitted.set()
        threads = {future.result() for future in futures}
    finally:
        submitted.set()
        workers.shutdown()
    assert isinstance(workers, ThreadPoolExecutor) and threads == {"reward_0", "reward_1"}


def test_process_reward_workers_are_a_process_pool_of_the_number_asked_for():
    count = (os.cpu_count() or 1) + 1  # not the pool's default
    workers = reward_executor(PipelineSettings(delay=1, workers="process", num_workers=count))
    try:  # no process starts before a reward is submitted
        assert isinstance(workers, ProcessPoolExecutor) and workers._max_workers == count
    finally:
        workers.shutdown()
    assert reward_executor(PipelineSettings(delay=1, workers="inline")) is None


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


def test_the_plain_step_scores_inline_and_splits_its_time_between_rollout_reward_and_update(clock):
    """Readings: 0 the step starts, 1 rolled out, 2 rewards collected (scored inline), 3 refilled, 4 updated. The plain
    step returns and logs a policy lag of 0 and its reward wait, as every step does."""
    reward = GroupAwareValue()
    module = ToyPipelined(delay=0, rewards=[reward], records_per_step=1)
    logs = Logs(module)
    out = driver(module)(0)
    assert out["timings"] == {"rollout": 9.0, "reward": 90.0, "update": 9000.0}
    assert set(out) == {
        "loss",
        "records",
        "rewards",
        "advantages",
        "timings",
        "policy_lag",
        "rows_per_prompt",
        "features",
    }
    assert out["policy_lag"] == 0 and out["rows_per_prompt"] == module.group_size
    ((values, kwargs),) = logs.dicts
    assert set(values) == TOY_LOGGED and kwargs == {"batch_size": 2}
    assert values["train/policy_lag"] == 0.0 and values["train/reward_wait_s"] == 90.0
    assert reward.calls == [(threading.main_thread().name, ["p00", "p00", "p01", "p01"], 2)]
    assert module.reward_executor is None


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
    assert zero.reward_executor is None and len(zero_rec.steps) == 2
    assert [step["metrics"]["train/policy_lag"] for step in zero_rec.steps] == [0.0, 0.0]
    for (name, a), b in zip(plain.named_parameters(), zero.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_the_flow_family_trains_with_delay_one_on_stored_log_densities(fit, params_snapshot):
    from app.models import FlowPolicy
    from app.settings import FlowGRPOLossSettings, FlowGRPOSamplingSettings, LoRASettings

    class Redness(RewardComponent):
        def score(self, completions, samples):
            return torch.stack([image[0].float().mean() for image in completions]).cpu()

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    module = FlowGRPOModule(
        policy,
        [Redness()],
        FlowGRPOSamplingSettings(group_size=2, num_steps=4),
        pipeline=PipelineSettings(delay=1, workers="thread"),
        loss=FlowGRPOLossSettings(eps_low=0.5, eps_high=0.5),
        optimizer=OptimizerSettings(learning_rate=0.05),
    )
    before = params_snapshot(module)
    prompts = [VisualSample(images=[], question=f"a red square {i}", task="red") for i in range(3)]
    _, recorder = fit(module, DataLoader(prompts, batch_size=1, collate_fn=list), max_steps=2)
    steps = trained(recorder)
    assert [s["metrics"]["train/policy_lag"] for s in steps] == [0.0, 1.0]
    assert steps[0]["metrics"]["train/ratio_mean"] == 1.0  # drawn by the policy it trains: stored == recomputed
    assert steps[1]["metrics"]["train/ratio_mean"] != 1.0  # drawn before the first update
    after = params_snapshot(module)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora" in n)


# --------------------------------------------------------------------------------------------------- checkpoint state


def test_a_checkpoint_carries_the_pending_rollout_the_version_and_the_prompt_sampler_to_a_new_module():
    """Saved after three steps (rollouts 0 and 1 trained, rollout 2 pending), the state goes through
    ``torch.load(weights_only=True)`` and a fresh module's next step is the one the saved module would take."""
    module = ToyPipelined(delay=1)
    step = driver(module)
    for i in range(3):
        step(i)
    torch.randint(10, (3,), generator=module.rollout_queue.drawer(0).generator)  # the prompt sampler has drawn
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
    draws = [torch.randint(10, (3,), generator=m.rollout_queue.drawer(0).generator).tolist() for m in (module, resumed)]
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
    with pytest.raises(ValueError, match=re.escape(refusal(2, 1))):
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


def toy(delay: int = 1) -> ToyPipelined:
    """The toy with its rewards scored inline, attached to a stand-in trainer's optimizer."""
    return attach(ToyPipelined(delay=delay, workers="inline"))


def saved(module) -> dict:
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    return checkpoint


def pipeline_state(version: int, seed: int, *steps: int) -> dict:
    """A rank's saved pipeline state: the rollouts of ``steps`` pending, scored."""
    pending = [
        Generation(
            toy_batch(i),
            toy_draw(torch.full((4, 2), float(i)), ["1.0", "3.0", "2.0", "-2.0"], 2, old_logprobs=torch.zeros(4, 1)),
            version,
            RewardOutput(torch.tensor([1.0, 3.0, 2.0, -2.0]), {"value": torch.tensor([1.0, 3.0, 2.0, -2.0])}),
        )
        for i in steps
    ]
    return {"pending": to_plain(pending), "version": version, "drawer": torch.Generator().manual_seed(seed).get_state()}


def describe(state: dict) -> tuple:
    """What a saved pipeline state holds, comparable with ``==``."""
    pending = [
        (
            g.version,
            [s.question for s in g.samples],
            g.outputs,
            g.rewards.total.tolist(),
            features_of(g.sampled).tolist(),
        )
        for g in from_plain(state["pending"])
    ]
    return pending, state["version"], state["drawer"].tolist()


def test_a_pipelined_checkpoint_carries_the_pending_rollout_the_version_and_the_prompt_sampler_to_a_fresh_module():
    module = toy(delay=1)
    module.training_step(toy_batch(0), 0)  # primes
    module.training_step(toy_batch(1), 1)  # trains rollout 0; rollout 1 pending
    torch.randint(10, (3,), generator=module.rollout_queue.drawer(0).generator)  # the prompt sampler has drawn
    checkpoint = through_a_file(saved(module))
    (state,) = checkpoint["rollout_pipeline"]  # one process
    (pending,) = from_plain(state["pending"])
    assert state["version"] == 1 and pending.version == 0
    assert [s.question for s in pending.samples] == ["p10", "p11"]
    assert pending.rewards.total.tolist() == [1.0, 3.0, 2.0, -2.0]  # collected before saving
    assert torch.equal(state["drawer"], module.rollout_queue.drawer(0).generator.get_state())
    fresh = toy(delay=1)
    fresh.on_load_checkpoint(checkpoint)
    (again,) = saved(fresh)["rollout_pipeline"]
    assert describe(again) == describe(state)
    draws = [torch.randint(10, (3,), generator=m.rollout_queue.drawer(0).generator).tolist() for m in (module, fresh)]
    assert draws[0] == draws[1]


def test_a_resumed_pipeline_takes_its_saved_rollouts_once_and_then_keeps_its_own():
    module = toy(delay=1)
    module.on_load_checkpoint({"rollout_pipeline": [pipeline_state(4, 7, 3)]})
    module.training_step(toy_batch(5), 5)  # trains the restored rollout; rollout 5 pending
    module.training_step(toy_batch(6), 6)  # trains rollout 5; rollout 6 pending
    (state,) = saved(module)["rollout_pipeline"]
    assert [[s.question for s in g.samples] for g in from_plain(state["pending"])] == [["p60", "p61"]]
    assert state["version"] == 6  # two updates after the saved version 4


def test_without_the_pipeline_no_pipeline_state_is_saved_or_taken():
    plain = toy(delay=0)
    assert "rollout_pipeline" not in saved(plain)
    plain.on_load_checkpoint({"rollout_pipeline": [pipeline_state(4, 7, 3)]})
    plain.on_train_end()
    assert plain.dropped_rollouts == 0  # no pending rollout came in
    delayed = toy(delay=1)
    delayed.on_load_checkpoint({})  # a checkpoint of a run without the pipeline: the pipeline starts empty
    fresh_sampler = torch.Generator().manual_seed(0).get_state().tolist()  # pipeline.seed 0 + rank 0
    assert describe(saved(delayed)["rollout_pipeline"][0]) == ([], 0, fresh_sampler)


def test_each_rank_takes_its_own_pipeline_state():
    states = [pipeline_state(4, 7, 3), pipeline_state(5, 8, 3, 4)]
    module = toy(delay=1)
    module._trainer = SimpleNamespace(world_size=2, global_rank=1, optimizers=[])
    module.on_load_checkpoint({"rollout_pipeline": states})
    assert describe(saved(module)["rollout_pipeline"][0]) == describe(states[1])


def refusal(saved_ranks: int, world_size: int) -> str:
    def processes(n: int) -> str:
        return f"{n} process" if n == 1 else f"{n} processes"

    return (
        f"the checkpoint was saved by {processes(saved_ranks)} with queued rollouts (pipeline.delay 1), this run has "
        f"{processes(world_size)}: a queued rollout belongs to the rank that generated it (its prompts, groups and "
        f"behaviour log-probs) and cannot move to another; resume on {processes(saved_ranks)}"
    )


@pytest.mark.parametrize(("saved_ranks", "world_size"), [(2, None), (1, 2), (2, 4)], ids=["2 on 1", "1 on 2", "2 on 4"])
def test_resuming_a_run_with_queued_rollouts_on_another_number_of_processes_is_refused(saved_ranks, world_size):
    module = toy(delay=1)
    if world_size is not None:
        module._trainer = SimpleNamespace(world_size=world_size, global_rank=0, optimizers=[])
    with pytest.raises(ValueError, match=re.escape(refusal(saved_ranks, world_size or 1))):
        module.on_load_checkpoint({"rollout_pipeline": [pipeline_state(4, 7, 3)] * saved_ranks})


@pytest.mark.parametrize("world_size", [1, 4])
def test_a_pipeline_state_without_queued_rollouts_resumes_on_another_number_of_processes(world_size):
    """Dynamic sampling without delay carries only the prompt sampler: ranks that existed take theirs, a new rank
    starts its own (seeded ``pipeline.seed + rank``, as in a fresh run), and every rank the saved version."""
    states = [pipeline_state(4, 7), pipeline_state(4, 8)]  # two ranks, nothing queued
    for rank in range(world_size):
        module = toy(delay=0)
        module.rollout_queue.settings = PipelineSettings(delay=0, workers="inline", dynamic_sampling=True)
        module._trainer = SimpleNamespace(world_size=world_size, global_rank=rank, optimizers=[])
        module.on_load_checkpoint({"rollout_pipeline": states})
        sampler = torch.Generator().manual_seed(7 + rank if rank < 2 else rank).get_state().tolist()
        assert describe(module.rollout_queue.state(rank)) == ([], 4, sampler), f"rank {rank}"


def test_under_torch_distributed_the_checkpoint_holds_the_gathered_state_of_every_rank():
    """A one-process gloo group, in this process: the checkpoint holds what ``all_gather_object`` brought back."""
    module = toy(delay=1)
    module.on_load_checkpoint({"rollout_pipeline": [pipeline_state(5, 8, 3, 4)]})
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        checkpoint = saved(module)
    finally:
        torch.distributed.destroy_process_group()
    (state,) = checkpoint["rollout_pipeline"]
    assert describe(state) == describe(pipeline_state(5, 8, 3, 4))


def straight_or_resumed(new_policy, new_datamodule, fit, max_steps, ckpt_path=None, callbacks=()):
    L.seed_everything(0)
    module = vlm_module(new_policy, PipelineSettings(delay=1, workers="thread", num_workers=2))
    trainer, recorder = fit(
        module,
        new_datamodule(train_size=16),
        max_steps=max_steps,
        ckpt_path=ckpt_path,
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
    )
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


# ---------------------------------------------------------------------------------------------------------------- DDP

DDP_SCRIPT = """
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from conftest import make_policy, tiny_datamodule
from ddp_probe import LengthReward
from app.modules import VLMGRPOModule
from app.settings import OptimizerSettings, PipelineSettings, SamplingSettings

out = sys.argv[1]


def run(name, max_steps, callbacks=(), ckpt_path=None):
    L.seed_everything(0)
    module = VLMGRPOModule(
        make_policy(), rewards=[LengthReward()], sampling=SamplingSettings(group_size=4, max_new_tokens=8),
        optimizer=OptimizerSettings(learning_rate=1e-2), eval_max_new_tokens=4,
        pipeline=PipelineSettings(delay=1, workers="thread"),
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
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
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
    with pytest.raises(ValueError, match=re.escape(refusal(2, 1))):
        single.on_load_checkpoint(checkpoint)
