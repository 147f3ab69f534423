"""The VBVR evaluation report: one table per split with a row per task and a column per regime, failed checks named."""

import torch
from PIL import Image

from app.types import VisualSample
from callbacks.vbvr_eval import VBVRGridWriter, vbvr_tables


def test_tables_have_a_row_per_task_and_a_column_per_regime():
    metrics = {
        "val/in_domain/color_mixing/last_frame": 0.25,
        "val/in_domain/color_mixing/multi_frame": 0.5,
        "val/out_of_domain/object_counting/last_frame": 0.125,
        "val/failed/in_domain/color_mixing/mixed_colour": 0.75,
        "val/failed/in_domain/color_mixing/sources_unchanged": 0.0,
        "val/reward/total": 0.3,
    }
    text = vbvr_tables(metrics)
    lines = [line for line in text.splitlines() if line]
    assert lines[0].split() == ["in_domain", "last_frame", "key_frame", "multi_frame"]
    assert lines[1].split()[:4] == ["color_mixing", "0.250", "-", "0.500"]
    assert "failed: mixed_colour 75%" in lines[1] and "sources_unchanged" not in lines[1]
    assert lines[2].split()[0] == "out_of_domain" and lines[3].split()[:2] == ["object_counting", "0.125"]
    assert vbvr_tables({"val/reward/total": 1.0}) == ""


def test_grid_has_problem_before_and_after_columns(tmp_path):
    class Trainer:
        is_global_zero = True

    writer = VBVRGridWriter(str(tmp_path), rows_per_task=2, cell_size=32)
    problem = Image.new("RGB", (16, 16), (255, 0, 0))
    batch = [VisualSample([problem], "q", "color_mixing", meta={"split": "in_domain"})] * 3
    for fill in (0.0, 1.0):  # before fit, after fit
        writer.on_validation_epoch_start(Trainer(), None)
        writer.on_validation_batch_end(Trainer(), None, {"images": torch.full((3, 3, 16, 16), fill)}, batch, 0)
        writer.on_validation_epoch_end(Trainer(), None)
    grid = Image.open(tmp_path / "color_mixing-in_domain.png").convert("RGB")
    width, height = grid.size
    assert width > 3 * 32 and height > 2 * 32 and writer.written == [tmp_path / "color_mixing-in_domain.png"]
    row = grid.crop((0, 0, width, 32))
    colours = [row.getpixel((x, 10)) for x in (10, width // 2, width - 10)]
    assert colours[0] == (255, 0, 0) and colours[1] == (0, 0, 0) and colours[2] == (255, 255, 255)
