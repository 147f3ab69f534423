"""A stand-in GRPO module for callback tests: it returns what the GRPO modules return from ``training_step`` and logs
their ``train/`` metrics, from a schedule the test chooses, without a model."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from prompt_samples import prompt_loader

from app.types import CompletionRecord, RewardOutput

K = 2


class StandInGRPO(L.LightningModule):
    """``metrics[step]`` overrides the logged ``train/`` values of that step; ``frames`` > 0 returns videos."""

    group_size = K

    def __init__(self, metrics: dict[int, dict[str, float]] | None = None, frames: int = 0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.metrics = metrics or {}
        self.frames = frames

    def training_step(self, batch, batch_idx):
        n = len(batch) * K  # K rows per prompt on this rank, also when group_size (the whole group) is larger
        accuracy = torch.tensor([float((i + self.global_step) % 2) for i in range(n)])  # [N]
        fmt = torch.ones(n)
        rewards = RewardOutput(total=accuracy + 0.5 * fmt, components={"accuracy": accuracy, "format": fmt})
        advantages = accuracy - accuracy.mean()
        values = {
            "train/reward/total": float(rewards.total.mean()),
            "train/kl": 0.01,
            "train/clip_fraction": 0.0,
            "train/frac_zero_std": 0.0,
            "train/completion_length": 20.0,
            **self.metrics.get(self.global_step, {}),
        }
        self.log_dict({k: torch.tensor(v) for k, v in values.items()}, batch_size=len(batch))
        shape = (n, self.frames, 3, 8, 8) if self.frames else (n, 3, 8, 8)
        images = torch.rand(shape, generator=torch.Generator().manual_seed(self.global_step))
        records = [
            CompletionRecord(
                self.global_step,
                batch[i // K].task,
                batch[i // K].question,
                f"answer {i}",
                "1",
                float(rewards.total[i]),
                float(advantages[i]),
                {"accuracy": float(accuracy[i])},
            )
            for i in range(n)
        ]
        loss = self.layer(torch.ones(1, 2)).pow(2).mean()
        return {
            "loss": loss,
            "records": records,
            "rewards": rewards,
            "advantages": advantages,
            "images": images,
            "timings": {"rollout": 0.01, "reward": 0.002, "update": 0.005},
            "generated_tokens": n * 20,  # every completion 20 tokens long, as train/completion_length says
            "rows_per_prompt": K,  # this stand-in draws K rows of each prompt, whatever its group_size says
        }

    def train_dataloader(self):
        return prompt_loader(8, 2, question="prompt {i}", tasks=("t0", "t1"), image_size=16)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer_for(tmp_path, callbacks, max_steps: int = 4, logger: bool | Logger = True) -> L.Trainer:
    """A CPU trainer that logs every step; ``logger``: True for TensorBoard under ``tmp_path/tb``, False for none, or
    the logger itself."""
    from lightning.pytorch.loggers import TensorBoardLogger

    if logger is True:
        logger = TensorBoardLogger(tmp_path, name="tb")
    return L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
    )


@pytest.fixture
def stand_in():
    return StandInGRPO


@pytest.fixture
def make_trainer():
    return trainer_for


def read_scalars(log_dir) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}, acc


@pytest.fixture
def tensorboard():
    """``tensorboard(log_dir) -> (tag -> {step: value}, EventAccumulator)``."""
    return read_scalars
