"""Asynchronous rewards: a reward may return a future or run in an executor (threads, processes); failures surface as a
RewardError naming the reward, and a dead worker process or a stuck reward never hangs the caller."""

import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import torch

from app.rewards import RemoteReward, RewardComponent, RewardError, WeightedReward
from app.rewards.serve import RewardServer
from app.tasks.vbvr import VBVRScorerReward
from app.types import VisualSample

HANG_GUARD_S = 60
"""How long a test waits for what should happen at once before it fails as a hang (pytest-timeout's 180 s would
otherwise end the whole test without naming what hung). Never a bound on how long anything takes."""


class LengthReward(RewardComponent):
    value_range = (0.0, 100.0)

    def score(self, completions, samples):
        return torch.tensor([float(len(c)) for c in completions])


class FutureReward(RewardComponent):
    """Asynchronous by contract: ``score`` returns a future resolved by a thread of its own."""

    value_range = (0.0, 100.0)

    def score(self, completions, samples):
        future = Future()
        threading.Timer(0.05, lambda: future.set_result([2.0 * len(c) for c in completions])).start()
        return future


class WorkerPidReward(RewardComponent):
    """The id of the process that scored it (exact in float32: Linux process ids are below 2**22). Compared with the
    test's process id when the test runs, not when the module was imported: mutmut forks each mutant's test run from
    the process that imported it."""

    def score(self, completions, samples):
        return torch.full((len(completions),), float(os.getpid()))


class BrokenReward(RewardComponent):
    def score(self, completions, samples):
        raise KeyError("no such label")


class CrashingReward(RewardComponent):
    def score(self, completions, samples):
        os._exit(3)  # the worker dies without a word


class StuckReward(RewardComponent):
    """Scores only once ``release`` is set (or the hang guard runs out)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.release = threading.Event()

    def score(self, completions, samples):
        self.release.wait(HANG_GUARD_S)
        return torch.zeros(len(completions))


def outcome_within(seconds, call, *args):
    """What ``call(*args)`` returns or raises, called on a thread of its own; fails the test if the call has neither
    returned nor raised after ``seconds`` (a guard against a hang, not a measure of time)."""
    outcome = []

    def run():
        try:
            outcome.append(call(*args))
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{call.__qualname__} hung: neither a result nor an error after {seconds} s"
    return outcome[0]


def batch(n=3):
    sample = VisualSample(images=[], question="q", task="toy")
    return [f"completion {'x' * i}" for i in range(n)], [sample] * n


def test_a_reward_that_returns_a_future_is_awaited_in_forward_and_in_submit():
    completions, samples = batch()
    rewards = WeightedReward([LengthReward(), FutureReward(weight=0.5)])
    direct = rewards(completions, samples)
    lengths = torch.tensor([float(len(c)) for c in completions])
    torch.testing.assert_close(direct.components["future"], 2 * lengths)
    torch.testing.assert_close(direct.total, lengths + lengths)
    pending = rewards.submit(completions, samples)
    gathered = rewards.gather(pending)
    torch.testing.assert_close(gathered.total, direct.total)


def test_submit_returns_while_a_reward_is_still_scoring_and_gather_gives_the_synchronous_values():
    completions, samples = batch()
    started, release = threading.Event(), threading.Event()

    class HeldLength(LengthReward):
        """Finishes only once the test releases it, which the test does after ``submit`` has returned."""

        def score(self, completions, samples):
            started.set()
            assert release.wait(HANG_GUARD_S), "never released: submit waited for the reward to finish"
            return super().score(completions, samples)

    rewards = WeightedReward([HeldLength(name="slow"), LengthReward(weight=2.0)])
    with ThreadPoolExecutor(2) as executor:
        pending = rewards.submit(completions, samples, executor=executor)
        assert not pending.done(), "submit returned only after every reward had finished"
        assert started.wait(HANG_GUARD_S), "the held reward never started in the executor"
        release.set()
        out = rewards.gather(pending, timeout=HANG_GUARD_S)
    expected = rewards(completions, samples)
    torch.testing.assert_close(out.total, expected.total)
    assert out.components.keys() == {"slow", "length"}


def test_a_reward_that_returns_a_future_in_a_thread_pool_gives_its_values():
    completions, samples = batch()
    rewards = WeightedReward([FutureReward()])
    with ThreadPoolExecutor(1) as executor:
        out = rewards.gather(rewards.submit(completions, samples, executor=executor))
    assert out.total.tolist() == [2.0 * len(c) for c in completions]


def test_a_group_reward_in_a_thread_pool_gets_the_group_size():
    class GroupSizeReward(RewardComponent):
        scope = "group_pair"
        value_range = (0.0, 10.0)

        def score(self, completions, samples, group_size=None):
            return torch.full((len(completions),), float(group_size or 0))

    completions, samples = batch(4)
    rewards = WeightedReward([GroupSizeReward()])
    with ThreadPoolExecutor(1) as executor:
        out = rewards.gather(rewards.submit(completions, samples, group_size=2, executor=executor))
    assert out.total.tolist() == [2.0, 2.0, 2.0, 2.0]
    inline = rewards.gather(rewards.submit(completions, samples, group_size=2))  # no executor: scored at once
    assert inline.total.tolist() == [2.0, 2.0, 2.0, 2.0]


def test_a_process_pool_runs_the_reward_in_another_process():
    completions, samples = batch()
    rewards = WeightedReward([WorkerPidReward()])
    with ProcessPoolExecutor(1) as executor:
        out = rewards.gather(rewards.submit(completions, samples, executor=executor))
    worker = out.total.tolist()
    assert worker[0] != os.getpid() and worker == [worker[0]] * 3
    assert rewards(completions, samples).total.tolist() == [float(os.getpid())] * 3  # inline: this process


@pytest.mark.parametrize("pool", [ThreadPoolExecutor, ProcessPoolExecutor])
def test_an_exception_in_a_worker_names_the_reward(pool):
    completions, samples = batch()
    rewards = WeightedReward([LengthReward(), BrokenReward(name="labels")])
    with pool(1) as executor:
        pending = rewards.submit(completions, samples, executor=executor)
        with pytest.raises(RewardError, match=r"reward 'labels' failed: KeyError: 'no such label'"):
            rewards.gather(pending)


def test_an_exception_of_an_inline_reward_is_reported_when_collected():
    completions, samples = batch()
    rewards = WeightedReward([BrokenReward()])
    pending = rewards.submit(completions, samples)  # no executor: scored at once, the error kept for gather
    with pytest.raises(RewardError, match="reward 'broken' failed"):
        rewards.gather(pending)


def test_a_dead_worker_process_fails_the_gather_instead_of_hanging():
    completions, samples = batch()
    rewards = WeightedReward([CrashingReward()])
    executor = ProcessPoolExecutor(1)
    try:
        for _ in range(2):  # the second batch: the pool stays broken and refuses it, also without hanging
            pending = rewards.submit(completions, samples, executor=executor)
            error = outcome_within(HANG_GUARD_S, rewards.gather, pending)
            assert isinstance(error, RewardError), error
            assert str(error).startswith("reward 'crashing' failed: BrokenProcessPool"), str(error)
    finally:
        executor.shutdown()


def test_a_reward_past_the_timeout_fails_with_its_name():
    completions, samples = batch()
    stuck = StuckReward()
    rewards = WeightedReward([stuck])
    executor = ThreadPoolExecutor(1)
    try:
        with pytest.raises(RewardError, match=r"reward 'stuck' gave no result within 0.2 s"):
            rewards.gather(rewards.submit(completions, samples, executor=executor), timeout=0.2)
    finally:
        stuck.release.set()
        executor.shutdown()


def test_non_finite_values_of_a_gathered_batch_are_zeroed_and_counted():
    completions, samples = batch(2)

    class NaNReward(RewardComponent):
        def score(self, completions, samples):
            return torch.tensor([float("nan"), 0.5])

    rewards = WeightedReward([NaNReward()])
    with ThreadPoolExecutor(1) as executor, pytest.warns(RuntimeWarning, match="'na_n' returned 1 non-finite"):
        out = rewards.gather(rewards.submit(completions, samples, executor=executor))
    assert out.total.tolist() == [0.0, 0.5] and out.num_nonfinite == 1 and rewards.num_nonfinite == 1
    two = WeightedReward([NaNReward(name="first"), NaNReward(name="second")])
    with ThreadPoolExecutor(1) as executor, pytest.warns(RuntimeWarning, match="non-finite"):
        out = two.gather(two.submit(completions, samples, executor=executor))
    assert out.num_nonfinite == 2  # one per component, summed over components


def test_a_wrong_shape_from_a_worker_is_the_same_error_as_inline():
    completions, samples = batch(3)

    class ShortReward(RewardComponent):
        def score(self, completions, samples):
            return torch.zeros(2)

    rewards = WeightedReward([ShortReward()])
    with ThreadPoolExecutor(1) as executor, pytest.raises(ValueError, match=r"score must return shape \[3\]"):
        rewards.gather(rewards.submit(completions, samples, executor=executor))


def vbvr_batch():
    from app.tasks.vbvr import get_task

    task = get_task("object_counting")
    params = {"image_size": task.image_size, **task.params}
    instances = [task.generate(seed) for seed in range(2)]
    wrong = task.perturbations(instances[0].config, instances[0].solution)["wrong_count"]
    samples = [
        VisualSample(
            images=[],
            question=i.prompt,
            task=i.task,
            meta={"vbvr": {"task": i.task, "params": params, "config": i.config}},
        )
        for i in (instances[0], instances[0], instances[1])
    ]
    return [instances[0].last_frame, wrong, instances[1].last_frame], samples


def test_the_vbvr_reward_runs_in_an_injected_executor_with_the_values_it_has_inline():
    renderings, samples = vbvr_batch()
    reward = VBVRScorerReward()
    rewards = WeightedReward([reward])
    expected = rewards(renderings, samples).total
    with ProcessPoolExecutor(1) as executor:
        out = rewards.gather(rewards.submit(renderings, samples, executor=executor))
    assert out.total.tolist() == expected.tolist() == [1.0, 0.0, 1.0]


class OwnWorkersReward(FutureReward):
    """Scores on a thread of its own (``FutureReward``'s), whatever executor the trainer has."""

    def start_on_own_workers(self, completions, samples, group_size=None):
        return self.score(completions, samples)


def closed_executor():
    """An executor that refuses every submission (RuntimeError): a reward that reaches it was handed to it."""
    executor = ThreadPoolExecutor(1)
    executor.shutdown()
    return executor


def test_a_reward_with_workers_of_its_own_is_never_handed_to_the_trainer_s_executor():
    completions, samples = batch()
    with pytest.raises(RuntimeError, match="after shutdown"):
        LengthReward().score_async(completions, samples, executor=closed_executor())
    future = OwnWorkersReward().score_async(completions, samples, executor=closed_executor())
    assert future.result(timeout=10) == [2.0 * len(c) for c in completions]


def test_the_vbvr_reward_with_workers_scores_in_its_own_pool_whatever_executor_is_given():
    renderings, samples = vbvr_batch()
    reward = VBVRScorerReward(num_workers=1)
    try:
        future = reward.score_async(renderings, samples, executor=closed_executor())
        assert future.result(timeout=60).tolist() == [1.0, 0.0, 1.0]
    finally:
        reward.close()
    with pytest.raises(RuntimeError, match="after shutdown"):  # without workers: the executor given
        VBVRScorerReward().score_async(renderings, samples, executor=closed_executor())


def test_a_remote_reward_sends_its_requests_from_its_own_threads_whatever_executor_is_given():
    completions, samples = batch()
    with RewardServer([LengthReward()]) as server:
        reward = RemoteReward(server.url, timeout_s=10.0)
        try:
            future = reward.score_async(completions, samples, executor=closed_executor())
            assert torch.equal(future.result(timeout=30), LengthReward().score(completions, samples))
        finally:
            reward.close()
