"""The command line: ``python -m app fit|validate|test|predict|export --config X.yaml`` (``python -m app --help``).

Errors in a config or on the command line are reported in a few lines naming the field, the bad value and a close
match (:mod:`app.command_line.error_messages`), every bad field of the config at once; so are the other errors a user
can cause: a checkpoint that cannot be read or belongs to another model, missing data, an output folder that cannot be
written (probed before the first step), training stopped by non-finite values. ``APP_DEBUG=1`` or ``--debug`` shows
the full traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from jsonargparse import DefaultHelpFormatter
from lightning import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI

import app.data  # noqa: F401  (imported so that `fit --help` lists the package's data modules as known subclasses)
import app.modules  # noqa: F401  (and its LightningModules)
from app.command_line.config_search import further_parse_errors
from app.command_line.console import artefact_summary, quiet_known_noise, step_progress_bar
from app.command_line.error_messages import (
    DEBUG_ENV,
    DEBUG_HINT,
    debug_enabled,
    describe_instantiation_error,
    describe_parse_errors,
    locate_field,
    nested_help_without_class,
    root_cause,
    settings_errors,
)
from app.command_line.faults import AtomicCheckpointIO, CheckpointConnector, PreemptionCheckpoint, unreadable_checkpoint
from app.command_line.output_folders import probe_output_folders
from app.errors import ConfigError
from app.modules import NonFiniteTrainingError
from app.parallel.loading import lean_loading
from app.rewards import RewardError

PROG = "python -m app"
LEAN_LOADING_COMMANDS = ("fit", "validate", "test", "predict")  # the commands that shard the policy under FSDP2
ROOT = Path(__file__).resolve().parents[3]  # the checkout: src/app/command_line/commands.py


class AppTrainer(Trainer):
    """``lightning.Trainer`` with one more method, ``export``, which LightningCLI turns into the ``export`` command."""

    def export(
        self,
        model: LightningModule,
        datamodule: LightningDataModule | None = None,
        *,
        output_dir: str,
        ckpt_path: str | None = None,
    ) -> Path:
        """Write the policy of a checkpoint as a Hugging Face folder (``from_pretrained`` opens it).

        Args:
            model: the module the config describes; the checkpoint's weights are loaded into it.
            datamodule: unused.
            output_dir: the folder to write.
            ckpt_path: a checkpoint file, or a folder to take the newest .ckpt file under. Default: the newest
                checkpoint under trainer.default_root_dir, where fit writes them.
        """
        from app.export import export_from_checkpoint, find_checkpoint

        return export_from_checkpoint(model, find_checkpoint(ckpt_path, self.default_root_dir), output_dir)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help, with descriptions and epilogs kept as written (the lists of commands and recipes)."""


def _configs_folder() -> Path | None:
    for folder in (Path.cwd() / "configs", ROOT / "configs"):
        if folder.is_dir():
            return folder
    return None


def _first_comment(path: Path, width: int = 100) -> str:
    with path.open(encoding="utf-8") as f:
        first = f.readline().strip()
    text = first.lstrip("#").strip() if first.startswith("#") else ""
    return text if len(text) <= width else text[: width - 3] + "..."


def _epilog() -> str:
    lines = [
        "examples:",
        f"  {PROG} fit --config configs/quickstart/quickstart_sft.yaml          train with a recipe",
        f"  {PROG} fit --config X.yaml --trainer.max_steps 10 --print_config",
        "                                            the resolved config; any field can be set on the command line",
        f"  {PROG} fit --model.help app.modules.VLMGRPOModule        the arguments of a module",
        f"  {PROG} export --config configs/quickstart/quickstart.yaml --output_dir exported/",
        "                                            "
        "the policy of the run's newest checkpoint, as a Hugging Face folder",
        f"  {PROG} rehearse --config configs/vlm/grpo_qwen2_5_vl_3b.yaml",
        "                                            "
        "a GPU recipe on CPU with the tiny model: fit, resume, export, float32",
    ]
    folder = _configs_folder()
    if folder is not None:
        shown = os.path.relpath(folder) if folder.is_relative_to(Path.cwd()) else str(folder)
        recipes = sorted(folder.rglob("*.yaml"))
        width = max((len(p.relative_to(folder).as_posix()) for p in recipes), default=0)
        lines += ["", f"recipes ({shown}/: quickstart/ on CPU, vlm/ and flow/ for GPUs, repro/ for docs/results.md):"]
        for p in recipes:
            name = p.relative_to(folder).as_posix()
            lines.append(f"  {name:<{width}}  {_first_comment(p, 116 - width)}")
    lines += ["", f"Errors name the field and suggest a fix; {DEBUG_HINT}."]
    return "\n".join(lines)


def _subcommand_epilog() -> str:
    return (
        f"recipes: configs/*/*.yaml ({PROG} --help lists them). The arguments of one class: --model.help CLASS_PATH,\n"
        f"--data.help CLASS_PATH. {DEBUG_HINT}."
    )


class AppCLI(LightningCLI):
    """LightningCLI with the ``export`` command, short error messages and one extra top-level option.

    ``validate_before_and_after: true`` validates once before fit and once after it, then prints the held-out figures
    side by side (and writes them to ``<log_dir>/summary.json``): the quickstart uses it to show accuracy rising. Every
    ``fit``, ``validate`` and ``test`` ends with the list of where its artefacts are.
    """

    def __init__(
        self,
        *args,
        save_config_kwargs: dict | None = None,
        trainer_class: type[Trainer] = AppTrainer,
        parser_kwargs: dict | None = None,
        **kwargs,
    ) -> None:
        subcommand_kwargs = {"epilog": _subcommand_epilog()}
        parser_kwargs = {
            "prog": PROG,
            "description": "Post-train vision-language and flow models from YAML recipes (a LightningCLI).",
            "epilog": _epilog(),
            **{name: dict(subcommand_kwargs) for name in self.subcommands()},
            **(parser_kwargs or {}),
        }
        # Re-running a recipe into the same folder is the normal case (the quickstart), so the saved config is replaced.
        super().__init__(
            *args,
            save_config_kwargs={"overwrite": True, **(save_config_kwargs or {})},
            trainer_class=trainer_class,
            parser_kwargs=parser_kwargs,
            **kwargs,
        )

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {**LightningCLI.subcommands(), "export": {"model", "datamodule"}}

    # ------------------------------------------------------------------------------------------- parsing, errors
    def init_parser(self, **kwargs: Any):
        kwargs.setdefault("exit_on_error", False)  # errors come back to parse_arguments, which shortens them
        kwargs.setdefault("formatter_class", _HelpFormatter)
        return super().init_parser(**kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--validate_before_and_after",
            type=bool,
            default=False,
            help="Validate before and after fit and print the held-out metrics side by side.",
        )

    def parse_arguments(self, parser, args) -> None:
        self._args = list(sys.argv[1:] if args is None else args) if args is None or isinstance(args, list) else []
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as error:
            self._parse_failed(error, further=True)

    def _parse_ckpt_path(self) -> None:
        if self.config.get("subcommand") == "export":
            # export loads the checkpoint into the model the config describes, as given: a checkpoint of another
            # model is refused by the shape check (fit/validate/test read the module's arguments from the checkpoint)
            return
        try:
            super()._parse_ckpt_path()  # reads the checkpoint's hyperparameters
        except argparse.ArgumentError as error:
            self._parse_failed(error)
        except Exception as error:  # a truncated checkpoint, a file that is not one
            raise unreadable_checkpoint(self.config[self.config["subcommand"]].get("ckpt_path"), error) from error

    def _parse_failed(self, error: argparse.ArgumentError, further: bool = False) -> None:
        if debug_enabled():
            raise error
        command = next((a for a in self._args if a in self.subcommands()), None)
        parser = getattr(self, "_subcommand_parsers", {}).get(command, self.parser)
        message = nested_help_without_class(self._args)
        if message is None:
            further_errors = further_parse_errors(self.parser, self._args, str(error)) if further else []
            messages = [str(error), *further_errors]
            message = describe_parse_errors(messages, parser._option_string_actions, command)
        sys.stderr.write(message + "\n")
        raise SystemExit(2) from None

    def instantiate_classes(self) -> None:
        config = self.config.get(str(self.subcommand), self.config)
        lean = self.subcommand in LEAN_LOADING_COMMANDS and fsdp2_processes(config.get("trainer") or {}) > 1
        failure = None
        try:
            with lean_loading(lean):  # FSDP2 over several processes: each rank reads only its shard of the weights
                super().instantiate_classes()
        except ConfigError:
            raise
        except Exception as error:
            failure = error
        if failure is not None:  # out of the except block: errors found next are not chained to this one
            config = self.config.get(str(self.subcommand), self.config)
            command = self.subcommand or "fit"
            messages = [describe_instantiation_error(failure, config, command)]
            messages += self._further_instantiation_errors(failure, config, command)
            text = "\n".join([line for m in messages for line in m.splitlines()[:-1]] + messages[0].splitlines()[-1:])
            raise ConfigError(text) from failure

    def _further_instantiation_errors(self, error: BaseException, config: Any, command: str) -> list[str]:
        """The model's other bad settings blocks and the data module's error too when the model's constructor failed
        first (jsonargparse builds the model first and stops there): each settings block and the data module are built
        alone to find out (they are cheap; the model is not)."""
        first = str(root_cause(error)) or type(root_cause(error)).__name__
        field = locate_field(config, first)
        if field is None or not field[0].startswith("model."):
            return []
        found = [
            describe_instantiation_error(other, config, command)
            for other in settings_errors(config.get("model"))
            if str(other) != first
        ]
        data = config.get("data") if hasattr(config, "get") else None
        if not (hasattr(data, "get") and data.get("class_path")):
            return found
        return found + self._data_error(config, command)

    def _data_error(self, config: Any, command: str) -> list[str]:
        """The data module's error, built alone without the model, or nothing."""
        alone = config.clone()
        alone["model"] = None
        try:
            self._parser(self.subcommand).instantiate_classes(alone)
        except Exception as other:
            message = describe_instantiation_error(other, config, command)
            if message.startswith("error: data."):
                return [message]
        return []

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The configured trainer, with a progress bar that counts steps
        (:func:`app.command_line.console.step_progress_bar`) unless the config disables the bar or brings its own, a
        checkpoint on preemption signals and atomic checkpoint files (:mod:`app.command_line.faults`)."""
        config = self._get(self.config_init, "trainer", default={})
        callbacks = kwargs.pop("callbacks", None) or config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            bar = step_progress_bar()
            if bar is not None:
                callbacks = [*callbacks, bar]
        if not any(isinstance(c, PreemptionCheckpoint) for c in callbacks):
            callbacks = [*callbacks, PreemptionCheckpoint()]  # SIGTERM / SIGUSR1: save, then exit 128 + signal
        kwargs["callbacks"] = callbacks
        if not config.get("plugins") and "plugins" not in kwargs:
            kwargs["plugins"] = [AtomicCheckpointIO()]  # a kill mid-save never leaves a truncated checkpoint
        trainer = super().instantiate_trainer(**kwargs)
        trainer._checkpoint_connector = CheckpointConnector(trainer)  # errors that name the checkpoint file
        return trainer

    # ------------------------------------------------------------------------------------------------- commands
    def _trainer_config(self) -> dict:
        return self._get(self.config_init, "trainer", default={}) or {}

    def _export_dir(self, subcommand: str) -> str | None:
        return str(self.config["export"]["output_dir"]) if subcommand == "export" else None

    def _run_subcommand(self, subcommand: str) -> None:
        """The command, after the output folders are probed; a missing input file and a write that fails are each a
        :class:`ConfigError` naming the file (and the config field that gives it, where one does)."""
        probe_output_folders(self.trainer, self._trainer_config(), subcommand, self._export_dir(subcommand))
        try:
            super()._run_subcommand(subcommand)
        except ConfigError:
            raise
        except FileNotFoundError as error:
            raise ConfigError(self._describe_file_error(error, "missing")) from error
        except OSError as error:
            if error.errno not in _UNWRITABLE or not error.filename:
                raise
            raise ConfigError(self._describe_file_error(error, "unwritable")) from error

    def _describe_file_error(self, error: OSError, kind: str) -> str:
        config = self.config.get(str(self.subcommand), self.config)
        message = " ".join(str(error).split())
        field = locate_field(config, message)
        head = f"{field[0]} = {field[1]!r}: " if field else ""
        if kind == "missing":
            advice = "check the path; data not written yet? the recipe's first comment shows the command that writes it"
        else:
            advice = (
                "check its permissions and free space, or choose another folder (trainer.default_root_dir, the "
                "loggers' and the callbacks' folders)"
            )
        return f"{head}{message}\n  {advice} ({type(error).__name__})"

    def _compare(self) -> bool:
        return bool(self.config.get(self.subcommand, {}).get("validate_before_and_after", False))

    def before_fit(self) -> None:
        if self._compare():
            self._before = self._validate()

    def after_fit(self) -> None:
        self._check_trained()
        summary = None
        if self._compare():
            summary = self._report(self._before, self._validate())
        self._print_artefacts(summary)

    def after_validate(self) -> None:
        self._print_artefacts(self._record_metrics("validate"))

    def after_test(self) -> None:
        self._print_artefacts(self._record_metrics("test"))

    def export(self, **kwargs: Any) -> None:
        path = self.trainer.export(**kwargs)
        print(f"exported to {path}", flush=True)

    def _check_trained(self) -> None:
        """A fit that had no training batch is an error naming the data (Lightning only logs it and returns)."""
        if self.trainer.num_training_batches != 0 or self.trainer.interrupted:
            return
        if self.trainer.limit_train_batches == 0:
            raise ConfigError("trainer.limit_train_batches is 0: fit had no training batch")
        data = self.config.get(str(self.subcommand), self.config).get("data") or {}
        init_args = data.get("init_args") or {}
        init_args = init_args if isinstance(init_args, dict) else vars(init_args)
        fields = [f"data.init_args.{k} = {v!r}" for k, v in init_args.items() if "train" in k] or ["data"]
        raise ConfigError(
            f"the training data is empty: {data.get('class_path', 'the data module')} gave no training batch "
            f"(check {', '.join(fields)} and its data set)"
        )

    def _validate(self) -> dict[str, float]:
        results = self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
        return {k: float(v) for k, v in (results[0] if results else {}).items()}

    def _summary_path(self) -> Path:
        return Path(self.trainer.log_dir or self.trainer.default_root_dir) / "summary.json"  # collective call

    def _report(self, before: dict[str, float], after: dict[str, float]) -> Path:
        path = self._summary_path()
        if self.trainer.is_global_zero:
            keys = sorted(set(before) | set(after))
            lines = [f"{'held-out metric':<32}{'before fit':>12}{'after fit':>12}"]
            lines += [f"{k:<32}{before.get(k, float('nan')):>12.3f}{after.get(k, float('nan')):>12.3f}" for k in keys]
            print("\n".join(["", *lines, ""]), flush=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"before": before, "after": after}, indent=2))
        return path

    def _record_metrics(self, stage: str) -> Path:
        """Add the metrics of a ``validate`` / ``test`` run to ``summary.json`` under ``stage``."""
        path = self._summary_path()
        if self.trainer.is_global_zero:
            metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items()}
            summary = json.loads(path.read_text()) if path.is_file() else {}
            summary[stage] = metrics
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary, indent=2))
        return path

    def _print_artefacts(self, summary: Path | None) -> None:
        text = artefact_summary(self.trainer, [("summary", summary)])  # every rank: trainer.log_dir is collective
        if self.trainer.is_global_zero:
            print(text, flush=True)


def fsdp2_processes(trainer: Any) -> int:
    """The number of processes a trainer config runs :class:`~app.parallel.FSDP2Strategy` on, 0 for another strategy.

    ``WORLD_SIZE`` where a launcher set it (torchrun; Lightning's launcher for the processes it starts), else
    ``devices x num_nodes`` as Lightning counts them (``auto`` and -1: every GPU, or one CPU process), which is what
    the first process of Lightning's launcher knows when it builds the model."""
    from app.parallel import FSDP2Strategy

    strategy = trainer.get("strategy")
    class_path = strategy.get("class_path") if hasattr(strategy, "get") else None
    if isinstance(class_path, str):
        module, _, name = class_path.rpartition(".")
        try:
            strategy = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return 0
    if not (
        isinstance(strategy, FSDP2Strategy) or (isinstance(strategy, type) and issubclass(strategy, FSDP2Strategy))
    ):
        return 0
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    devices = trainer.get("devices", "auto")
    if isinstance(devices, (list, tuple)):
        per_node = len(devices)
    elif isinstance(devices, str) and "," in devices:
        per_node = len([d for d in devices.split(",") if d.strip()])
    elif str(devices).strip() in ("auto", "-1"):
        per_node = -1
    else:
        try:
            per_node = int(devices)
        except (TypeError, ValueError):  # Lightning reports a bad value itself
            return 1
    if per_node == -1:
        import torch

        on_cpu = trainer.get("accelerator", "auto") == "cpu" or not torch.cuda.is_available()
        per_node = 1 if on_cpu else torch.cuda.device_count()
    return per_node * int(trainer.get("num_nodes") or 1)


_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR)


def _strip_debug_flag(argv: list[str] | None) -> list[str] | None:
    """Remove ``--debug`` (from ``argv``, or from ``sys.argv`` when None) and set ``APP_DEBUG=1`` instead, which
    subprocesses (DDP ranks) inherit."""
    args = sys.argv if argv is None else argv
    if "--debug" not in args[(1 if argv is None else 0) :]:
        return argv
    os.environ[DEBUG_ENV] = "1"
    if argv is None:
        sys.argv = [a for i, a in enumerate(sys.argv) if i == 0 or a != "--debug"]
        return None
    return [a for a in argv if a != "--debug"]


def _report(text: str) -> None:
    """Write an error message to stderr; a process other than rank 0 of several says which rank it is (each rank
    reports its own error, as Lightning prefixes its own lines)."""
    from lightning.pytorch.utilities import rank_zero_only

    rank = getattr(rank_zero_only, "rank", 0) or 0
    sys.stderr.write((f"[rank: {rank}] " if rank else "") + text + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = _strip_debug_flag(argv)
    quiet_known_noise()
    try:
        AppCLI(args=argv)
    except ConfigError as error:
        if debug_enabled():
            raise
        text = str(error)
        if not text.startswith("error:"):
            text = f"error: {text}\n{DEBUG_HINT}"
        _report(text)
        raise SystemExit(1) from None
    except NonFiniteTrainingError as error:  # the message says what stayed non-finite and what to change
        if debug_enabled():
            raise
        text = str(error)
        if "reward" in text and "max_nonfinite_steps" not in text:  # what to change, where the message has none
            text += (
                "\n  check the rewards (model.init_args.rewards), or raise "
                "model.init_args.optimizer.max_nonfinite_steps"
            )
        _report(f"error: training stopped: {text}\n{DEBUG_HINT}")
        raise SystemExit(1) from None
    except RewardError as error:  # names the reward and the cause (a reward that raised, a server that failed)
        if debug_enabled():
            raise
        hint = "  check the reward (model.init_args.rewards)"
        if "http" in str(error):
            hint += "; a served reward can skip what it cannot score: init_args.on_failure: skip"
        _report(f"error: training stopped: {error}\n{hint}\n{DEBUG_HINT}")
        raise SystemExit(1) from None
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
