"""The precision line and the 16-bit trainable-weights warning (app.modules.precision)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from app.modules.precision import POLICY_DTYPE_FIELD, precision_report
from app.settings import OptimizerSettings


class _FSDP2Like:
    mixed_precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _lora_like(adapter_dtype: torch.dtype) -> nn.Module:
    """A frozen bfloat16 base layer and a trainable adapter, as PEFT leaves a bfloat16 model."""
    model = nn.Module()
    model.base = nn.Linear(8, 8).to(torch.bfloat16).requires_grad_(False)
    model.adapter = nn.Linear(8, 2, bias=False).to(adapter_dtype)
    return model


def test_float32_adapters_over_a_bfloat16_base_under_autocast():
    report = precision_report(_lora_like(torch.float32), [], "bf16-mixed", strategy=None)
    assert report.trainable == {torch.float32: 16}
    assert report.frozen == {torch.bfloat16: 72}
    assert report.warning() is None
    line = report.line()
    assert "trainable weights float32" in line and "frozen weights bfloat16" in line
    assert "compute bfloat16 (autocast)" in line and "optimizer state float32 (AdamW, as the weights)" in line


def test_bf16_true_names_trainer_precision():
    report = precision_report(_lora_like(torch.bfloat16), [], "bf16-true", strategy=None)
    warning = report.warning()
    assert warning is not None and warning.startswith("16 of 16 trainable elements are stored in 16 bits")
    assert "trainer.precision: bf16-true" in warning and "bf16-mixed" in warning


def test_full_fine_tuning_in_bfloat16_names_the_policy_dtype():
    model = nn.Linear(4, 4).to(torch.bfloat16)
    report = precision_report(model, [], "32-true", strategy=None)
    assert report.sixteen_bit_trainable() == 20
    assert POLICY_DTYPE_FIELD in report.warning()


def test_optimizer_state_and_fsdp2_dtypes_are_read_from_the_run():
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    report = precision_report(model, [optimizer], "32-true", strategy=_FSDP2Like())
    assert report.optimizer_state == {torch.float32: 2 * 10}  # exp_avg and exp_avg_sq of 10 elements, no "step"
    line = report.line()
    assert "compute bfloat16 (FSDP2 param_dtype)" in line and "reduced in float32" in line
    assert "optimizer state float32;" in line


def test_mixed_dtypes_are_listed_by_element_count():
    model = nn.Module()
    model.big = nn.Linear(10, 10)  # 110 float32
    model.small = nn.Linear(2, 2).to(torch.bfloat16)  # 6 bfloat16
    report = precision_report(model, [], "32-true", strategy=None)
    assert "trainable weights float32 (110) + bfloat16 (6)" in report.line()


def test_a_bf16_true_fit_warns_naming_the_field_and_a_bf16_mixed_one_does_not(new_policy, new_datamodule, fit, caplog):
    """The real fit path (PolicyModule.on_train_start): Lightning's bf16-true casts the float32 LoRA adapters."""
    import logging

    from app.modules import VLMSFTModule

    for precision, warned in (("bf16-true", True), ("bf16-mixed", False)):
        caplog.clear()
        module = VLMSFTModule(new_policy(), optimizer=OptimizerSettings(learning_rate=1e-3))
        with caplog.at_level(logging.INFO):
            fit(module, new_datamodule(train_size=2), max_steps=1, precision=precision)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision: ")]
        assert len(lines) == 1, precision
        warnings = [r.getMessage() for r in caplog.records if "stored in 16 bits" in r.getMessage()]
        assert bool(warnings) is warned, precision
        if warned:
            assert "trainer.precision: bf16-true" in warnings[0]
            assert "trainable weights bfloat16" in lines[0]
        else:
            assert "trainable weights float32" in lines[0] and "compute bfloat16 (autocast)" in lines[0]
