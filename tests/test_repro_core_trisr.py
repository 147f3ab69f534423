"""benchmarks/repro/core_trisr.py: every GRPO arm is a valid run of configs/repro/trisr_dots_grpo.yaml with the reward
it names, and the report renders its tables, verdicts and the reward-hacking note from per-seed metrics (no
training)."""

import importlib
import random
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser

from app.rewards import RewardComponent

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def core_trisr(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "repro"))
    return importlib.import_module("core_trisr")


def build(spec: dict) -> RewardComponent:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(RewardComponent, "reward")
    return parser.instantiate(parser.parse_object({"reward": spec})).reward


def test_arms_parse_and_build_their_rewards(core_trisr, print_config):
    expected = {
        "task_only": (["triplet_task", "format"], None),
        "trisr": (["tri_sr", "format"], "paper"),
        "trisr_sym": (["tri_sr", "format"], "transitive"),
    }
    assert set(expected) == set(core_trisr.GRPO_ARMS) and set(core_trisr.ARMS) == {"sft", *expected}
    for arm, (names, rule) in expected.items():
        args = ["--config", str(ROOT / "configs" / "repro/trisr_dots_grpo.yaml")]
        for item in core_trisr.arm_overrides(arm, "runs/start/policy", 7):
            key, _, value = item.partition("=")
            args += [f"--{key}", value]
        config = print_config(args)
        module = config["model"]["init_args"]
        assert config["trainer"]["max_steps"] == 7 and module["policy"]["init_args"]["model"] == "runs/start/policy"
        assert module["grpo"]["beta"] == 0.01
        rewards = [build(spec) for spec in module["rewards"]]
        assert [r.name for r in rewards] == names, arm
        if rule is not None:
            assert rewards[0].consistency_rule == rule and (rewards[0].ag_weight, rewards[0].tc_weight) == (0.2, 0.3)
        eval_names = {build(spec).name for spec in module["eval_rewards"]}
        assert {f"{m}" for m in core_trisr.METRICS if m not in core_trisr.DERIVED} <= eval_names


def test_the_sft_start_reports_every_metric_the_grpo_stage_does(print_config):
    """The start's own summary names the triplet metrics the report reads (except those only GRPO's eval lists)."""
    sft = print_config(["--config", str(ROOT / "configs" / "repro/trisr_dots_sft.yaml")])
    names = {build(spec).name for spec in sft["model"]["init_args"]["eval_rewards"]}
    assert {"triplet_order_accuracy", "triplet_cycle_rate", "triplet_attribute_accuracy"} <= names
    dataset = sft["data"]["init_args"]["dataset"]["init_args"]
    assert (dataset["max_count"], dataset["dot_radius"]) == (4, 8)


def fake_summary(rng, hacked: bool = False) -> dict[str, float]:
    order = 1 / 6 if hacked else rng.uniform(0.5, 0.9)
    cycle = 0.0 if hacked else rng.uniform(0.0, 0.1)
    tc = 1.0 if hacked else rng.uniform(0.0, 0.4)
    values = {
        "triplet_overall_accuracy": order,
        "triplet_partial_accuracy": 0.5 if hacked else rng.uniform(order, 1.0),
        "triplet_order_accuracy": order,
        "triplet_cycle_rate": cycle,
        "triplet_consistency": tc,
        "triplet_consistency_transitive": 1.0 - 2 * cycle,
        "attribute_grounding": rng.uniform(0.5, 1.0),
        "triplet_attribute_accuracy": rng.uniform(0.4, 0.9),
        "judgment_alignment": rng.uniform(0.5, 1.0),
        "format": 1.0,
    }
    return {f"val/{k}": v for k, v in values.items()}


def test_report_renders_tables_verdicts_and_the_hacking_note(core_trisr):
    rng = random.Random(0)
    results = {}
    for seed in range(5):
        metrics = {arm: core_trisr._metrics(fake_summary(rng, hacked=arm == "trisr")) for arm in core_trisr.ARMS}
        results[seed] = {"metrics": metrics, "seconds": 60.0, "reused": False}
    timing = {
        "command": "python x",
        "seeds": list(range(5)),
        "wall_s": 600,
        "stage_s": 1200,
        "cpu_s": 1000,
        "stages": 20,
    }
    text = core_trisr.report(results, 400, 150, 2, timing)
    assert text.startswith("## CoRe (TriSR)")
    assert text.count("| GRPO, TriSR (symmetric R_tc rule) |") == 2  # the mean ± std table and the per-seed one
    assert text.count("**") == 2 * 6  # five verdicts and the mechanism check
    assert "reward hacking" in text and text.count("reward hacking") == 1  # only the hacked arm
    assert "image 2 ranked in the middle on 1.00" in text  # R_tc 1 and no cycles: every answer has 2 in the middle
    assert "Order accuracy equals overall accuracy on every arm and seed" in text
    assert "about 8.3 min on 2 free cores" in text
    metrics = results[0]["metrics"]["trisr"]
    assert metrics["middle_two"] == metrics["triplet_consistency"] + metrics["triplet_cycle_rate"]
