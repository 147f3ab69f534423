"""What every policy module shares, called directly (no trainer run): sharding the policy under FSDP2 (a one-process
gloo group) and only then, decisions every rank takes together, and skipping non-finite updates."""

from types import SimpleNamespace

import pytest
import torch
from doubles import LinearPolicy, ToyGRPO
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.tensor import DTensor

from app.modules import NonFiniteTrainingError
from app.modules.policy_module import NONFINITE_GRADIENT
from app.parallel import ShardingPlan
from app.parallel.fsdp import MESH_DIMS, is_sharded
from app.settings import OptimizerSettings


def under(strategy):
    module = ToyGRPO(LinearPolicy())
    module._trainer = SimpleNamespace(strategy=strategy)
    return module


def test_configure_model_shards_the_policy_on_the_strategy_s_mesh_once(fsdp2):
    module = under(fsdp2)
    module.configure_model()
    weight = module.policy.weight
    assert is_sharded(module.policy) and isinstance(weight, DTensor)
    assert weight.device_mesh == fsdp2.device_mesh and weight.device_mesh.mesh_dim_names == MESH_DIMS
    assert torch.equal(weight.full_tensor(), torch.tensor([0.5, -0.25]))
    module.configure_model()  # Lightning may call it again (a second fit): the policy is not wrapped twice
    assert module.policy.weight is weight


class PolicyWithABlock(LinearPolicy):
    """The toy policy with one FSDP unit of its own below the root."""

    def __init__(self):
        super().__init__()
        self.block = torch.nn.Linear(2, 2)

    def sharding_plan(self):
        return ShardingPlan(units=[self.block], roots=[self])


@pytest.mark.parametrize("reshard", [False, True])
def test_configure_model_gives_the_policy_s_units_the_strategy_s_reshard_after_forward(fsdp2, reshard):
    """FSDP2 keeps a unit's post-forward mesh (where it reshards to) only when it reshards after forward."""
    fsdp2.reshard_after_forward = reshard
    module = ToyGRPO(PolicyWithABlock())
    module._trainer = SimpleNamespace(strategy=fsdp2)
    module.configure_model()
    unit_group = module.policy.block._get_fsdp_state()._fsdp_param_group
    assert (unit_group.post_forward_mesh_info is not None) == reshard


def test_configure_model_leaves_the_policy_alone_without_a_trainer_or_under_another_strategy():
    for module in (ToyGRPO(LinearPolicy()), under(SimpleNamespace(name="ddp"))):
        module.configure_model()
        assert not is_sharded(module.policy) and not isinstance(module.policy.weight, DTensor)


class TwoRanks(DDPStrategy):
    """Lightning's DDP strategy as rank 0 of two, the other rank voting ``other`` (one process cannot hold two ranks:
    the all-reduce adds that vote; the decision logic is Lightning's own)."""

    def __init__(self, other: bool):
        super().__init__(parallel_devices=[torch.device("cpu")])
        self.other = other

    @property
    def world_size(self) -> int:
        return 2

    def reduce(self, tensor, group=None, reduce_op="mean"):
        return tensor + int(self.other)


@pytest.mark.parametrize(("mine", "other"), [(False, False), (False, True), (True, False), (True, True)])
def test_a_decision_holds_on_every_rank_when_any_rank_makes_it(mine, other):
    assert under(TwoRanks(other))._any_rank(mine) is (mine or other)
    assert ToyGRPO(LinearPolicy())._any_rank(mine) is mine  # without a trainer: this process alone


# ------------------------------------------------------------------------------------------------ skipped updates
def automatic(max_nonfinite_steps: int = 3):
    """The toy module as an automatically optimised one (SFT, flow matching), its logged values kept."""
    module = ToyGRPO(LinearPolicy(), optimizer=OptimizerSettings(max_nonfinite_steps=max_nonfinite_steps))
    module.automatic_optimization = True
    module.logged = []
    module.log = lambda name, value, **kwargs: module.logged.append((name, value))
    return module


def optimizer_with(module, grad: list[float] | None):
    module.policy.weight.grad = None if grad is None else torch.tensor(grad)
    return torch.optim.SGD(module.policy.trainable_parameters(), lr=0.1)


def automatic_step(module, optimizer) -> None:
    """Lightning's automatic step: ``optimizer_step`` with a closure (forward and backward, nothing here) after which
    Lightning calls ``on_before_optimizer_step``, inside the optimizer's step."""
    module.optimizer_step(0, 0, optimizer, lambda: module.on_before_optimizer_step(optimizer))


@pytest.mark.parametrize("grad", [[float("nan"), 1.0], [1.0, float("inf")], [float("-inf"), 0.0]])
def test_a_non_finite_gradient_is_dropped_before_the_step_and_counted(grad):
    module = automatic()
    optimizer = optimizer_with(module, grad)
    automatic_step(module, optimizer)
    assert module.policy.weight.grad is None  # the optimizer's step leaves the weight alone
    assert torch.equal(module.policy.weight.detach(), torch.tensor([0.5, -0.25]))
    assert (module.skipped_updates, module._consecutive_skips) == (1, 1)
    assert module.logged == [("train/skipped_updates", 1.0)]


@pytest.mark.parametrize("grad", [[0.5, -2.0], None])
def test_a_finite_gradient_or_none_goes_to_the_optimizer_untouched(grad):
    module = automatic()
    module._consecutive_skips = 2
    optimizer = optimizer_with(module, grad)
    automatic_step(module, optimizer)
    kept = module.policy.weight.grad
    assert kept is None if grad is None else torch.equal(kept, torch.tensor(grad))
    assert (module.skipped_updates, module._consecutive_skips) == (0, 0)  # a finite step ends a run of skips
    assert module.logged == [("train/skipped_updates", 0.0)]


def test_manual_optimisation_checks_its_own_update_so_the_hook_does_nothing():
    module = ToyGRPO(LinearPolicy())  # manual optimisation
    module.log = lambda *args, **kwargs: pytest.fail("the hook logged under manual optimisation")
    optimizer = optimizer_with(module, [float("nan"), 0.0])
    module.on_before_optimizer_step(optimizer)
    assert torch.isnan(module.policy.weight.grad[0]) and module.skipped_updates == 0


def test_skips_are_counted_and_warned_and_the_run_stops_after_max_nonfinite_steps_in_a_row(caplog):
    module = automatic(max_nonfinite_steps=3)
    for skipped in (True, True, False, True, True):  # a finite update resets the run of skips
        if skipped:
            module._count_skip(NONFINITE_GRADIENT)
        else:
            module._count_applied()
    assert (module.skipped_updates, module._consecutive_skips) == (4, 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"skipped an update with a non-finite loss or gradient ({row} in a row, {total} in all); trainer.global_step "
        "counts it, AdamW's step count and the learning-rate schedule do not"
        for row, total in ((1, 1), (2, 2), (1, 3), (2, 4))
    ]
    message = (
        "3 consecutive updates were not finite and were skipped (the last: a non-finite loss or gradient); stopping "
        "(the weights are unchanged since the last finite update). Lower the learning rate, check the rewards and the "
        "model's dtype, or raise model.init_args.optimizer.max_nonfinite_steps"
    )
    with pytest.raises(NonFiniteTrainingError) as raised:
        module._count_skip(NONFINITE_GRADIENT)
    assert str(raised.value) == message and module.skipped_updates == 5


class SkipsItsClosure(torch.optim.SGD):
    """An optimizer whose step does not run its closure, so Lightning's ``on_before_optimizer_step`` never runs."""

    def step(self, closure=None):
        return super().step()


def test_a_dropped_step_is_not_counted_again_for_the_next_step():
    module = automatic()
    automatic_step(module, optimizer_with(module, [float("nan"), 1.0]))
    module.policy.weight.grad = torch.tensor([0.5, -2.0])
    automatic_step(module, SkipsItsClosure(module.policy.trainable_parameters(), lr=0.1))  # finite, nothing dropped
    assert (module.skipped_updates, module._consecutive_skips) == (1, 0)
    assert module.logged == [("train/skipped_updates", 1.0), ("train/skipped_updates", 1.0)]


# ------------------------------------------------------------------------------------------------ the optimizer
class PolicyWithGroups(LinearPolicy):
    """The toy policy with param groups of its own: its weight at ten times the module's rate."""

    def parameter_groups(self, learning_rate: float) -> list[dict]:
        return [{"params": [self.weight], "lr": 10 * learning_rate}]


@pytest.mark.parametrize(("policy", "rate"), [(LinearPolicy, 0.01), (PolicyWithGroups, 0.1)])
def test_the_optimizer_takes_the_policy_s_param_groups_at_their_own_rates_where_it_has_them(policy, rate):
    module = ToyGRPO(policy(), optimizer=OptimizerSettings(learning_rate=0.01, warmup_steps=0))
    optimizer = module.configure_optimizers()["optimizer"]
    (group,) = optimizer.param_groups
    assert [p is module.policy.weight for p in group["params"]] == [True] and group["lr"] == pytest.approx(rate)


def test_each_optimizer_has_a_guard_of_its_own_which_its_lightning_optimizer_shares():
    """A guard keeps its copy's memory across steps, so it stays with its optimizer, however the optimizer is passed."""
    module = ToyGRPO(LinearPolicy())
    first = torch.optim.SGD([module.policy.weight], lr=0.1)
    second = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
    guard = module._step_guard(first)
    assert module._step_guard(second) is not guard
    assert module._step_guard(first) is guard and module._step_guard(LightningOptimizer(first)) is guard
    assert module._step_guard(second) is module._step_guard(LightningOptimizer(second))


def test_optimizer_settings_given_as_a_mapping_are_built_with_the_default_rate_filled_in():
    """Hyper-parameters hold the block as a dict (a checkpoint's, or a config's): it is built into the settings."""
    from app.modules import PolicyModule

    module = PolicyModule(LinearPolicy(), {"weight_decay": 0.1}, default_learning_rate=0.5)
    assert module.optimizer_settings == OptimizerSettings(learning_rate=0.5, weight_decay=0.1)
    assert PolicyModule(LinearPolicy(), None, default_learning_rate=0.5).optimizer_settings == OptimizerSettings(0.5)


def test_the_hyper_parameters_carry_the_class_path_a_cli_resume_parses_them_against():
    """LightningCLI's ``--ckpt_path`` reads ``_class_path`` from the checkpoint's hyper-parameters to parse the rest
    against that class (without it they are parsed against LightningModule and refused)."""
    from app.modules import PolicyModule

    module = PolicyModule(LinearPolicy(), None, default_learning_rate=0.5)
    assert module.hparams["_class_path"] == "app.modules.policy_module.PolicyModule"
    assert ToyGRPO(LinearPolicy()).hparams["_class_path"] == f"{ToyGRPO.__module__}.ToyGRPO"
