"""FSDP2 / HSDP through Lightning on CPU (gloo): the sharded runs train the same weights as DDP and as one process on
the same global batch, each rank holds its share of the parameters and optimizer state, groups stay on their rank,
a sharded checkpoint resumes exactly and exports to a folder that ``from_pretrained`` loads.

The multi-process runs are launched once per module (``torchrun``, see ``fsdp_probe.py``) and shared by the tests.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from export_checks import assert_export_matches_policy
from tolerances import assert_close_training
from torch import nn

from app.errors import ConfigError
from app.parallel import FSDP2Strategy, gathered
from app.parallel.plan import repeated_blocks
from app.settings import OptimizerSettings

# The first test that needs them launches the three probe runs (about 4 minutes on 2 idle cores in all).
pytestmark = pytest.mark.timeout(1200)
HERE = Path(__file__).resolve().parent
PROBE = HERE / "fsdp_probe.py"
TWO_PROCESS_CASES = [
    "vlm_lora-ddp",
    "vlm_lora-fsdp",
    "vlm_full-ddp",
    "vlm_full-fsdp",
    "flow_lora-ddp",
    "flow_lora-fsdp",
    "vlm_lora-fsdp-same",
    "vlm_lora-fsdp-resume",
    "vlm_lora-fsdp-gc",
    "vlm_lora-fsdpbf16",
    "vlm_lora-ddp-delay1",
    "vlm_lora-fsdp-delay1-resume",
    "flowi2v_lora-ddp",
    "flowi2v_lora-fsdp",
    "flow_lora-ddp-ema",
    "flow_lora-fsdp-ema-resume",
]
FOUR_PROCESS_CASES = ["vlm_lora-ddp", "vlm_lora-hsdp", "vlm_lora-hsdp-same"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, probes) -> dict[int, Path]:
    """Output folders of the probe runs by number of processes."""
    folders = {n: tmp_path_factory.mktemp(f"fsdp{n}") for n in (1, 2, 4)}
    probes.python(PROBE, folders[1], "vlm_lora-single-same", timeout=600)
    probes.torchrun(PROBE, 2, folders[2], *TWO_PROCESS_CASES, timeout=600)
    probes.torchrun(PROBE, 4, folders[4], *FOUR_PROCESS_CASES, timeout=600)
    return folders


def weights(folder: Path, case: str) -> dict[str, torch.Tensor]:
    return torch.load(folder / f"{case}.pt", weights_only=True)


def rank_reports(folder: Path, case: str, world: int) -> list[dict]:
    return [torch.load(folder / f"{case}.rank{r}.pt", weights_only=False) for r in range(world)]


@functools.cache
def start(policy: str) -> tuple[dict[str, torch.Tensor], float]:
    """The trainable weights every probe run of ``policy`` starts from (it seeds 0, then builds) and its rate."""
    import lightning as L
    from fsdp_probe import build

    L.seed_everything(0, verbose=False)
    module, _ = build(policy)
    trainable = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    return trainable, module.optimizer_settings.learning_rate


def assert_same_weights(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], policy: str, shared_steps: int = 0
) -> None:
    """Two probe runs of ``policy`` that differ only in float32 rounding (sums in another order: reduce-scatter vs
    all-reduce, 2 vs 4 ranks, another CPU's kernels): within AdamW's bounds for the probe's steps and rate (see
    ``tests/tolerances.py``), not within a fixed fraction of the rate, which Adam's normalisation of near-zero
    gradients makes depend on the CPU. ``shared_steps``: steps before a resumed run's checkpoint."""
    from fsdp_probe import STEPS

    initial, lr = start(policy)
    # the probe fits STEPS + 1 steps
    assert_close_training(got, expected, lr=lr, steps=STEPS + 1, initial=initial, shared_steps=shared_steps)


# ----------------------------------------------------------------------------------------- multi-process runs
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["vlm_lora", "vlm_full", "flow_lora", "flowi2v_lora"])
def test_two_process_fsdp_trains_the_weights_ddp_trains(runs, policy):
    fsdp, ddp = weights(runs[2], f"{policy}-fsdp"), weights(runs[2], f"{policy}-ddp")
    assert_same_weights(fsdp, ddp, policy)
    if policy.endswith("lora"):  # LoRA's B starts at zero: the adapters must have moved
        still_zero = {k for k, v in fsdp.items() if "lora_B" in k and not v.abs().sum()}
        adapters = [k for k in fsdp if "lora_B" in k]
        # SD3's last block keeps only the image stream, so its context query gets no gradient under any strategy
        assert still_zero == {k for k, v in ddp.items() if "lora_B" in k and not v.abs().sum()}
        assert len(still_zero) <= len(adapters) // 10, f"adapters that did not train: {sorted(still_zero)[:3]}"


@pytest.mark.slow
def test_activation_checkpointing_composes_with_fsdp2(runs):
    assert_same_weights(weights(runs[2], "vlm_lora-fsdp-gc"), weights(runs[2], "vlm_lora-ddp"), "vlm_lora")


@pytest.mark.slow
def test_bf16_mixed_precision_trains_close_to_float32(runs):
    bf16, fp32 = weights(runs[2], "vlm_lora-fsdpbf16"), weights(runs[2], "vlm_lora-fsdp")
    assert all(torch.isfinite(v).all() and v.dtype == torch.float32 for v in bf16.values()), "master weights stay fp32"
    moved = [k for k, v in bf16.items() if "lora_B" in k and v.abs().sum() > 0]
    assert len(moved) == len([k for k in bf16 if "lora_B" in k])
    # bf16 compute rounds the log-probs, so Adam's steps differ in detail but not in size or direction on the whole
    cosine = torch.nn.functional.cosine_similarity(
        torch.cat([bf16[k].flatten() for k in moved]), torch.cat([fp32[k].flatten() for k in moved]), dim=0
    )
    assert cosine > 0.9, f"bf16 and float32 runs point in different directions (cosine {cosine:.2f})"


@pytest.mark.slow
def test_full_fine_tuning_moves_the_weights(runs):
    from fsdp_probe import build

    initial = {n: p.detach() for n, p in build("vlm_full")[0].named_parameters() if p.requires_grad}
    trained = weights(runs[2], "vlm_full-fsdp")
    moved = [k for k in trained if not torch.equal(trained[k], initial[k])]
    assert len(moved) == len(trained), f"{len(trained) - len(moved)} trainable tensors did not move"


@pytest.mark.slow
@pytest.mark.parametrize("world, case", [(2, "vlm_lora-fsdp-same"), (4, "vlm_lora-hsdp-same")])
def test_sharded_run_equals_one_process_on_the_same_global_batch(runs, world, case):
    assert_same_weights(weights(runs[world], case), weights(runs[1], "vlm_lora-single-same"), "vlm_lora")


@pytest.mark.slow
def test_four_process_hsdp_trains_the_weights_ddp_trains(runs):
    assert_same_weights(weights(runs[4], "vlm_lora-hsdp"), weights(runs[4], "vlm_lora-ddp"), "vlm_lora")


@pytest.mark.slow
@pytest.mark.parametrize(
    "world, case, shards",
    [
        (2, "vlm_lora-fsdp", 2),
        (2, "vlm_full-fsdp", 2),
        (2, "flow_lora-fsdp", 2),
        (4, "vlm_lora-hsdp", 2),
        (2, "vlm_lora-ddp", 1),
    ],
)
def test_each_rank_holds_its_share_of_parameters_and_optimizer_state(runs, world, case, shards):
    for report in rank_reports(runs[world], case, world):
        for what in ("params", "optimizer_state"):
            local, full = report[what]
            assert full > 0 and local <= full / shards * 1.10, f"{what}: {local} of {full} on one rank"
            assert local >= full / shards * 0.90, f"{what}: {local} of {full} is less than this rank's share"


@pytest.mark.slow
@pytest.mark.parametrize("world, case", [(2, "vlm_lora-fsdp"), (2, "flow_lora-fsdp"), (4, "vlm_lora-hsdp")])
def test_ranks_train_on_different_prompts_and_keep_their_groups(runs, world, case):
    reports = rank_reports(runs[world], case, world)
    seen = [{prompt for batch in r["batches"] for prompt in batch} for r in reports]
    for i in range(world):
        for j in range(i + 1, world):
            assert not seen[i] & seen[j], f"ranks {i} and {j} drew the same prompts"
    assert all(r["global_step"] == 3 for r in reports)


@pytest.mark.slow
@pytest.mark.parametrize("world, case", [(2, "vlm_lora-ddp"), (2, "vlm_lora-fsdp"), (4, "vlm_lora-hsdp")])
def test_reward_metrics_sync_across_ranks(runs, world, case):
    counts = range(1, world + 1)  # rank r scores r + 1 completions worth r + 1 each
    expected = sum(c * c for c in counts) / sum(counts)
    for report in rank_reports(runs[world], case, world):
        assert report["reward_mean"] == pytest.approx(expected)


@pytest.mark.slow
def test_resume_from_a_sharded_checkpoint_reproduces_the_straight_run(runs):
    checkpoint = runs[2] / "vlm_lora-fsdp-resume" / "epoch=0-step=2.ckpt"
    assert checkpoint.is_dir(), "FSDP2 should write a folder of shards"
    resumed, straight = weights(runs[2], "vlm_lora-fsdp-resume.resumed"), weights(runs[2], "vlm_lora-fsdp-resume")
    assert_same_weights(resumed, straight, "vlm_lora", shared_steps=2)  # only the step after the checkpoint may differ


@pytest.mark.slow
def test_delayed_pipeline_under_fsdp2_trains_what_ddp_trains_and_resumes_mid_pipeline(runs):
    """Each rank pipelines its own rollouts: FSDP2 with delay 1 ends where DDP with delay 1 does (and elsewhere than
    delay 0), at lag 1 with the last rollout dropped, and resuming from the step-2 checkpoint (a pending rollout in
    it) reproduces the straight run."""
    fsdp = weights(runs[2], "vlm_lora-fsdp-delay1-resume")
    assert_same_weights(fsdp, weights(runs[2], "vlm_lora-ddp-delay1"), "vlm_lora")
    with pytest.raises(AssertionError, match="trained differently"):  # more than rounding apart from delay 0
        assert_same_weights(fsdp, weights(runs[2], "vlm_lora-fsdp"), "vlm_lora")
    assert_same_weights(weights(runs[2], "vlm_lora-fsdp-delay1-resume.resumed"), fsdp, "vlm_lora", shared_steps=2)
    for report in rank_reports(runs[2], "vlm_lora-fsdp-delay1-resume", 2):
        assert report["policy_lag"] == 1.0 and report["dropped_rollouts"] == 1
        assert report["global_step"] == 3 and len(report["batches"]) == 4  # the first batch only primed the pipeline


@pytest.mark.slow
def test_the_moving_average_is_sharded_averages_what_ddp_averages_and_resumes(runs):
    """Each rank averages its shard of the weights (half of the average on each of 2 ranks); gathered, the average is
    DDP's, and a run resumed from the sharded step-2 checkpoint ends with the straight run's average. The average of
    two runs differs as much as their weights may (a convex mix of the same steps' weights): the same bounds."""
    fsdp = weights(runs[2], "flow_lora-fsdp-ema-resume.ema")
    assert fsdp.keys() == weights(runs[2], "flow_lora-fsdp-ema-resume").keys()
    assert_same_weights(fsdp, weights(runs[2], "flow_lora-ddp-ema.ema"), "flow_lora")
    assert_same_weights(weights(runs[2], "flow_lora-fsdp-ema-resume.resumed.ema"), fsdp, "flow_lora", shared_steps=2)
    trained = weights(runs[2], "flow_lora-fsdp-ema-resume")
    assert any(not torch.equal(fsdp[k], trained[k]) for k in fsdp)  # an average, not a copy of the last weights
    for report in rank_reports(runs[2], "flow_lora-fsdp-ema-resume", 2):
        local, full = report["average"]
        assert full == report["params"][1] and 0.4 * full <= local <= 0.6 * full


@pytest.mark.slow
def test_sharded_checkpoint_is_lean(runs):
    from torch.distributed.checkpoint import FileSystemReader

    checkpoint = runs[2] / "vlm_lora-fsdp-resume" / "last.ckpt"
    keys = FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("state_dict.")]
    assert model_keys and all("lora_" in k for k in model_keys), f"frozen weights saved: {model_keys[:3]}"


@pytest.mark.slow
def test_export_from_a_sharded_checkpoint_loads_with_from_pretrained(runs, tmp_path, new_samples):
    from fsdp_probe import build

    from app.export import export_from_checkpoint, find_checkpoint

    checkpoint = find_checkpoint(runs[2] / "vlm_lora-fsdp-resume" / "last.ckpt", tmp_path)
    module, _ = build("vlm_lora")
    out = export_from_checkpoint(module, checkpoint, tmp_path / "policy")

    trained, _ = build("vlm_lora")
    missing, unexpected = trained.load_state_dict(weights(runs[2], "vlm_lora-fsdp-resume"), strict=False)
    assert not unexpected and all("lora_" not in k for k in missing)
    assert_export_matches_policy(trained.policy, out, new_samples(2), min_change=1e-4)


# ---------------------------------------------------------------------------------------------- one process
def test_strategy_rejects_unknown_dtypes_and_sizes():
    with pytest.raises(ConfigError, match="param_dtype must be one of"):
        FSDP2Strategy(param_dtype="fp8")
    with pytest.raises(ConfigError, match="replicate_size and shard_size >= 1 or 'auto'"):
        FSDP2Strategy(replicate_size=0)


def test_strategy_holds_the_mixed_precision_policy():
    strategy = FSDP2Strategy(param_dtype="bfloat16", reduce_dtype="float32", replicate_size=2)
    assert strategy.mixed_precision.param_dtype == torch.bfloat16
    assert strategy.mixed_precision.reduce_dtype == torch.float32
    assert strategy.replicate_size == 2 and strategy.shard_size == "auto"


def test_repeated_blocks_are_the_outermost_matches_in_order():
    class Block(nn.Module):
        def __init__(self, inner: bool):
            super().__init__()
            self.inner = Block(False) if inner else nn.Identity()

    model = nn.Sequential(Block(True), nn.Linear(2, 2), Block(False))
    assert repeated_blocks(model, ("Block",)) == [model[0], model[2]]


def test_vlm_plan_shards_every_decoder_layer_and_the_vision_tower(new_policy):
    policy = new_policy(lora_r=None)
    policy.enable_reference()
    plan = policy.sharding_plan()
    layers = [m for net in (policy.hf_model, policy.frozen_reference) for m in net.model.language_model.layers]
    visual = [policy.hf_model.model.visual, policy.frozen_reference.model.visual]
    assert all(any(u is m for u in plan.units) for m in layers + visual)
    assert len(plan.units) == len(layers) + 2 and plan.roots == [policy]


def test_vision_adapters_shard_with_the_vision_tower_and_train_in_their_own_group(new_samples):
    """One process under FSDP2 (gloo): the LoRA adapters of the vision blocks are sharded with the tower's unit, the
    optimizer's vision group holds them, and one SFT step moves them and leaves the tower's base weights alone."""
    from types import SimpleNamespace

    from policy_helpers import vision_lora_policy, vision_split
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from app.modules import VLMSFTModule
    from app.parallel.fsdp import MESH_DIMS

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        strategy = FSDP2Strategy(reshard_after_forward=False)
        strategy._device_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=MESH_DIMS)
        module = VLMSFTModule(
            vision_lora_policy("tiny-qwen2-vl", vision_learning_rate=1e-3),
            optimizer=OptimizerSettings(learning_rate=1e-2),
        )
        module._trainer = SimpleNamespace(strategy=strategy)
        module.configure_model()
        module._trainer = None  # training_step's self.log only warns outside a trainer
        policy = module.policy
        adapters, base = vision_split(policy)
        tower_state = policy.hf_model.model.visual._get_fsdp_state()._fsdp_param_group
        sharded_in_tower = {id(fsdp_param.sharded_param) for fsdp_param in tower_state.fsdp_params}
        assert adapters and {id(p) for p in adapters.values()} <= sharded_in_tower
        assert all(isinstance(p, DTensor) for p in adapters.values())
        optimizer = module.configure_optimizers()["optimizer"]
        vision_group = optimizer.param_groups[1]
        assert vision_group["lr"] == 1e-3
        assert {id(p) for p in vision_group["params"]} == {id(p) for p in adapters.values()}
        before = {n: p.full_tensor().clone() for n, p in {**adapters, **base}.items()}
        module.training_step(new_samples(2), 0).backward()
        optimizer.step()
        assert all(not torch.equal(adapters[n].full_tensor(), before[n]) for n in adapters if "lora_B" in n)
        assert all(torch.equal(p.full_tensor(), before[n]) for n, p in base.items())
    finally:
        torch.distributed.destroy_process_group()


def test_flow_plan_shards_the_transformer_blocks():
    from app.models import FlowPolicy
    from app.settings import LoRASettings

    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=2, alpha=4))
    plan = policy.sharding_plan()
    blocks = list(policy.transformer.transformer_blocks)
    assert plan.units == blocks and plan.roots == [policy.transformer]
    assert any(part is policy.vae for part in plan.replicated)


def test_gathered_leaves_an_unsharded_module_alone():
    layer = nn.Linear(2, 2)
    before = layer.weight.detach().clone()
    with gathered(layer):
        layer.weight.data += 1
    assert torch.equal(layer.weight, before + 1)


@pytest.mark.parametrize(
    "recipe",
    [
        "vlm/grpo_qwen2_5_vl_3b",
        "vlm/grpo_qwen2_5_vl_7b_full",
        "flow/flow_grpo_sd3_5_medium",
        "flow/flow_nft_sd3_5_medium",
        "flow/flow_grpo_wan2_1_t2v_1_3b",
        "flow/flow_grpo_wan2_2_ti2v_5b",
        "flow/flow_grpo_wan2_1_i2v_14b",
    ],
)
def test_gpu_recipes_build_their_fsdp2_strategy(recipe):
    import yaml

    config = yaml.safe_load((HERE.parents[1] / "configs" / f"{recipe}.yaml").read_text())
    strategy = config["trainer"]["strategy"]
    assert strategy["class_path"] == "app.parallel.FSDP2Strategy"
    built = FSDP2Strategy(**strategy.get("init_args", {}))
    assert built.replicate_size == "auto" and built.mixed_precision.reduce_dtype == torch.float32
    callbacks = [c["class_path"] for c in config["trainer"].get("callbacks", [])]
    assert "app.export.ExportPolicy" not in callbacks, "fit-end export is refused under FSDP2"


def test_fit_end_export_is_refused_under_fsdp2_with_the_command_to_use(tmp_path):
    from types import SimpleNamespace

    from app.export import ExportPolicy

    trainer = SimpleNamespace(strategy=FSDP2Strategy(), is_global_zero=True)
    with pytest.raises(ConfigError, match="python -m app export --config"):
        ExportPolicy(str(tmp_path / "policy")).setup(trainer, None, "fit")
