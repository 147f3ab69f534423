"""The command line: ``python -m app fit|validate|test --config X.yaml`` and ``python -m app export``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI


class AppCLI(LightningCLI):
    """LightningCLI with one extra top-level option.

    ``validate_before_and_after: true`` validates once before fit and once after it, then prints the held-out figures
    side by side (and writes them to ``<log_dir>/summary.json``): the quickstart uses it to show accuracy rising.
    """

    def __init__(self, *args, save_config_kwargs: dict | None = None, **kwargs) -> None:
        # Re-running a recipe into the same folder is the normal case (the quickstart), so the saved config is replaced.
        super().__init__(*args, save_config_kwargs={"overwrite": True, **(save_config_kwargs or {})}, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--validate_before_and_after",
            type=bool,
            default=False,
            help="Validate before and after fit and print the held-out metrics side by side.",
        )

    def _compare(self) -> bool:
        return bool(self.config.get(self.subcommand, {}).get("validate_before_and_after", False))

    def before_fit(self) -> None:
        if self._compare():
            self._before = self._validate()

    def after_fit(self) -> None:
        if self._compare():
            self._report(self._before, self._validate())

    def _validate(self) -> dict[str, float]:
        results = self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
        return {k: float(v) for k, v in (results[0] if results else {}).items()}

    def _report(self, before: dict[str, float], after: dict[str, float]) -> None:
        log_dir = Path(self.trainer.log_dir or self.trainer.default_root_dir)  # a collective call: every rank makes it
        if not self.trainer.is_global_zero:
            return
        keys = sorted(set(before) | set(after))
        lines = [f"{'held-out metric':<32}{'before fit':>12}{'after fit':>12}"]
        lines += [f"{k:<32}{before.get(k, float('nan')):>12.3f}{after.get(k, float('nan')):>12.3f}" for k in keys]
        print("\n".join(["", *lines, ""]), flush=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "summary.json").write_text(json.dumps({"before": before, "after": after}, indent=2))


def export_main(argv: list[str]) -> None:
    """``python -m app export --config X.yaml --ckpt_path run.ckpt --output_dir out/``."""
    from app.export import export_from_checkpoint

    usage = "usage: python -m app export --config X.yaml [overrides] --ckpt_path CKPT --output_dir DIR"
    options = {"--ckpt_path": None, "--output_dir": None}
    rest = []
    args = iter(argv)
    for arg in args:
        key, _, value = arg.partition("=")
        if key in options:
            options[key] = value or next(args, None)
        else:
            rest.append(arg)
    if rest[:1] in (["-h"], ["--help"]) or None in options.values():
        raise SystemExit(usage)
    cli = AppCLI(args=rest, run=False, save_config_callback=None)
    path = export_from_checkpoint(cli.model, options["--ckpt_path"], options["--output_dir"])
    print(f"exported to {path}")


def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["export"]:
        export_main((sys.argv[1:] if argv is None else argv)[1:])
        return
    try:
        AppCLI(args=argv)
    finally:
        _destroy_process_group()


def _destroy_process_group() -> None:
    """Tear down torch.distributed before interpreter exit: a gloo group left alive can abort the process at exit
    ("terminate called without an active exception") after a successful DDP run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
