"""The logging callbacks group a step's rows by the step's own ``rows_per_prompt`` (callbacks.step_outputs), not by
the module's group size K: with ``grpo.group_ranks: R`` each rank holds K / R rows of every prompt."""

import os
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from app.types import RewardOutput
from callbacks import CompletionTableLogger, RewardBreakdownLogger, SampleGridLogger, ThroughputLogger
from callbacks.step_outputs import rows_per_prompt

SPREAD = SimpleNamespace(group_size=4)  # a module whose groups of K = 4 are spread over 2 ranks: 2 rows per prompt


def test_rows_per_prompt_is_what_the_step_says_and_one_for_a_step_that_does_not_group():
    assert rows_per_prompt({"rows_per_prompt": 2}) == 2
    assert rows_per_prompt({"loss": torch.tensor(0.0)}) == 1
    assert rows_per_prompt(torch.tensor(0.0)) == 1


def fit_pictures(tmp_path, module, make_trainer) -> tuple[list[bytes], list[bytes]]:
    """The sample grids and the completion-table images a two-step fit of ``module`` logs."""
    grid = SampleGridLogger(every_n_steps=1, max_prompts=2, cell_size=16)
    table = CompletionTableLogger(every_n_steps=1, max_rows=4, thumbnail_size=8)
    trainer = make_trainer(tmp_path, [grid, table], max_steps=2)
    trainer.fit(module)
    grids = [open(os.path.join(grid.path, name), "rb").read() for name in sorted(os.listdir(grid.path))]
    events = EventAccumulator(trainer.logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    return grids, [e.encoded_image_string for e in events.Images("completions/table")]


def test_grids_and_tables_of_a_spread_group_are_those_of_the_rows_this_rank_drew(tmp_path, stand_in, make_trainer):
    spread = type("SpreadStandIn", (stand_in,), {"group_size": 2 * stand_in.group_size})
    whole = fit_pictures(tmp_path / "whole", stand_in(), make_trainer)
    assert whole[0] and whole[1]
    assert fit_pictures(tmp_path / "spread", spread(), make_trainer) == whole


def test_the_breakdown_finds_zero_spread_in_the_rows_of_each_prompt_on_this_rank():
    callback = RewardBreakdownLogger(every_n_steps=1)
    trainer = SimpleNamespace(global_step=0, is_global_zero=False, loggers=[])
    accuracy = torch.tensor([0.0, 0.0, 1.0, 1.0])  # two prompts, two rows each, equal within each prompt
    outputs = {"rewards": RewardOutput(accuracy, {"accuracy": accuracy}), "rows_per_prompt": 2}
    callback.on_train_batch_end(trainer, SPREAD, outputs, [None, None], 0)
    assert callback.history[0]["train/breakdown/accuracy/frac_zero_std"] == 1.0


@pytest.mark.parametrize(("outputs", "expected"), [({"rows_per_prompt": 2}, 6), ({}, 3)])
def test_throughput_counts_the_rows_the_step_drew(outputs, expected):
    assert ThroughputLogger._trained_samples(outputs, [None] * 3) == expected
