"""RolloutQueue on its own (no module, no Trainer): the order and priming of a delayed pipeline, rewards submitted to
the right workers and collected once, the policy lag, the state a checkpoint carries, and the rule for the last
rollout. The module-level behaviour (what a step trains, logs and returns) is in test_pipeline.py and
test_checkpoint_hooks.py."""

import io
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch
from test_grpo_skeleton import ValueReward  # the completion text read as a number

from app.modules.rollout_queue import RolloutQueue
from app.rewards import PendingRewards, WeightedReward
from app.settings import PipelineSettings
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
    """Two prompts, K = 2: outputs ``step``, ``step + 1``, ``step + 2``, ``step + 3``."""
    samples = [VisualSample([], f"p{step}{b}", "toy") for b in range(2)]
    return Generation(samples, [str(float(step + i)) for i in range(4)], {"features": torch.ones(4, 2)}, version=-1)


def submitted(queue: RolloutQueue, step: int) -> Generation:
    g = generation(step)
    queue.submit(g, g.samples, group_size=2)
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
    assert taken.outputs == generation(0).outputs and torch.equal(taken.parts["features"], torch.ones(4, 2))
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
