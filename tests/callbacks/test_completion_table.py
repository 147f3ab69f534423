import csv
import glob
import os
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from prompt_samples import prompts
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from app.types import CompletionRecord
from callbacks.completion_table import CompletionTableLogger, record_to_row

NASTY = 'a, "quoted" answer\nwith | pipes,\r\nand <b>html</b> \\| =1+1'


def make_records(step: int, n: int = 3, components: tuple[str, ...] = ("accuracy", "format")) -> list[CompletionRecord]:
    return [
        CompletionRecord(
            step=step,
            task="dots_left_of",
            question="Is the red dot left of the blue dot?",
            completion=f"{NASTY} #{k}",
            answer=None if k == 1 else "yes",
            reward=0.1 * k + 1 / 3,
            advantage=-0.7 + k,
            components={name: k / 7 + j for j, name in enumerate(components)},
        )
        for k in range(n)
    ]


class RecordsModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        return {"loss": loss, "records": make_records(step=self.global_step)}

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))), batch_size=1
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def read_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_fit_writes_csv_and_tensorboard_text(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb")
    callback = CompletionTableLogger(every_n_steps=2, max_rows=2)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=4,
        logger=logger,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(RecordsModule())

    path = os.path.join(logger.log_dir, "completions.csv")
    assert callback.path == path
    with open(path, newline="", encoding="utf-8") as f:
        assert sum(1 for row in csv.reader(f) if row[0] == "step") == 1  # one header
    rows = read_rows(path)
    # global_step is 1, 2, 3, 4 after the four batches: steps 2 and 4 are logged, 2 rows each.
    # Records carry the module's global_step at training_step time, one less.
    expected = make_records(step=1)[:2] + make_records(step=3)[:2]
    assert len(rows) == len(expected)
    assert list(rows[0]) == [
        "step",
        "task",
        "question",
        "completion",
        "answer",
        "reward",
        "advantage",
        "reward/accuracy",
        "reward/format",
    ]
    for row, record in zip(rows, expected, strict=True):
        assert int(row["step"]) == record.step
        assert (row["task"], row["question"], row["completion"]) == (record.task, record.question, record.completion)
        assert row["answer"] == ("" if record.answer is None else record.answer)
        assert float(row["reward"]) == record.reward and float(row["advantage"]) == record.advantage
        assert {k: float(row[f"reward/{k}"]) for k in record.components} == record.components

    events = glob.glob(os.path.join(logger.log_dir, "events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0})
    acc.Reload()
    tag = "completions/text_summary"
    assert tag in acc.Tags()["tensors"]
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)}
    assert sorted(texts) == [2, 4]
    table = texts[2]
    header, _, *body = table.split("\n")
    assert len(body) == 2  # newlines in completions do not break rows
    assert all(line.count(" | ") == header.count(" | ") for line in body)  # nor do pipes
    assert "\\|" in body[0] and "&lt;b&gt;" in body[0] and "<br>" in body[0]


def fake_trainer(tmp_path, global_step: int, is_global_zero: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=global_step,
        is_global_zero=is_global_zero,
        loggers=[],
        log_dir=str(tmp_path),
        default_root_dir=str(tmp_path),
    )


def log(callback, trainer, records):
    callback.on_train_batch_end(trainer, None, {"loss": torch.tensor(0.0), "records": records}, None, 0)


def test_same_global_step_is_logged_once(tmp_path):
    callback = CompletionTableLogger(every_n_steps=1)
    trainer = fake_trainer(tmp_path, global_step=5)
    callback.setup(trainer, None, "fit")
    log(callback, trainer, make_records(5))
    log(callback, trainer, make_records(5))  # e.g. gradient accumulation: same optimizer step
    assert len(read_rows(callback.path)) == 3


def test_only_global_zero_writes_and_missing_records_are_ignored(tmp_path):
    callback = CompletionTableLogger(every_n_steps=1)
    callback.setup(fake_trainer(tmp_path, 0), None, "fit")
    log(callback, fake_trainer(tmp_path, 1, is_global_zero=False), make_records(1))
    callback.on_train_batch_end(fake_trainer(tmp_path, 2), None, {"loss": torch.tensor(0.0)}, None, 0)
    callback.on_train_batch_end(fake_trainer(tmp_path, 3), None, torch.tensor(0.0), None, 0)
    assert not os.path.exists(callback.path)


def test_new_components_are_dropped_with_one_warning(tmp_path):
    callback = CompletionTableLogger(every_n_steps=1)
    callback.setup(fake_trainer(tmp_path, 0), None, "fit")
    log(callback, fake_trainer(tmp_path, 1), make_records(1, components=("accuracy",)))
    with pytest.warns(UserWarning, match="reward/late"):
        log(callback, fake_trainer(tmp_path, 2), make_records(2, components=("accuracy", "late")))
    log(callback, fake_trainer(tmp_path, 3), make_records(3, components=("late",)))  # no second warning
    rows = read_rows(callback.path)
    assert len(rows) == 9 and list(rows[0])[-1] == "reward/accuracy"
    assert rows[-1]["reward/accuracy"] == ""


def test_resume_reuses_existing_header(tmp_path):
    first = CompletionTableLogger(every_n_steps=1)
    first.setup(fake_trainer(tmp_path, 0), None, "fit")
    log(first, fake_trainer(tmp_path, 1), make_records(1))
    second = CompletionTableLogger(every_n_steps=1)
    second.setup(fake_trainer(tmp_path, 0), None, "fit")
    log(second, fake_trainer(tmp_path, 2), make_records(2))
    rows = read_rows(second.path)
    assert [int(r["step"]) for r in rows] == [1] * 3 + [2] * 3


# ------------------------------------------------------------------------------------- thumbnails, other loggers
def test_tensorboard_gets_a_table_image_with_the_prompt_thumbnails(tmp_path):
    import numpy as np

    from callbacks.completion_table import render_table

    logger = TensorBoardLogger(tmp_path, name="tb")
    callback = CompletionTableLogger(every_n_steps=1, max_rows=2, thumbnail_size=16)
    trainer = fake_trainer(tmp_path, 3)
    trainer.loggers = [logger]
    callback.setup(trainer, None, "fit")
    batch = prompts(2, "q", ("t",), image_size=32)
    callback.on_train_batch_end(
        trainer, SimpleNamespace(), {"records": make_records(3), "rows_per_prompt": 2}, batch, 0
    )
    logger.experiment.flush()
    acc = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    acc.Reload()
    (event,) = acc.Images("completions/table")
    assert event.step == 3 and event.height == 2 * 16 + 3 * 2  # two rows of 16-pixel thumbnails
    rows = [record_to_row(r) for r in make_records(3)[:2]]
    image = render_table(rows, callback._thumbnails(make_records(3)[:2], batch, 2), 16)
    assert tuple(np.asarray(image)[2 + 8, 2 + 8]) == (0, 200, 30)  # the first prompt's colour, beside row 1
