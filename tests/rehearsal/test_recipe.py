"""A GPU recipe's rehearsal keeps what it tests and lists every change (app.rehearsal.recipe), and the verdicts
(app.rehearsal.run.judge) fail the runs they are there to catch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from app.errors import ConfigError
from app.rehearsal import float32_variant, gpu_recipes, plan_rehearsal
from app.rehearsal.recipe import header_task_commands
from app.rehearsal.run import Stage, judge

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GPU_RECIPES = gpu_recipes(CONFIGS)
KEPT = [  # what a rehearsal exists to test: never changed
    "trainer.precision",
    "trainer.strategy",
    "model.class_path",
    "model.init_args.policy.class_path",
    "model.init_args.policy.init_args.dtype",
    "model.init_args.policy.init_args.lora",
    "model.init_args.policy.init_args.freeze_vision",
    "model.init_args.policy.init_args.gradient_checkpointing",
    "model.init_args.optimizer.learning_rate",
    "model.init_args.optimizer.weight_decay",
    "model.init_args.grpo.beta",
    "model.init_args.sampling.group_size",
    "model.init_args.sampling.temperature",
    "model.init_args.sampling.sampler",
    "data.class_path",
]


def _get(config: dict, dotted: str):
    node = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return "<unset>"
        node = node[key]
    return node


def test_every_gpu_recipe_is_found():
    names = {p.stem for p in GPU_RECIPES}
    assert {
        "grpo_qwen2_5_vl_3b",
        "grpo_qwen2_5_vl_7b_full",
        "flow_grpo_wan2_1_i2v_14b",
        "flow_nft_sd3_5_medium",
    } <= names
    assert "quickstart" not in names  # CPU recipes are not rehearsed: they run as they are


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_a_rehearsal_keeps_what_it_tests(recipe, tmp_path):
    written = yaml.safe_load(recipe.read_text())
    plan = plan_rehearsal(recipe, tmp_path)
    for field in KEPT:
        assert _get(plan.config, field) == _get(written, field), field
    assert plan.config["model"]["init_args"]["policy"]["init_args"]["model"].startswith("tiny-")
    assert plan.config["trainer"]["accelerator"] == "cpu"
    assert plan.processes == 2  # every GPU recipe runs across processes (DDP or FSDP2)
    rewards = [r["class_path"] for r in plan.config["model"]["init_args"].get("rewards", [])]
    assert rewards[: len(written["model"]["init_args"].get("rewards", []))] == [
        r["class_path"] for r in written["model"]["init_args"].get("rewards", [])
    ]  # the recipe's rewards first, as written


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_every_change_is_listed(recipe, tmp_path):
    written = yaml.safe_load(recipe.read_text())
    plan = plan_rehearsal(recipe, tmp_path)
    listed = {c.field for c in plan.changes}

    def walk(a, b, prefix=""):
        if isinstance(a, dict) and isinstance(b, dict):
            for key in set(a) | set(b):
                yield from walk(a.get(key), b.get(key), f"{prefix}{key}.")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                yield from walk(x, y, f"{prefix}{i}.")
        elif a != b:
            yield prefix.rstrip(".")

    for field in walk(written, plan.config):
        assert any(field == f or field.startswith(f + ".") for f in listed), f"{field} changed but is not listed"


def test_kernels_that_need_cuda_are_swapped_and_listed(tmp_path):
    plan = plan_rehearsal(CONFIGS / "vlm/grpo_qwen2_5_vl_3b.yaml", tmp_path)
    policy = plan.config["model"]["init_args"]["policy"]["init_args"]
    assert policy["use_liger_kernel"] is False and policy["model"] == "tiny-qwen2.5-vl"
    change = next(c for c in plan.changes if c.field.endswith("use_liger_kernel"))
    assert change.recipe is True and "CUDA" in change.why


def test_learned_scorers_are_rehearsed_with_the_embedded_tiny_scorers_and_listed(tmp_path):
    plan = plan_rehearsal(CONFIGS / "flow/flow_grpo_sd3_5_medium_clip_vbvr.yaml", tmp_path)
    clip = next(r for r in plan.config["model"]["init_args"]["rewards"] if r["class_path"].endswith("CLIPScoreReward"))
    assert clip["init_args"]["model"] == "tiny-clip" and clip["init_args"]["weight"] == 0.2
    change = next(c for c in plan.changes if c.field.endswith(".init_args.model") and "rewards" in c.field)
    assert change.recipe == "openai/clip-vit-large-patch14" and "no download" in change.why


def test_a_vlm_judge_reward_is_rehearsed_with_the_tiny_model_of_its_family(tmp_path):
    text = (CONFIGS / "vlm/grpo_qwen2_5_vl_3b.yaml").read_text()  # its header's data commands kept
    judge = (
        "      - class_path: app.rewards.learned.VLMJudgeReward\n"
        "        init_args: {model: Qwen/Qwen2.5-VL-7B-Instruct, device: 'cuda:1'}\n"
    )
    path = tmp_path / "judged.yaml"
    path.write_text(text.replace("    rewards:\n", "    rewards:\n" + judge, 1))
    plan = plan_rehearsal(path, tmp_path)
    judged = next(r for r in plan.config["model"]["init_args"]["rewards"] if r["class_path"].endswith("VLMJudgeReward"))
    assert judged["init_args"] == {"model": "tiny-qwen2.5-vl", "device": None}


@pytest.mark.parametrize(
    ("recipe", "module", "added"),
    [
        ("flow/flow_grpo_sd3_5_medium.yaml", "app.modules.FlowGRPOModule", ["app.rehearsal.rewards.PixelMeanReward"]),
        ("flow/flow_grpo_sd3_5_medium.yaml", "app.modules.FlowNFTModule", ["app.rehearsal.rewards.PixelMeanReward"]),
        ("vlm/grpo_qwen2_5_vl_3b.yaml", "app.modules.VLMGRPOModule", ["app.rehearsal.rewards.CharacterCountReward"]),
        ("vlm/reason_rft_counting_sft_qwen2_vl_2b.yaml", "app.modules.VLMSFTModule", []),
    ],
)
def test_a_module_trained_by_rewards_is_rehearsed_with_a_spread_of_rewards(recipe, module, added, tmp_path):
    """Whatever its class is called, a module trained by its rewards gets the variety reward; one that trains on no
    reward (supervised fine-tuning) does not."""
    text = (CONFIGS / recipe).read_text()  # its header's data commands kept
    path = tmp_path / "recipe.yaml"
    path.write_text(re.sub(r"(?m)^model:\n  class_path: .*$", f"model:\n  class_path: {module}", text, count=1))
    written = yaml.safe_load(path.read_text())
    assert written["model"]["class_path"] == module
    plan = plan_rehearsal(path, tmp_path)
    rewards = [r["class_path"] for r in plan.config["model"]["init_args"].get("rewards", [])]
    assert rewards[len(written["model"]["init_args"].get("rewards", [])) :] == added


def test_a_model_class_that_cannot_be_imported_is_an_error_naming_it(tmp_path):
    text = (CONFIGS / "flow/flow_grpo_sd3_5_medium.yaml").read_text()
    path = tmp_path / "recipe.yaml"
    path.write_text(text.replace("class_path: app.modules.FlowGRPOModule", "class_path: app.modules.FlowPPOModule"))
    with pytest.raises(ConfigError, match="model.class_path 'app.modules.FlowPPOModule'"):
        plan_rehearsal(path, tmp_path)


def test_the_header_commands_write_the_shards_the_data_module_reads(tmp_path):
    recipe = CONFIGS / "vlm/consistency_spatial_qwen2_5_vl_3b.yaml"
    assert header_task_commands(recipe.read_text())[0][:3] == ["spatial", "--out", "data/spatial/train"]
    plan = plan_rehearsal(recipe, tmp_path / "run", tmp_path / "data")
    outs = [args[args.index("--out") + 1] for args in plan.data_commands]
    assert outs == [str(tmp_path / "data/spatial/train"), str(tmp_path / "data/spatial/val")]
    assert all(args[args.index("--num") + 1] == "16" for args in plan.data_commands)
    assert plan.config["data"]["init_args"]["train_urls"] == str(tmp_path / "data/spatial/train/spatial-*.tar")


def test_shard_urls_without_a_generator_command_are_an_error(tmp_path):
    recipe = tmp_path / "r.yaml"
    config = yaml.safe_load((CONFIGS / "vlm/core_trisr_qwen3_vl_4b.yaml").read_text())
    recipe.write_text(yaml.safe_dump(config))  # the header comment (with its commands) is gone
    with pytest.raises(ConfigError, match="header has no 'python -m app.tasks"):
        plan_rehearsal(recipe, tmp_path)


def test_a_model_of_no_known_family_is_an_error_naming_the_field(tmp_path):
    recipe = tmp_path / "r.yaml"
    config = yaml.safe_load((CONFIGS / "vlm/grpo_qwen2_5_vl_3b.yaml").read_text())
    config["model"]["init_args"]["policy"]["init_args"]["model"] = "some-org/llava-13b"
    recipe.write_text("# python -m app.tasks dots --out data/x --num 4\n" + yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="policy.init_args.model = 'some-org/llava-13b'"):
        plan_rehearsal(recipe, tmp_path)


def test_the_float32_variant_is_float32_throughout(tmp_path):
    plan = plan_rehearsal(CONFIGS / "flow/flow_grpo_wan2_1_i2v_14b.yaml", tmp_path)
    config, changes = float32_variant(plan.config)
    assert config["trainer"]["precision"] == "32-true"
    assert config["model"]["init_args"]["policy"]["init_args"]["dtype"] == "float32"
    assert config["trainer"]["strategy"]["init_args"]["param_dtype"] is None
    assert {c.field for c in changes} >= {"trainer.precision", "model.init_args.policy.init_args.dtype"}
    assert plan.config["trainer"]["precision"] == "bf16-mixed"  # the rehearsal itself is untouched


# ------------------------------------------------------------------------------------------------- verdicts
def _report(trainable="float32", compute="bfloat16", share=0.99, step=2, finite=True) -> dict:
    return {
        "global_step": step,
        "trainable": {trainable: 100},
        "frozen": {},
        "gradients": {trainable: 100},
        "optimizer_state": {trainable: 200},
        "compute": {compute: 10},
        "losses": [0.1],
        "losses_finite": finite,
        "changed_share": share,
        "skipped_updates": 0,
    }


def _stages(tmp_path: Path, written: dict, resumed: dict, reference: dict) -> dict[str, Stage]:
    stages = {}
    for name, report in (("written", written), ("resumed", resumed), ("float32", reference)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(report))
        stages[name] = Stage("r", name, tmp_path / f"{name}.yaml", path, 2)
    return stages


def test_a_good_rehearsal_passes(tmp_path):
    stages = _stages(tmp_path, _report(step=1), _report(share=0.985), _report("float32", "float32", share=0.99))
    assert judge("r", stages, None, tmp_path).passed


def test_bfloat16_master_weights_fail(tmp_path):
    """What bf16-true gave grpo_qwen2_5_vl_3b before the fix: bf16 adapters changed 50% of elements, float32 99%."""
    resumed = _report("bfloat16", share=0.5005)
    verdict = judge(
        "r", _stages(tmp_path, _report(step=1), resumed, _report("float32", "float32", 0.9923)), None, tmp_path
    )
    assert not verdict.passed
    assert verdict.checks["float32 master weights"] is False
    assert verdict.checks["changed share as float32's"] is False


def test_a_changed_share_off_by_more_than_a_point_fails(tmp_path):
    stages = _stages(tmp_path, _report(step=1), _report(share=0.97), _report("float32", "float32", share=0.99))
    verdict = judge("r", stages, None, tmp_path)
    assert verdict.checks == {**verdict.checks, "changed share as float32's": False}
    assert verdict.checks["float32 master weights"] is True


def test_nothing_changed_in_float32_fails_too(tmp_path):
    """A reference that did not train cannot vouch for anything (zero advantages: the variety reward is missing)."""
    stages = _stages(tmp_path, _report(step=1), _report(share=0.0), _report("float32", "float32", share=0.0))
    assert judge("r", stages, None, tmp_path).checks["changed share as float32's"] is False


def test_non_finite_losses_a_missed_resume_and_a_failed_export_fail(tmp_path):
    stages = _stages(tmp_path, _report(step=1), _report(step=1, finite=False), _report("float32", "float32"))
    verdict = judge("r", stages, "export exited with 1", tmp_path)
    assert {k for k, ok in verdict.checks.items() if not ok} == {
        "checkpoint saved and resumed",
        "losses finite",
        "exported",
    }
