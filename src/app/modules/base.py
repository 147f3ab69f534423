"""What the VLM SFT and GRPO modules share: the policy, the optimizer, and greedy-decoding evaluation."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence

import lightning as L
import numpy as np
import torch

from app.models.vlm import SamplingSettings, VLMPolicy
from app.modules.checkpoints import fit_optimizers, omit_frozen_parameters, restore_frozen_parameters
from app.modules.optim import adamw_with_warmup
from app.rewards import AccuracyReward, FormatReward, RewardComponent
from app.types import VisualSample


def rng_states() -> dict:
    """The global generators' states, as plain types and tensors (checkpoints load with ``weights_only=True``)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached]
    states = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    name, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy(), position, has_gauss, cached))  # numpy casts the keys back to uint32
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class VLMModule(L.LightningModule):
    """Base LightningModule around a :class:`VLMPolicy`.

    Args:
        policy: the model to train.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up, in optimizer steps.
        eval_max_new_tokens: generation budget for greedy evaluation.
        eval_rewards: rewards scored on greedy completions in validation / test, logged as ``val/<name>/<task>``
            (``accuracy`` is logged as ``val/acc/<task>``, ``format`` as the format rate). Default: accuracy and format.
    """

    def __init__(
        self,
        policy: VLMPolicy,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        eval_max_new_tokens: int = 256,
        eval_rewards: Sequence[RewardComponent] | None = None,
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
        super().__init__()
        self.save_hyperparameters(ignore=["policy", "rewards", "eval_rewards", "sampling"])
        self.policy = policy
        self.eval_rewards = list(eval_rewards) if eval_rewards is not None else [AccuracyReward(), FormatReward()]
        self.eval_results: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------------------------------------------ optimizer
    def configure_optimizers(self):
        parameters = self.policy.trainable_parameters()
        if not parameters:
            raise ValueError("the policy has no trainable parameters: set policy.lora or freeze less")
        hp = self.hparams
        return adamw_with_warmup(parameters, hp.learning_rate, hp.weight_decay, hp.warmup_steps)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Sampling draws from the global generators: save them so a resumed run samples what an uninterrupted one would.
        checkpoint["rng_states"] = rng_states()
        omit_frozen_parameters(self, checkpoint, fit_optimizers(self))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:
            restore_rng_states(checkpoint["rng_states"])
        restore_frozen_parameters(self, checkpoint)

    # ------------------------------------------------------------------------------------------------ evaluation
    def validation_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, stage="val")

    def test_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, stage="test")

    @torch.no_grad()
    def predict_step(self, batch: list[VisualSample], batch_idx: int) -> list[dict[str, str | None]]:
        """Greedy completions for ``python -m app predict``."""
        completions = self._greedy(batch)
        return [
            {"task": s.task, "question": s.question, "answer": s.answer, "completion": text}
            for s, text in zip(batch, completions.texts, strict=True)
        ]

    def _greedy(self, samples: list[VisualSample]):
        prompts = self.policy.encode_prompts(samples)
        sampling = SamplingSettings(
            num_generations=1,  # pragma: no mutate (equivalent: generate draws one completion per row whatever K)
            max_new_tokens=self.hparams.eval_max_new_tokens,
        )
        return self.policy.generate(prompts, sampling, greedy=True)

    @torch.no_grad()
    def _evaluate(self, samples: list[VisualSample], stage: str) -> None:
        completions = self._greedy(samples)
        for reward in self.eval_rewards:
            values = reward.score(completions.texts, samples).to(self.device)  # [B]
            key = "acc" if reward.name == "accuracy" else reward.name
            self.log(f"{stage}/{key}", values.mean(), batch_size=len(samples), sync_dist=True)
            by_task = defaultdict(list)
            for sample, value in zip(samples, values, strict=True):
                by_task[sample.task].append(value)
            for task, task_values in by_task.items():
                self.log(
                    f"{stage}/{key}/{task}",
                    torch.stack(task_values).mean(),
                    batch_size=len(task_values),
                    sync_dist=True,
                )

    def on_validation_epoch_end(self) -> None:
        self._remember("val")

    def on_test_epoch_end(self) -> None:
        self._remember("test")

    def _remember(self, stage: str) -> None:
        """Keep this evaluation's figures (the CLI prints them at the end of a run)."""
        metrics = {
            k: float(v)
            for k, v in self.trainer.callback_metrics.items()
            if k.startswith(f"{stage}/") and v.numel() == 1
        }
        if metrics and not self.trainer.sanity_checking:
            self.eval_results[f"{stage}@step{self.global_step}"] = metrics
