"""The VBVR evaluation: scores per split, task and regime with the failed checks, one table per split with a row per
task and a column per regime, and the problem | before | after grids."""

import torch
from PIL import Image

from app.tasks.vbvr import VBVRPromptDataset
from app.tasks.vbvr.regimes import score_regimes
from app.types import VisualSample
from callbacks.vbvr_eval import VBVRGridWriter, VBVRScores, vbvr_tables


class LoggingModule:
    """What VBVRScores needs of a LightningModule: ``log``, recorded."""

    def __init__(self):
        self.logged = {}

    def log(self, key, value, **kwargs):
        assert kwargs == {"sync_dist": True}  # the same keys on every process, so a reduction per key is safe
        self.logged[key] = float(value)


def vbvr_batch():
    dataset = VBVRPromptDataset(
        4, seed=0, image_size=64, tasks=["color_mixing", "object_counting"], split=["in_domain", "out_of_domain"]
    )
    return [dataset[i] for i in range(4)]


def test_scores_log_every_split_task_and_regime_with_failed_checks_at_the_epoch_end():
    torch.manual_seed(0)
    batch, module, scores = vbvr_batch(), LoggingModule(), VBVRScores()
    videos = [torch.rand(4, 5, 3, 64, 64), torch.rand(4, 5, 3, 64, 64)]  # two batches of 5-frame videos at 64 px
    for batch_idx, images in enumerate(videos):
        scores.on_validation_batch_end(None, module, {"images": images}, batch, batch_idx)
    assert module.logged == {}  # per-group means wait for the epoch's end
    scores.on_validation_epoch_end(None, module)
    for split in ("in_domain", "out_of_domain"):
        for task in ("color_mixing", "object_counting"):
            for regime in ("last_frame", "key_frame", "multi_frame"):
                assert 0.0 <= module.logged[f"val/{split}/{task}/{regime}"] <= 1.0
    failed = {k: v for k, v in module.logged.items() if k.startswith("val/failed/in_domain/object_counting/")}
    assert failed and all(0.0 <= v <= 1.0 for v in failed.values())
    assert module.logged["val/failed/in_domain/object_counting/red_count_matches"] == 1.0  # noise draws no red circles
    sample = next(s for s in batch if s.task == "color_mixing" and s.meta["split"] == "in_domain")
    index = batch.index(sample)
    expected = [score_regimes(images[index], sample.meta["vbvr"])["multi_frame"].score for images in videos]
    # the mean of the two samples' scores, summed and divided in the same float order as GroupedMeans: exact
    assert module.logged["val/in_domain/color_mixing/multi_frame"] == sum(expected) / 2


def test_scores_of_a_test_epoch_are_test_keys_and_start_afresh():
    batch, module, scores = vbvr_batch(), LoggingModule(), VBVRScores()
    scores.on_validation_batch_end(None, module, {"images": torch.zeros(4, 3, 64, 64)}, batch, 0)
    scores.on_validation_epoch_end(None, module)
    module.logged.clear()
    plain = [VisualSample([], "q", "color_mixing")] * 4  # no meta["vbvr"]: not scored
    scores.on_test_batch_end(None, module, {"images": torch.ones(4, 3, 64, 64)}, batch, 0)
    scores.on_test_batch_end(None, module, {"images": torch.ones(4, 3, 64, 64)}, plain, 1)
    scores.on_test_batch_end(None, module, None, batch, 2)  # no eval rewards: the step returns nothing
    scores.on_test_epoch_end(None, module)
    assert module.logged and all(key.startswith("test/") for key in module.logged)
    # images have only the Last-Frame regime
    assert sorted(k for k in module.logged if "/failed/" not in k) == [
        f"test/{split}/{task}/last_frame"
        for split in ("in_domain", "out_of_domain")
        for task in ("color_mixing", "object_counting")
    ]


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
