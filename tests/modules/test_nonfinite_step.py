"""A non-finite value that arises inside ``optimizer.step`` (after the gradient check: a callback's
``on_before_optimizer_step``, a fused kernel, a bad optimizer state) never reaches the weights, the optimizer state or a
checkpoint (app.modules.finite_step): the step is undone on every rank, bit for bit, and counted as a skipped update,
or, with ``restore_nonfinite_steps=False``, the run stops at once; a checkpoint holding a NaN is never written."""

import math
from types import SimpleNamespace

import pytest
import torch
from doubles import LinearPolicy, ToyGRPO, as_rank_0_of
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.distributed.tensor import DTensor

from app.modules import NonFiniteCheckpointError, NonFiniteTrainingError, VLMGRPOModule, VLMSFTModule
from app.modules.finite_step import named_tensors
from app.modules.policy_module import check_finite_checkpoint
from app.rewards import RewardComponent
from app.settings import EMASettings, GRPOSettings, OptimizerSettings, SamplingSettings


class LengthReward(RewardComponent):
    value_range = (0.0, 1.0)

    def score(self, completions, samples):
        return torch.tensor([min(len(c) / 20, 1.0) for c in completions])


def grpo(new_policy, ema=None, rewards=(LengthReward,), grpo=None, **optimizer):
    """A VLM GRPO module (manual optimisation); ``optimizer`` sets :class:`OptimizerSettings` fields."""
    return VLMGRPOModule(
        new_policy("tiny-qwen2-vl", lora_r=4),
        [reward() for reward in rewards],
        SamplingSettings(group_size=2, max_new_tokens=6),
        grpo=grpo,
        optimizer=OptimizerSettings(learning_rate=1e-2, **optimizer),
        eval_max_new_tokens=4,
        ema=ema,
    )


def sft(new_policy, ema=None, **optimizer):
    """A VLM SFT module (automatic optimisation); ``optimizer`` sets :class:`OptimizerSettings` fields."""
    return VLMSFTModule(
        new_policy("tiny-qwen2-vl", lora_r=4),
        optimizer=OptimizerSettings(learning_rate=1e-2, **optimizer),
        eval_max_new_tokens=4,
        ema=ema,
    )


MODULES = {"grpo": grpo, "sft": sft}  # manual and automatic optimisation


# ------------------------------------------------------------------------------------------------- helpers
def copied_state(module, optimizer) -> tuple[list[torch.Tensor], dict]:
    """Copies of the trainable parameters and of the optimizer's whole state."""
    parameters = [p.detach().clone() for p in module.policy.trainable_parameters()]
    state = {
        index: {key: value.clone() if torch.is_tensor(value) else value for key, value in entry.items()}
        for index, entry in optimizer.state_dict()["state"].items()
    }
    return parameters, state


def same_state(first, second) -> bool:
    (params_a, state_a), (params_b, state_b) = first, second
    if len(params_a) != len(params_b) or state_a.keys() != state_b.keys():
        return False
    if not all(torch.equal(a, b) for a, b in zip(params_a, params_b, strict=True)):
        return False
    for index, entry in state_a.items():
        other = state_b[index]
        if entry.keys() != other.keys():
            return False
        for key, value in entry.items():
            if torch.is_tensor(value) != torch.is_tensor(other[key]):
                return False
            if not (torch.equal(value, other[key]) if torch.is_tensor(value) else value == other[key]):
                return False
    return True


class Watch(Callback):
    """Copies the trainable parameters and the optimizer state when training batch ``at`` (0, 1, ... over the run)
    starts, and says at its end whether they stayed bit for bit the same (``unchanged``)."""

    def __init__(self, at: int):
        self.at, self.seen, self.before, self.unchanged = at, 0, None, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.seen == self.at:
            self.before = copied_state(module, trainer.optimizers[0])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.seen == self.at:
            self.unchanged = same_state(self.before, copied_state(module, trainer.optimizers[0]))
        self.seen += 1


class PoisonBeforeStep(Callback):
    """The reported drill: at training batch ``at``, make the first trainable parameter's gradient NaN in the
    callback's ``on_before_optimizer_step``, which Lightning calls inside ``LightningOptimizer.step``."""

    def __init__(self, at: int):
        self.at, self.seen = at, 0

    def on_before_optimizer_step(self, trainer, module, optimizer):
        if self.seen == self.at:
            grad = module.policy.trainable_parameters()[0].grad
            grad.view(-1)[0] = math.nan

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen += 1


class PoisonInsideStep(Callback):
    """At training batch ``at``, the optimizer step itself leaves a NaN in one parameter and in another one's
    ``exp_avg`` (a step post-hook of the optimizer, as a faulty fused kernel would)."""

    def __init__(self, at: int):
        self.at, self.seen, self.fired = at, 0, False

    def on_train_start(self, trainer, module):
        trainer.optimizers[0].register_step_post_hook(self._poison)

    def _poison(self, optimizer, args, kwargs):
        if self.seen != self.at:
            return
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        with torch.no_grad():
            parameters[0].view(-1)[0] = math.nan
            optimizer.state[parameters[1]]["exp_avg"].view(-1)[0] = math.inf
        self.fired = True

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen += 1


class PoisonAfterBackward(Callback):
    """At training batch ``at``, a NaN in the first trainable parameter's gradient after each backward: the module's
    own check, before the optimizer step, finds it."""

    def __init__(self, at: int):
        self.at, self.seen = at, 0

    def on_after_backward(self, trainer, module):
        if self.seen == self.at:
            module.policy.trainable_parameters()[0].grad.view(-1)[0] = math.nan

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen += 1


class Batches(Callback):
    """How many training batches ran."""

    def __init__(self):
        self.count = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.count += 1


def counters(module, trainer) -> dict[str, int]:
    """The step counts of the trainer, AdamW (0 before its first applied step), the schedule and the average."""
    optimizer = trainer.optimizers[0]
    adamw = optimizer.state_dict()["state"]
    return {
        "global_step": trainer.global_step,
        "adamw": int(adamw[0]["step"]) if adamw else 0,
        "schedule": trainer.lr_scheduler_configs[0].scheduler.last_epoch,
        "average": int(module.policy_ema.steps),
    }


def every_step(tmp_path) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, save_last=True)


def nonfinite_in(path) -> list[str]:
    """The weights and optimizer-state tensors of the checkpoint file ``path`` that hold a NaN or inf."""
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["state_dict"] and checkpoint["optimizer_states"]
    named = [
        *named_tensors(checkpoint["state_dict"], "state_dict"),
        *named_tensors(checkpoint["optimizer_states"], "opt"),
    ]
    return [name for name, tensor in named if tensor.is_floating_point() and not torch.isfinite(tensor).all()]


def all_finite(module, optimizer) -> bool:
    parameters, state = copied_state(module, optimizer)
    tensors = parameters + [v for entry in state.values() for v in entry.values() if torch.is_tensor(v)]
    return all(torch.isfinite(t).all() for t in tensors)


# ------------------------------------------------------------------------------------------------- the drills
@pytest.mark.parametrize("kind", ["grpo", "sft"])
def test_a_gradient_poisoned_in_on_before_optimizer_step_is_skipped_counted_and_never_saved(
    kind, new_policy, new_datamodule, fit, tmp_path
):
    module = MODULES[kind](new_policy)
    watch = Watch(at=1)
    trainer, recorder = fit(
        module,
        new_datamodule(),
        max_steps=3,
        callbacks=[PoisonBeforeStep(at=1), watch, every_step(tmp_path)],
        enable_checkpointing=True,
    )
    assert module.skipped_updates == 1 and recorder.metric("train/skipped_updates")[-1] == 1.0
    assert watch.unchanged is True, "the poisoned step changed the weights or the optimizer state"
    optimizer = trainer.optimizers[0]
    assert all_finite(module, optimizer)
    assert float(optimizer.state_dict()["state"][0]["step"]) == 2, "two finite updates out of three batches"
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt", "last.ckpt"]
    for name in saved:
        assert nonfinite_in(tmp_path / name) == [], name


@pytest.mark.parametrize("kind", ["grpo", "sft"])
def test_a_nan_the_optimizer_step_itself_writes_is_undone_bit_for_bit_and_counted(
    kind, new_policy, new_datamodule, fit, tmp_path
):
    module = MODULES[kind](new_policy)
    poison, watch = PoisonInsideStep(at=1), Watch(at=1)
    trainer, recorder = fit(
        module,
        new_datamodule(),
        max_steps=3,
        callbacks=[poison, watch, every_step(tmp_path)],
        enable_checkpointing=True,
    )
    assert poison.fired
    assert watch.unchanged is True, "the weights and AdamW's state (step counter included) must be the pre-step ones"
    assert module.skipped_updates == 1 and recorder.metric("train/skipped_updates")[-1] == 1.0
    optimizer = trainer.optimizers[0]
    assert all_finite(module, optimizer)
    assert float(optimizer.state_dict()["state"][0]["step"]) == 2
    for path in tmp_path.iterdir():
        assert nonfinite_in(path) == [], path.name


@pytest.mark.parametrize("kind", ["grpo", "sft"])
def test_every_update_counts_in_global_step_and_the_average_and_only_applied_ones_in_adamw_and_the_schedule(
    kind, new_policy, new_datamodule, fit
):
    module = MODULES[kind](new_policy, ema=EMASettings(decay=0.5), warmup_steps=10)
    batches = Batches()
    trainer, recorder = fit(
        module,
        new_datamodule(),
        max_steps=4,
        callbacks=[PoisonAfterBackward(at=1), PoisonInsideStep(at=2), batches],
    )
    assert module.skipped_updates == 2 and recorder.metric("train/skipped_updates")[-1] == 2.0
    assert counters(module, trainer) == {"global_step": 4, "adamw": 2, "schedule": 2, "average": 4}
    assert batches.count == 4, "an update left out before its optimizer step is a step of the trainer too"


class Constant(RewardComponent):
    value_range = (0.0, 1.0)

    def score(self, completions, samples):
        return torch.ones(len(completions))


def test_an_empty_update_counts_in_global_step_and_the_average_not_in_adamw_or_the_schedule(
    new_policy, new_datamodule, fit
):
    module = grpo(
        new_policy, ema=EMASettings(decay=0.5), rewards=(Constant,), grpo=GRPOSettings(drop_zero_std_groups=True)
    )
    trainer, recorder = fit(module, new_datamodule(), max_steps=2)
    assert module.empty_updates == 2 and recorder.metric("train/empty_updates")[-1] == 2.0
    assert counters(module, trainer) == {"global_step": 2, "adamw": 0, "schedule": 0, "average": 2}


def test_the_log_of_a_skipped_update_names_its_cause_and_the_counters(new_policy, new_datamodule, fit, caplog):
    with caplog.at_level("WARNING", logger="app.modules.policy_module"):
        fit(grpo(new_policy), new_datamodule(), max_steps=2, callbacks=[PoisonInsideStep(at=0)])
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped an update")]
    assert line.startswith("skipped an update with an optimizer step that left NaN or inf behind, undone (1 in a row")
    assert "trainer.global_step counts it, AdamW's step count and the learning-rate schedule do not" in line


@pytest.mark.parametrize("kind", ["grpo", "sft"])
def test_without_restore_a_nonfinite_step_stops_the_run_naming_the_option_and_nothing_nonfinite_is_saved(
    kind, new_policy, new_datamodule, fit, tmp_path
):
    module = MODULES[kind](new_policy, restore_nonfinite_steps=False)
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(NonFiniteTrainingError, match="restore_nonfinite_steps"):
        fit(
            module,
            new_datamodule(),
            max_steps=4,
            callbacks=[PoisonInsideStep(at=1), every_step(checkpoints)],
            enable_checkpointing=True,
        )
    saved = sorted(p.name for p in checkpoints.iterdir())
    assert saved == ["epoch=0-step=1.ckpt", "last.ckpt"], "the run stops in the step that went non-finite"
    for name in saved:
        assert nonfinite_in(checkpoints / name) == [], name
    assert not all(torch.isfinite(p).all() for p in module.policy.trainable_parameters()), "nothing was restored"
    trainer = module.trainer
    with pytest.raises(NonFiniteCheckpointError, match="non-finite"):
        trainer.save_checkpoint(tmp_path / "after.ckpt")
    assert not (tmp_path / "after.ckpt").exists()


# ------------------------------------------------------------------------------------------------- checkpoints
def test_on_save_checkpoint_refuses_a_nan_weight_naming_its_key_and_the_count():
    module = ToyGRPO(LinearPolicy())
    checkpoint = {
        "state_dict": {"policy.weight": torch.tensor([math.nan, 1.0]), "policy.other": torch.tensor([math.inf])},
        "optimizer_states": [],
    }
    with pytest.raises(NonFiniteCheckpointError, match=r"2 of 2 tensors .*'state_dict/policy\.weight'"):
        module.on_save_checkpoint(checkpoint)


def test_on_save_checkpoint_refuses_a_nan_optimizer_state_naming_its_key():
    module = ToyGRPO(LinearPolicy())
    state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.tensor([0.0, math.nan]), "exp_avg_sq": torch.ones(2)}}
    checkpoint = {
        "state_dict": {"policy.weight": torch.tensor([0.5, 1.0])},
        "optimizer_states": [{"state": state, "param_groups": [{"lr": 0.1, "params": [0]}]}],
    }
    with pytest.raises(NonFiniteCheckpointError, match=r"1 of 4 tensors .*'optimizer_states/0/state/0/exp_avg'"):
        module.on_save_checkpoint(checkpoint)
    assert issubclass(NonFiniteCheckpointError, NonFiniteTrainingError)


def test_on_save_checkpoint_passes_a_finite_checkpoint_and_integer_tensors():
    module = ToyGRPO(LinearPolicy())
    checkpoint = {"state_dict": {"policy.weight": torch.tensor([0.5, 1.0]), "count": torch.tensor([3])}}
    module.on_save_checkpoint(checkpoint)
    assert torch.equal(checkpoint["state_dict"]["policy.weight"], torch.tensor([0.5, 1.0]))


# ------------------------------------------------------------------------------------------------- the guard
def adamw_after_one_step(module) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(module.policy.trainable_parameters(), lr=0.1)
    module.policy.weight.grad = torch.ones_like(module.policy.weight)
    optimizer.step()
    module.policy.weight.grad = torch.full_like(module.policy.weight, 2.0)
    return optimizer


def raw_copy(optimizer, parameter) -> tuple[torch.Tensor, dict]:
    local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
    state = {k: (v.to_local() if isinstance(v, DTensor) else v).clone() for k, v in optimizer.state[parameter].items()}
    return local.detach().clone(), state


def poison_inside(optimizer, parameter, key: str = "exp_avg"):
    def hook(opt, args, kwargs):
        with torch.no_grad():
            value = optimizer.state[parameter][key]
            (value.to_local() if isinstance(value, DTensor) else value).view(-1)[0] = math.nan

    return optimizer.register_step_post_hook(hook)


def test_the_guard_puts_the_parameter_and_adamw_state_back_in_place_step_counter_included():
    module = ToyGRPO(LinearPolicy())
    optimizer = adamw_after_one_step(module)
    weight = module.policy.weight
    before_weight, before_state = raw_copy(optimizer, weight)
    tensors = dict(optimizer.state[weight])
    poison_inside(optimizer, weight)
    assert module.guarded_step(optimizer) is True
    after_weight, after_state = raw_copy(optimizer, weight)
    assert torch.equal(after_weight, before_weight)
    assert after_state.keys() == before_state.keys() and float(after_state["step"]) == 1.0
    for key, value in before_state.items():
        assert torch.equal(after_state[key], value), key
        assert optimizer.state[weight][key] is tensors[key], "restored in place: the same tensors"


def test_the_guard_undoes_a_first_step_by_leaving_no_optimizer_state():
    module = ToyGRPO(LinearPolicy())
    weight = module.policy.weight
    before = weight.detach().clone()
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.ones_like(weight)
    poison_inside(optimizer, weight, key="exp_avg_sq")
    assert module.guarded_step(optimizer) is True
    assert torch.equal(weight.detach(), before) and not optimizer.state.get(weight)
    optimizer.step()  # AdamW starts its state afresh, as if the undone step never happened
    assert float(optimizer.state[weight]["step"]) == 1.0


def test_a_finite_step_is_kept():
    module = ToyGRPO(LinearPolicy())
    optimizer = adamw_after_one_step(module)
    before = module.policy.weight.detach().clone()
    assert module.guarded_step(optimizer) is False
    assert not torch.equal(module.policy.weight.detach(), before)
    assert float(optimizer.state[module.policy.weight]["step"]) == 2.0


def test_a_step_that_went_nonfinite_on_another_rank_is_undone_on_this_one_too():
    module = ToyGRPO(LinearPolicy())
    votes = []
    module._trainer = SimpleNamespace(
        strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: votes.append(decision) or True)
    )
    optimizer = adamw_after_one_step(module)
    before_weight, before_state = raw_copy(optimizer, module.policy.weight)
    assert module.guarded_step(optimizer) is True  # finite here, non-finite on the other rank
    assert votes == [False]
    after_weight, after_state = raw_copy(optimizer, module.policy.weight)
    assert torch.equal(after_weight, before_weight) and float(after_state["step"]) == 1.0


def test_without_restore_the_guard_keeps_no_copy_and_raises_naming_the_option():
    module = ToyGRPO(LinearPolicy())
    module.optimizer_settings.restore_nonfinite_steps = False
    optimizer = adamw_after_one_step(module)
    poison_inside(optimizer, module.policy.weight)
    with pytest.raises(NonFiniteTrainingError, match="restore_nonfinite_steps"):
        module.guarded_step(optimizer)


def test_the_restore_option_is_a_hyperparameter_on_by_default(new_policy):
    assert sft(new_policy).hparams["optimizer"]["restore_nonfinite_steps"] is True
    for off in (sft(new_policy, restore_nonfinite_steps=False), grpo(new_policy, restore_nonfinite_steps=False)):
        assert off.optimizer_settings.restore_nonfinite_steps is False
        assert off.hparams["optimizer"]["restore_nonfinite_steps"] is False


def test_under_fsdp2_the_guard_restores_each_rank_s_shards_of_the_parameters_and_their_state(fsdp2):
    module = ToyGRPO(LinearPolicy())
    fsdp2.parallel_devices = [torch.device("cpu")]  # the decision is an all-reduce over the one-process group
    module._trainer = SimpleNamespace(strategy=fsdp2, optimizers=[])
    module.configure_model()
    weight = module.policy.weight
    assert isinstance(weight, DTensor)
    optimizer = adamw_after_one_step(module)
    assert isinstance(optimizer.state[weight]["exp_avg"], DTensor)
    before_weight, before_state = raw_copy(optimizer, weight)
    poison_inside(optimizer, weight)
    assert module.guarded_step(optimizer) is True
    after_weight, after_state = raw_copy(optimizer, weight)
    assert torch.equal(after_weight, before_weight)
    for key, value in before_state.items():
        assert torch.equal(after_state[key], value), key
    checkpoint = {"state_dict": {"policy.weight": weight.detach().clone()}}
    with torch.no_grad():
        checkpoint["state_dict"]["policy.weight"].to_local().fill_(math.nan)
    with pytest.raises(NonFiniteCheckpointError, match="policy.weight"):
        module.on_save_checkpoint(checkpoint)


def test_the_guard_allocates_its_copy_once_and_forgets_it_between_steps():
    module = ToyGRPO(LinearPolicy())
    optimizer = adamw_after_one_step(module)
    assert not module.guarded_step(optimizer)
    guard = module._step_guard(optimizer)  # the same guard, ready for the next step: no copy yet
    assert not guard.restorable
    first = [b.data_ptr() for b in guard._buffers]
    module.policy.weight.grad = torch.ones_like(module.policy.weight)
    assert not module.guarded_step(optimizer)
    assert [b.data_ptr() for b in module._step_guard(optimizer)._buffers] == first  # reused, not allocated again


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.complex64])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_the_check_finds_any_nonfinite_value_in_any_floating_dtype(dtype, value):
    from app.modules.finite_step import nonfinite_flags

    clean, dirty = torch.zeros(5, 3, dtype=dtype), torch.zeros(5, 3, dtype=dtype)
    dirty[4, 2] = value
    empty, counts = torch.zeros(0, dtype=dtype), torch.tensor([1, 2])
    assert nonfinite_flags([clean, dirty, empty, counts]) == [False, True, False, False]


# ------------------------------------------------------------------------------------------------- what it says
def other_rank_votes(module, nonfinite: bool) -> None:
    """``module`` as one rank of several, another rank voting ``nonfinite`` in every any-rank decision."""
    strategy = SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision or nonfinite)
    module._trainer = SimpleNamespace(strategy=strategy)


def stop_message(where: str, reason: str) -> str:
    return (
        f"the optimizer step left NaN or inf in the weights or the optimizer state ({where}) and {reason}; stopping "
        "before anything trains on them or saves them (the weights in memory are not finite). Set "
        "model.init_args.optimizer.restore_nonfinite_steps: true to undo and skip such a step, or lower the learning "
        "rate and check the model's dtype"
    )


class SkipsItsClosure(torch.optim.AdamW):
    """An optimizer whose step does not run its closure, so the guard never takes its copy."""

    def step(self, closure=None):
        return super().step()


def test_without_restore_the_error_says_how_many_tensors_went_nonfinite_here_and_why_nothing_is_put_back():
    module = ToyGRPO(LinearPolicy())
    module.optimizer_settings.restore_nonfinite_steps = False
    optimizer = adamw_after_one_step(module)
    poison_inside(optimizer, module.policy.weight)
    with pytest.raises(NonFiniteTrainingError) as raised:
        module.guarded_step(optimizer)
    reason = "restore_nonfinite_steps is off, so no copy was kept to put back"
    assert str(raised.value) == stop_message("1 non-finite tensor(s) on this rank", reason)


def test_a_step_whose_closure_never_ran_cannot_be_undone_and_the_error_says_so():
    module = ToyGRPO(LinearPolicy())
    other_rank_votes(module, nonfinite=True)
    optimizer = SkipsItsClosure([module.policy.weight], lr=0.1)
    module.policy.weight.grad = torch.ones_like(module.policy.weight)
    with pytest.raises(NonFiniteTrainingError) as raised:
        module.guarded_step(optimizer, closure=lambda: None)
    reason = "the optimizer never ran its closure, so no copy was taken (restore_nonfinite_steps needs one)"
    assert str(raised.value) == stop_message("non-finite tensors on another rank", reason)


def test_an_undone_step_is_warned_about_saying_where_it_went_nonfinite(caplog):
    module = ToyGRPO(LinearPolicy())
    optimizer = adamw_after_one_step(module)
    poison_inside(optimizer, module.policy.weight)
    assert module.guarded_step(optimizer) is True
    module = ToyGRPO(LinearPolicy())
    other_rank_votes(module, nonfinite=True)
    assert module.guarded_step(adamw_after_one_step(module)) is True
    warnings = [r.getMessage() for r in caplog.records if r.name == "app.modules.policy_module"]
    assert warnings == [
        f"the optimizer step left NaN or inf in the weights or the optimizer state ({where}): put back the values "
        "from before the step"
        for where in ("1 non-finite tensor(s) on this rank", "non-finite tensors on another rank")
    ]


def refusal(nonfinite: int, checked: int, first: str) -> str:
    return (
        f"refusing to write a checkpoint in which {nonfinite} of {checked} tensors hold NaN or inf, the first {first}; "
        "nothing non-finite is saved. Resume from an earlier checkpoint (a non-finite optimizer step is undone and "
        "skipped unless model.init_args.optimizer.restore_nonfinite_steps is false)"
    )


def test_a_refused_checkpoint_names_its_first_nonfinite_tensor_and_the_counts():
    checkpoint = {"state_dict": {"a": torch.ones(2), "b": torch.tensor([math.inf]), "c": torch.tensor([math.nan])}}
    with pytest.raises(NonFiniteCheckpointError) as raised:
        check_finite_checkpoint(checkpoint)
    assert str(raised.value) == refusal(2, 3, "'state_dict/b'")


def test_a_checkpoint_nonfinite_on_another_rank_is_refused_on_this_one_naming_that_rank(monkeypatch):
    given = as_rank_0_of(monkeypatch, others=[(1, 3, "state_dict/policy.weight")])
    with pytest.raises(NonFiniteCheckpointError) as raised:
        check_finite_checkpoint({"state_dict": {"policy.weight": torch.ones(2)}, "optimizer_states": []})
    assert given == [(0, 1, None)], "this rank's count of non-finite tensors, of tensors, and its first"
    assert str(raised.value) == refusal(1, 4, "'state_dict/policy.weight' (rank 1)")
    as_rank_0_of(monkeypatch, others=[(0, 3, None)])
    check_finite_checkpoint({"state_dict": {"policy.weight": torch.ones(2)}})  # finite on every rank
