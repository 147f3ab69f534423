"""What VLMModule gives the SFT and GRPO modules: greedy evaluation within its token budget, test and validation
metrics (logged and remembered), and the global generators' states saved for resuming."""

import dataclasses
import io
import random

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from app.modules import VLMSFTModule
from app.modules.checkpoints import restore_rng_states, rng_states
from app.rewards import AccuracyReward, RewardComponent
from app.settings import OptimizerSettings, SamplingSettings


class LengthReward(RewardComponent):
    """Completion length in characters / 32, plus 1 for a "yes" sample: unlike accuracy on an untrained model, it
    differs between samples."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([len(c) / 32 + (s.answer == "yes") for c, s in zip(completions, samples, strict=True)])


def greedy_reference(policy, samples, max_new_tokens: int):
    """Greedy completions straight from the policy, with the given budget."""
    with torch.no_grad():
        prompts = policy.encode_prompts(samples)
        return policy.generate(prompts, SamplingSettings(max_new_tokens=max_new_tokens), greedy=True)


# ------------------------------------------------------------------------------------------------------ evaluation
def test_greedy_evaluation_generates_at_most_eval_max_new_tokens(tiny_policy, samples):
    module = VLMSFTModule(tiny_policy, eval_max_new_tokens=3)
    rows = module.predict_step(samples, 0)
    reference = greedy_reference(tiny_policy, samples, max_new_tokens=3)
    assert reference.completion_ids.shape[1] == 3 and reference.truncated.any(), "the budget should bind"
    assert len(rows) == len(samples)  # one completion per prompt
    assert [r["completion"] for r in rows] == reference.texts


def test_test_logs_every_eval_reward_overall_and_per_task_and_remembers_them(tiny_policy, new_samples):
    samples = [s if s.answer == "yes" else dataclasses.replace(s, task="other_task") for s in new_samples(4)]
    tasks = [s.task for s in samples]
    assert tasks == ["dots_left_of", "other_task"] * 2
    module = VLMSFTModule(tiny_policy, eval_max_new_tokens=4, eval_rewards=[AccuracyReward(), LengthReward()])
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (results,) = trainer.test(module, dataloaders=DataLoader(samples, batch_size=4, collate_fn=list), verbose=False)

    texts = greedy_reference(tiny_policy, samples, max_new_tokens=4).texts
    lengths = [len(t) / 32 + (s.answer == "yes") for t, s in zip(texts, samples, strict=True)]
    accuracy = AccuracyReward().score(texts, samples).tolist()
    expected = {}
    for key, values in (("acc", accuracy), ("length", lengths)):  # accuracy is logged as "acc"
        expected[f"test/{key}"] = sum(values) / 4
        for task in ("dots_left_of", "other_task"):
            own = [v for v, t in zip(values, tasks, strict=True) if t == task]
            expected[f"test/{key}/{task}"] = sum(own) / len(own)
    assert expected["test/length/dots_left_of"] != expected["test/length/other_task"]
    assert results == pytest.approx(expected, abs=1e-6)
    assert module.eval_results == {"test@step0": pytest.approx(expected, abs=1e-6)}


def test_fit_remembers_each_validation_with_its_own_figures_but_not_the_sanity_check(new_policy, new_datamodule, fit):
    module = VLMSFTModule(
        new_policy("tiny-qwen2-vl", lora_r=4), eval_max_new_tokens=2, optimizer=OptimizerSettings(learning_rate=1e-3)
    )
    trainer, recorder = fit(
        module, new_datamodule(), max_steps=2, limit_val_batches=1, val_check_interval=1, num_sanity_val_steps=1
    )
    assert "train/loss/sft" in recorder.steps[0]["metrics"]  # a figure of another stage is there to leave out
    assert list(module.eval_results) == ["val@step1", "val@step2"]
    for metrics in module.eval_results.values():
        assert set(metrics) == {"val/acc", "val/acc/dots_left_of", "val/format", "val/format/dots_left_of"}
    assert module.eval_results["val@step2"] == pytest.approx(
        {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    )


# ---------------------------------------------------------------------------------------------------- RNG states
def draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist()


def test_rng_states_are_plain_data_that_bring_every_global_generator_back():
    states = rng_states()
    name, keys, position, has_gauss, cached = states["numpy"]
    expected = np.random.get_state()
    assert name == expected[0] and (position, has_gauss, cached) == expected[2:]
    assert keys.dtype == torch.int64 and keys.tolist() == expected[1].tolist()  # the uint32 words, as integers
    buffer = io.BytesIO()
    torch.save(states, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # as a checkpoint is loaded by default
    first = draws()
    restore_rng_states(loaded)
    assert draws() == first


def test_cuda_generators_are_saved_and_restored_where_cuda_is_available(monkeypatch):
    cuda_states = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: cuda_states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    states = rng_states()
    assert states["cuda"] is cuda_states
    restore_rng_states(states)
    assert restored == [cuda_states]
    # a checkpoint written without CUDA, resumed with it: there is nothing to restore
    without_cuda = {k: v for k, v in states.items() if k != "cuda"}
    restore_rng_states(without_cuda)
    assert restored == [cuda_states]
    # a checkpoint written with CUDA, resumed without it: its CUDA states are left alone
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "cuda" not in rng_states()
    restore_rng_states(states)
    assert restored == [cuda_states]
