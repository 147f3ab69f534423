"""app.run_report: report.md tables per data set and per task, PNG plots, from a RunHistory."""

from PIL import Image

from app.run_report import RunHistory, split_key, write_report


def history() -> RunHistory:
    h = RunHistory(eval_sets=["shift"], title="Demo")
    for step in range(1, 6):
        h.add_train(step, {"train/reward/total": 0.1 * step, "train/reward/accuracy": 0.05 * step, "train/kl": 0.01})
    h.add_evaluation("val", 0, {"val/acc": 0.25, "val/acc/left": 0.5, "val/shift/acc": 0.125, "train/x": 9.0})
    h.add_evaluation("val", 5, {"val/acc": 0.75, "val/acc/left": 1.0, "val/shift/acc": 0.5, "val/shift/acc/left": 0.25})
    return h


def test_split_key():
    assert split_key("acc/left", ["shift"]) == ("all", "acc", "left")
    assert split_key("shift/acc", ["shift"]) == ("shift", "acc", None)
    assert split_key("pass@4", []) == ("all", "pass@4", None)
    assert split_key("shift/acc", []) == ("all", "shift", "acc")  # not a named set: a task


def test_report_tables_and_plots(tmp_path):
    path = write_report(history(), tmp_path)
    text = path.read_text()
    assert text.startswith("# Demo")
    assert "| `acc` | 0.250 | 0.750 | +0.500 |" in text
    assert "| `shift/acc` | 0.125 | 0.500 | +0.375 |" in text
    assert "| metric | all | shift |" in text and "| acc | 0.750 | 0.500 |" in text
    assert "| all | left | acc | 0.500 | 1.000 |" in text and "| shift | left | acc |  | 0.250 |" in text
    assert "| `train/reward/total` | 0.500 | 5 |" in text
    assert "train/x" not in text
    for name in ("train_rewards.png", "val_curves.png", "val_before_after.png"):
        assert f"]({name})" in text
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.width >= 400


def test_an_empty_history_still_gives_a_report(tmp_path):
    text = write_report(RunHistory(), tmp_path).read_text()
    assert "Nothing was logged yet" in text and not list(tmp_path.glob("*.png"))
