import torch

from callbacks.report import ReportWriter


def test_report_after_fit_and_after_validate(tmp_path, stand_in, make_trainer):
    class Evaluated(stand_in):
        def validation_step(self, batch, batch_idx):
            value = torch.tensor(0.1 * self.global_step)
            self.log("val/acc", value, batch_size=len(batch))
            self.log("val/acc/t0", value / 2, batch_size=len(batch))

        def val_dataloader(self):
            return self.train_dataloader()

    callback = ReportWriter(every_n_steps=2)
    trainer = make_trainer(tmp_path, [callback], max_steps=4)
    trainer.limit_val_batches = 1
    module = Evaluated()
    trainer.validate(module, verbose=False)
    assert "| `acc` | 0.000 | 0.000 | +0.000 |" in open(callback.path).read()  # `validate` writes a report too
    trainer.fit(module)
    trainer.validate(module, verbose=False)
    text = open(callback.path).read()
    assert sorted(callback.history.train["train/reward/total"]) == [2, 4]
    assert [e.step for e in callback.history.evaluations] == [0, 4, 4]  # before, at the epoch end, after
    assert "| `acc` | 0.000 | 0.400 | +0.400 |" in text
    assert "| all | t0 | acc | 0.000 | 0.200 |" in text


def test_the_run_summary_names_the_report_and_the_sample_grids(tmp_path, stand_in, make_trainer):
    from app.command_line.console import artefact_summary
    from callbacks.sample_grid import SampleGridLogger

    trainer = make_trainer(tmp_path, [ReportWriter(), SampleGridLogger(every_n_steps=1)], max_steps=1)
    trainer.fit(stand_in())
    lines = artefact_summary(trainer).splitlines()
    report = next(line for line in lines if line.strip().startswith("report "))
    grids = next(line for line in lines if line.strip().startswith("sample grids "))
    assert report.rstrip().endswith("report/report.md") and grids.rstrip().endswith("samples")


def test_evaluation_sets_named_by_the_module_get_their_own_column(tmp_path, stand_in, make_trainer):
    class TwoSets(stand_in):
        eval_set_names = ["shift"]

        def validation_step(self, batch, batch_idx):
            self.log("val/acc", torch.tensor(0.5), batch_size=len(batch))
            self.log("val/shift/acc", torch.tensor(0.25), batch_size=len(batch))
            self.log("val/shift/acc/t0", torch.tensor(0.125), batch_size=len(batch))

        def val_dataloader(self):
            return self.train_dataloader()

    callback = ReportWriter()
    trainer = make_trainer(tmp_path, [callback], max_steps=1, logger=False)
    trainer.limit_val_batches = 1
    trainer.validate(TwoSets(), verbose=False)
    text = open(callback.path).read()
    assert "| metric | all | shift |" in text and "| acc | 0.500 | 0.250 |" in text
    assert "| shift | t0 | acc | 0.125 | 0.125 |" in text
