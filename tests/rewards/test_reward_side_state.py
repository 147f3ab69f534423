"""Side state of a reward (counters ``score`` accumulates, such as ``num_malformed`` and VBVR's ``failed_checks``) comes
back from the reward workers: scored inline, in a thread or in a process, the parent's reward object ends with the same
counts, and the callbacks that log them log the same values."""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from app.modules.rollout_queue import RolloutQueue
from app.rewards import RewardComponent, WeightedReward
from app.rewards.color_region import ColorRegionReward
from app.settings import PipelineSettings
from app.tasks.vbvr import VBVRScorerReward, get_task
from app.types import Generation, VisualSample
from callbacks.reward_breakdown import RewardBreakdownLogger

KINDS = ("inline", "thread", "process")


class TallyReward(RewardComponent):
    """Counts what it scored in the three kinds of side state a reward may keep: a number, a name -> count mapping and
    a tensor."""

    side_state = ("calls", "kinds", "histogram")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls = 0
        self.kinds: Counter[str] = Counter()
        self.histogram = torch.zeros(3)

    def score(self, completions, samples):
        self.calls += 1
        for rendering in completions:
            self.kinds[f"ndim{np.ndim(rendering)}"] += 1
            self.histogram[min(np.ndim(rendering), 2)] += 1.0
        return torch.zeros(len(completions))


class OuterReward(RewardComponent):
    """Holds another reward (as a length reward may hold its correctness reward) and scores with it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TallyReward()

    def score(self, completions, samples):
        return self.inner.score(completions, samples)


def vbvr_batch():
    """A right rendering, one that fails the task's checks, an unreadable (0 x 0) one and another right one; each
    sample also names a colour region prompt, so :class:`ColorRegionReward` can score the same rows."""
    task = get_task("object_counting")
    params = {"image_size": task.image_size, **task.params}
    instances = [task.generate(seed) for seed in range(2)]
    wrong = task.perturbations(instances[0].config, instances[0].solution)["wrong_count"]
    renderings = [instances[0].last_frame, wrong, np.zeros((0, 0, 3), dtype=np.uint8), instances[1].last_frame]
    samples = [
        VisualSample(
            images=[],
            question=i.prompt,
            task=i.task,
            meta={
                "vbvr": {"task": i.task, "params": params, "config": i.config},
                "color": "blue",
                "shape": "square",
                "position": "top",
            },
        )
        for i in (instances[0], instances[0], instances[0], instances[1])
    ]
    return renderings, samples


def rewards_under_test() -> WeightedReward:
    return WeightedReward([VBVRScorerReward(), ColorRegionReward(), TallyReward()])


def side_state_of(rewards: WeightedReward) -> dict:
    vbvr, color, tally = rewards.components
    return {
        "vbvr.num_malformed": vbvr.num_malformed,
        "vbvr.failed_checks": dict(vbvr.failed_checks),
        "color_region.num_malformed": color.num_malformed,
        "tally.calls": tally.calls,
        "tally.kinds": dict(tally.kinds),
        "tally.histogram": tally.histogram.tolist(),
    }


def logged_failed_checks(rewards: WeightedReward, out) -> dict[str, float]:
    callback = RewardBreakdownLogger()
    module = SimpleNamespace(rewards=rewards, group_size=1)
    trainer = SimpleNamespace(global_step=1, is_global_zero=True, loggers=[])
    callback.on_train_batch_end(trainer, module, {"rewards": out, "advantages": torch.zeros(len(out.total))}, None, 0)
    return {k: v for k, v in callback.history[1].items() if k.startswith("train/vbvr_failed/")}


def score_through_the_pipeline(kind: str, batches: int = 2):
    """Score ``batches`` rollouts the way the one-step-delayed pipeline does (``delay: 1``, ``workers: kind``)."""
    renderings, samples = vbvr_batch()
    rewards = rewards_under_test()
    queue = RolloutQueue(PipelineSettings(delay=1, workers=kind, num_workers=2, reward_timeout_s=120), rewards)
    try:
        generations = [Generation(samples, SimpleNamespace(outputs=renderings)) for _ in range(batches)]
        for generation in generations:
            queue.submit(generation, rows_per_prompt=1)
        outs = [queue.collect(generation) for generation in generations]
    finally:
        queue.close()
    return rewards, outs


@pytest.fixture(scope="module")
def expected():
    """What scoring the batch twice synchronously, on the reward objects themselves, leaves on them."""
    renderings, samples = vbvr_batch()
    rewards = rewards_under_test()
    for _ in range(2):
        out = rewards(renderings, samples)
    return side_state_of(rewards), logged_failed_checks(rewards, out), out.total.tolist()


def test_the_synchronous_reference_counts_what_the_batch_holds(expected):
    state, logged, total = expected
    # vbvr (1, 0, 0: unreadable, 1) + colour region (1 where the one blue square is most of the picture's colour, 0
    # beside two red circles or among four squares, 0 unreadable) + tally (0)
    assert total == pytest.approx([2.0, 0.0, 0.0, 1.0])
    assert state["vbvr.num_malformed"] == 2 and state["color_region.num_malformed"] == 2  # one unreadable, twice
    failed = state["vbvr.failed_checks"]
    assert failed and all(task == "object_counting" for task, _ in failed) and set(failed.values()) == {2}
    assert state["tally.calls"] == 2 and state["tally.kinds"] == {"ndim3": 8}
    assert state["tally.histogram"] == [0.0, 0.0, 8.0]
    assert logged and set(logged.values()) == {2.0}


@pytest.mark.parametrize("kind", KINDS)
def test_side_state_comes_back_from_every_kind_of_worker(kind, expected):
    state, logged, total = expected
    rewards, outs = score_through_the_pipeline(kind)
    assert [out.total.tolist() for out in outs] == [total, total]
    assert side_state_of(rewards) == state  # neither lost (process) nor counted twice (thread, inline)
    assert logged_failed_checks(rewards, outs[-1]) == logged


def test_side_state_of_a_process_worker_is_merged_once_per_collected_batch():
    from concurrent.futures import ProcessPoolExecutor

    renderings, samples = vbvr_batch()
    rewards = rewards_under_test()
    vbvr = rewards.components[0]
    with ProcessPoolExecutor(1) as executor:
        pending = rewards.submit(renderings, samples, executor=executor)
        rewards.gather(pending)
        assert vbvr.num_malformed == 1
        rewards.gather(pending)  # collecting the same batch again counts nothing more
        assert vbvr.num_malformed == 1
        rewards.gather(rewards.submit(renderings, samples, executor=executor))
    assert vbvr.num_malformed == 2 and set(vbvr.failed_checks.values()) == {2}


def test_counters_the_parent_already_holds_are_kept_and_added_to():
    from concurrent.futures import ProcessPoolExecutor

    renderings, samples = vbvr_batch()
    rewards = rewards_under_test()
    tally = rewards.components[2]
    tally.calls, tally.kinds["earlier"], tally.histogram[0] = 5, 7, 1.0
    with ProcessPoolExecutor(1) as executor:
        rewards.gather(rewards.submit(renderings, samples, executor=executor))
    assert tally.calls == 6 and tally.kinds == {"earlier": 7, "ndim3": 4}
    assert tally.histogram.tolist() == [1.0, 0.0, 4.0]


def test_the_existing_rewards_that_count_declare_their_counters():
    assert set(VBVRScorerReward.side_state) == {"num_malformed", "failed_checks"}
    assert set(ColorRegionReward.side_state) == {"num_malformed"}
    assert RewardComponent.side_state == ()


def test_a_misnamed_side_state_attribute_is_a_clear_error():
    class Misnamed(RewardComponent):
        side_state = ("num_malfromed",)

        def __init__(self) -> None:
            super().__init__()
            self.num_malformed = 0

        def score(self, completions, samples):
            return torch.zeros(len(completions))

    with pytest.raises(
        AttributeError, match=r"Misnamed\.side_state names 'num_malfromed'.*did you mean 'num_malformed'"
    ):
        WeightedReward([Misnamed()])
    with pytest.raises(AttributeError, match="num_malfromed"):
        Misnamed().side_state_snapshot()


def test_side_state_must_be_names_of_counters():
    with pytest.raises(TypeError, match=r"side_state must be a tuple of attribute names, got 'num_malformed'"):

        class OneString(RewardComponent):
            side_state = "num_malformed"

            def score(self, completions, samples):
                return torch.zeros(len(completions))

    class Listed(RewardComponent):
        side_state = ("seen",)

        def __init__(self) -> None:
            super().__init__()
            self.seen = []

        def score(self, completions, samples):
            return torch.zeros(len(completions))

    with pytest.raises(TypeError, match=r"Listed\.seen is a list: side state must be a number, a mapping"):
        WeightedReward([Listed()])


def test_a_nested_reward_brings_its_side_state_back_too():
    """A reward that holds another reward (a correctness reward inside a length reward, say) gets the inner one's
    counters back as well."""
    from concurrent.futures import ProcessPoolExecutor

    renderings, samples = vbvr_batch()
    rewards = WeightedReward([OuterReward()])
    with ProcessPoolExecutor(1) as executor:
        rewards.gather(rewards.submit(renderings, samples, executor=executor))
    assert rewards.components[0].inner.calls == 1 and rewards.components[0].inner.kinds == {"ndim3": 4}


@pytest.mark.parametrize("kind", KINDS)
def test_seeded_random_consistency_pairs_a_batch_alike_on_every_kind_of_worker(kind):
    """The random pairing of a batch depends on the seed and the batch only, so a process worker (which scores a copy
    of the reward) pairs a sequence of batches as inline scoring does, and a batch scored twice is paired alike."""
    from app.rewards.consistency import ConsistencyReward

    x = VisualSample(images=[], question="Is red left of blue?", task="t", meta={"pair_id": 0})
    twin = VisualSample(
        images=[], question="Is blue left of red?", task="t", meta={"pair_id": 0, "relation": "negation"}
    )
    rng = np.random.default_rng(4)
    batches = [[f"<answer>{rng.choice(['yes', 'no'])}</answer>" for _ in range(16)] for _ in range(3)]
    batches.append(batches[0])  # the first batch again, after others
    reference = ConsistencyReward(pairing="random", seed=11)
    expected = [reference.score(completions, [x] * 8 + [twin] * 8).tolist() for completions in batches]
    rewards = WeightedReward([ConsistencyReward(pairing="random", seed=11)])
    queue = RolloutQueue(PipelineSettings(delay=1, workers=kind, num_workers=2, reward_timeout_s=120), rewards)
    try:
        generations = [Generation([x, twin], SimpleNamespace(outputs=completions)) for completions in batches]
        for generation in generations:
            queue.submit(generation, rows_per_prompt=8)
        outs = [queue.collect(generation) for generation in generations]
    finally:
        queue.close()
    assert [out.total.tolist() for out in outs] == expected
    assert expected[0] == expected[-1]


# ---------------------------------------------------------------------------- the worker's half, in this process
# A process pool runs _score_in_worker on an unpickled copy of the reward in another process, where neither coverage
# nor a mutant run sees it. The functions are plain: here they run in the test process on a copy pickled as a process
# pool pickles it (multiprocessing's ForkingPickler: a tensor goes to shared memory, so the copy's tensor is the
# caller's until own_side_state gives it one of its own).
def as_a_process_pool_ships_it(reward: RewardComponent):
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from app.rewards.base import _Shipment

    return pickle.loads(bytes(ForkingPickler.dumps(_Shipment(reward))))


def test_a_copy_scored_in_a_worker_returns_its_values_and_exactly_its_increments():
    from app.rewards.base import WorkerResult, _score_in_worker

    reward = TallyReward()
    reward.calls, reward.kinds["earlier"], reward.kinds["ndim0"], reward.histogram[0] = 5, 7, 2, 1.0
    shipment = as_a_process_pool_ships_it(reward)
    assert shipment.copied and shipment.component is not reward
    completions = ["a", np.zeros((2, 2)), "b"]  # ndim 0 (twice) and 2
    result = _score_in_worker(shipment, completions, [None] * 3, {})
    assert isinstance(result, WorkerResult) and torch.equal(result.values, torch.zeros(3))
    # only what changed ("earlier" did not), by how much it changed (not the copy's totals), a tensor's difference
    increments = result.side_state[""]
    assert set(result.side_state) == {""} and increments["calls"] == 1
    assert increments["kinds"] == {"ndim0": 2, "ndim2": 1} and increments["histogram"].tolist() == [2.0, 0.0, 1.0]
    assert reward.calls == 5 and reward.histogram.tolist() == [1.0, 0.0, 0.0]  # the caller's object is untouched
    assert torch.equal(reward.collect(result), torch.zeros(3))
    assert (reward.calls, dict(reward.kinds)) == (6, {"earlier": 7, "ndim0": 4, "ndim2": 1})
    assert reward.histogram.tolist() == [3.0, 0.0, 1.0]  # counted once: the copy wrote into a tensor of its own


def test_the_callers_own_object_in_a_worker_gives_the_plain_values():
    """A thread pool hands the worker the caller's reward itself: its side state is already where it belongs."""
    from app.rewards.base import _score_in_worker, _Shipment

    reward = TallyReward()
    values = _score_in_worker(_Shipment(reward), ["a"], [None], {})
    assert torch.equal(values, torch.zeros(1)) and reward.calls == 1


class MisnamedTally(TallyReward):
    side_state = ("calls", "histogramm")


def test_a_misnamed_side_state_is_the_same_clear_error_in_a_worker():
    from app.rewards.base import _score_in_worker

    shipment = as_a_process_pool_ships_it(MisnamedTally())
    with pytest.raises(AttributeError, match=r"MisnamedTally\.side_state names 'histogramm'.*did you mean 'histogram'"):
        _score_in_worker(shipment, ["a"], [None], {})


def test_increments_of_each_kind_of_counter():
    from app.rewards.base import _increment

    before = {"same": 3, "grew": 2, "gone_to_zero": 1}
    after = {"same": 3, "grew": 5, "gone_to_zero": 0, "new": 4, "new_zero": 0, "new_one": 1}
    assert _increment(after, before) == {"grew": 3, "gone_to_zero": -1, "new": 4, "new_one": 1}
    assert _increment(7, 5) == 2 and _increment(2.5, 0.5) == 2.0
    assert _increment(torch.tensor([3.0, 1.0]), torch.tensor([1.0, 1.0])).tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match=r"^side state tensor changed shape while scoring: \[2\] -> \[3\]$"):
        _increment(torch.zeros(3), torch.zeros(2))


def test_merging_keeps_the_counters_dtype():
    reward = TallyReward()
    reward.merge_side_state({"": {"histogram": torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64), "calls": 2}})
    assert reward.histogram.dtype == torch.float32 and reward.histogram.tolist() == [1.0, 0.0, 2.0]
    assert reward.calls == 2


def test_a_counter_must_count_in_numbers():
    class Labelled(TallyReward):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            self.kinds = Counter(fine=1, label="red", flag=True)

    with pytest.raises(TypeError, match=r"^Labelled\.kinds\['label'\] is str, not a number$"):
        WeightedReward([Labelled()])
    reward = Labelled()
    del reward.kinds["label"]
    with pytest.raises(TypeError, match=r"^Labelled\.kinds\['flag'\] is bool, not a number$"):  # a flag is no count
        reward.check_side_state()
    reward.kinds = ["x"]
    with pytest.raises(
        TypeError,
        match=r"^Labelled\.kinds is a list: side state must be a number, a mapping of name -> number \(a Counter\) "
        r"or a tensor, whose increments add up$",
    ):
        reward.check_side_state()


def test_side_state_names_must_be_identifiers():
    with pytest.raises(TypeError, match=r"side_state must be a tuple of attribute names, got \('num malformed',\)"):

        class Spaced(RewardComponent):
            side_state = ("num malformed",)

            def score(self, completions, samples):
                return torch.zeros(len(completions))


def test_the_snapshot_holds_only_the_rewards_that_keep_side_state():
    """A reward without side state of its own, holding a counting reward and a plain module (a scorer's network):
    only the counting one is snapshotted."""
    outer = OuterReward()
    outer.head = torch.nn.Linear(2, 1)
    snapshot = outer.side_state_snapshot()
    assert set(snapshot) == {"inner"} and set(snapshot["inner"]) == {"calls", "kinds", "histogram"}
