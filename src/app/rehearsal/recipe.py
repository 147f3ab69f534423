"""A GPU recipe turned into its CPU rehearsal: the same config except for what a CPU cannot have, every change listed.

Kept as written: precision, the policy's dtype, the strategy block (DDP or FSDP2 with its mixed-precision policy), LoRA
targets, optimizer and learning rate, sampling (but for its lengths), rewards and the data module with its generator
commands. Changed (each a :class:`Change` with its reason): the model (the embedded tiny model of the same family and
conditioning) and a learned-scorer reward's model (the embedded tiny scorer), the accelerator (CPU, two processes on
gloo), CUDA-only kernels, sizes a CPU cannot run in seconds, where the run writes, validation (off), checkpointing
(every step) and, for a module trained by its rewards (a :class:`~app.modules.GRPOModule`), one reward added so that a
random tiny model's groups have a spread of rewards (the recipe's own rewards give a random model the same value on
every completion, so no advantage and no update: nothing to measure).
"""

from __future__ import annotations

import copy
import importlib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import ConfigError

PROCESSES = 2  # a recipe that runs across processes (DDP, FSDP2) is rehearsed on two, over gloo
TINY_MODELS: tuple[tuple[str, str], ...] = (  # (pattern of the recipe's model, lower case; embedded tiny model)
    (r"qwen2[._]?5[-_]?vl", "tiny-qwen2.5-vl"),
    (r"qwen3[-_]?vl", "tiny-qwen3-vl"),
    (r"qwen2[-_]?vl", "tiny-qwen2-vl"),
    (r"wan2[._]?2.*ti2v", "tiny-wan-ti2v"),
    (r"wan.*i2v", "tiny-wan-i2v"),
    (r"wan", "tiny-wan"),
    (r"kontext", "tiny-flux-kontext"),
    (r"flux", "tiny-flux"),
    (r"stable-diffusion-3|sd3", "tiny-sd3"),
)
MAX_NEW_TOKENS = 16
FLOW_STEPS = 4
IMAGE_SIZE = 128  # VBVR problems need 128 px to hold their layout
BATCH_SIZE = 2
SAMPLES = 16  # per generated split
SAMPLES_PER_SHARD = 4  # several shards per split: finite streams split shards between the ranks
TRAIN_ITEMS = 16  # per rank, for procedural data modules
TINY_SCORERS = {  # a learned-scorer reward's class name -> the embedded scorer it is rehearsed with
    "CLIPScoreReward": "tiny-clip",
    "PreferenceScoreReward": "tiny-pickscore",
}
VARIETY_REWARDS = {
    "vlm": "app.rehearsal.rewards.CharacterCountReward",
    "flow": "app.rehearsal.rewards.PixelMeanReward",
}


@dataclass(frozen=True)
class Change:
    """One field the rehearsal sets differently from the recipe (``recipe`` None: the recipe does not set it)."""

    field: str
    recipe: Any
    rehearsal: Any
    why: str


@dataclass
class RehearsalPlan:
    """A recipe's rehearsal: its config, the changes from the recipe, its processes and the data it generates first."""

    name: str
    config: dict
    changes: list[Change] = field(default_factory=list)
    processes: int = 1
    data_commands: list[list[str]] = field(default_factory=list)  # ``python -m app.tasks`` argument lists


def gpu_recipes(folder: Path) -> list[Path]:
    """The recipes under ``folder`` (its subfolders included) written for GPUs (``trainer.accelerator: gpu``)."""
    import yaml

    found = []
    for path in sorted(folder.rglob("*.yaml")):
        config = yaml.safe_load(path.read_text()) or {}
        if str((config.get("trainer") or {}).get("accelerator", "")).lower() in ("gpu", "cuda"):
            found.append(path)
    return found


def plan_rehearsal(recipe_path: Path, out: Path, data_root: Path | None = None) -> RehearsalPlan:
    """The rehearsal of the recipe at ``recipe_path``, writing under ``out``, its data under ``data_root`` (default
    ``out/data``)."""
    import yaml

    text = recipe_path.read_text()
    recipe = yaml.safe_load(text) or {}
    if not isinstance(recipe, dict) or "model" not in recipe:
        raise ConfigError(f"{recipe_path} is not a recipe: it has no model block")
    plan = RehearsalPlan(name=recipe_path.stem, config=copy.deepcopy(recipe))
    editor = _Editor(plan)
    _swap_model(editor)
    _swap_scorers(editor)
    _cpu_processes(editor)
    _kernels(editor)
    _sizes(editor)
    _run_settings(editor, out)
    _data(editor, text, data_root or out / "data")
    _variety_reward(editor)
    return plan


def float32_variant(config: dict) -> tuple[dict, list[Change]]:
    """The same rehearsal in float32 throughout (precision, the policy's weights, FSDP2's compute and reductions): the
    reference whose share of changed trainable elements a bf16 rehearsal must match."""
    plan = RehearsalPlan(name="float32", config=copy.deepcopy(config))
    editor = _Editor(plan)
    why = "the float32 reference"
    editor.set("trainer.precision", "32-true", why)
    editor.set("model.init_args.policy.init_args.dtype", "float32", why)
    strategy = editor.get("trainer.strategy")
    if isinstance(strategy, dict) and "init_args" in strategy:
        for name in ("param_dtype", "reduce_dtype"):
            if editor.get(f"trainer.strategy.init_args.{name}") is not None:
                editor.set(f"trainer.strategy.init_args.{name}", None, why)
    return plan.config, plan.changes


# ------------------------------------------------------------------------------------------------- the edits
_MISSING = object()


class _Editor:
    """Reads and sets dotted fields of a plan's config, recording each change."""

    def __init__(self, plan: RehearsalPlan):
        self.plan = plan

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.plan.config
        for key in dotted.split("."):
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, dict) and key in node:
                node = node[key]
            else:
                return default
        return node

    def set(self, dotted: str, value: Any, why: str) -> None:
        keys = dotted.split(".")
        node: Any = self.plan.config
        for key in keys[:-1]:  # a list item by its index (trainer.callbacks.0), a dict key made where missing
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        old = node.get(keys[-1], None)
        if old == value and keys[-1] in node:
            return
        node[keys[-1]] = value
        self.plan.changes.append(Change(dotted, old, value, why))

    def cap(self, dotted: str, limit: int, why: str) -> None:
        value = self.get(dotted, _MISSING)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            self.set(dotted, limit, why)


POLICY = "model.init_args.policy.init_args"


def _family(editor: _Editor) -> str:
    policy_class = str(editor.get("model.init_args.policy.class_path", ""))
    return "flow" if "Flow" in policy_class else "vlm"


def _swap_model(editor: _Editor) -> None:
    model = editor.get(f"{POLICY}.model")
    if not isinstance(model, str):
        raise ConfigError(f"{editor.plan.name}: {POLICY}.model is not set")
    lowered = model.lower()
    tiny = next((name for pattern, name in TINY_MODELS if re.search(pattern, lowered)), None)
    if tiny is None:
        known = ", ".join(name for _, name in TINY_MODELS)
        raise ConfigError(f"{editor.plan.name}: no embedded tiny model matches {POLICY}.model = {model!r} ({known})")
    editor.set(f"{POLICY}.model", tiny, "the embedded tiny model of the same family and conditioning")


def _swap_scorers(editor: _Editor) -> None:
    """Learned-scorer rewards (``app.rewards.learned``) score with embedded tiny models on the CPU: CLIP-type ones
    with :data:`TINY_SCORERS`, a VLM judge with the tiny model of its checkpoint's family."""
    rewards = editor.get("model.init_args.rewards") or []
    for index, reward in enumerate(rewards):
        if not isinstance(reward, dict) or not str(reward.get("class_path", "")).startswith("app.rewards.learned"):
            continue
        name, field_ = str(reward["class_path"]).rsplit(".", 1)[-1], f"model.init_args.rewards.{index}.init_args"
        model = str(editor.get(f"{field_}.model", ""))
        tiny = TINY_SCORERS.get(name) or next((t for p, t in TINY_MODELS if re.search(p, model.lower())), None)
        if tiny is None:
            raise ConfigError(f"{editor.plan.name}: no embedded scorer matches {field_}.model = {model!r}")
        editor.set(f"{field_}.model", tiny, "the embedded tiny scorer of the same kind (no download)")
        if editor.get(f"{field_}.processor") is not None:
            editor.set(f"{field_}.processor", None, "the tiny scorer carries its own processor")
        if editor.get(f"{field_}.device") is not None:
            editor.set(f"{field_}.device", None, "no GPU: the scorer runs where the samples are")


def _cpu_processes(editor: _Editor) -> None:
    editor.set("trainer.accelerator", "cpu", "no GPU")
    strategy = editor.get("trainer.strategy")
    name = strategy.get("class_path", "") if isinstance(strategy, dict) else str(strategy or "")
    distributed = "FSDP" in name or "ddp" in name.lower()
    editor.plan.processes = PROCESSES if distributed else 1
    devices = PROCESSES if distributed else 1
    editor.set("trainer.devices", devices, "two processes on gloo" if distributed else "one CPU process")
    if editor.get("trainer.num_nodes", 1) != 1:
        editor.set("trainer.num_nodes", 1, "one machine")


def _kernels(editor: _Editor) -> None:
    if editor.get(f"{POLICY}.use_liger_kernel"):
        editor.set(f"{POLICY}.use_liger_kernel", False, "Liger's Triton kernels need CUDA")
    if editor.get(f"{POLICY}.attn_implementation") == "flash_attention_2":
        editor.set(f"{POLICY}.attn_implementation", "sdpa", "flash-attn needs CUDA")
    if editor.get(f"{POLICY}.attention_backend") not in (None, "native"):
        editor.set(f"{POLICY}.attention_backend", None, "the attention backend needs CUDA")


def _sizes(editor: _Editor) -> None:
    why = "size: a CPU runs it in seconds"
    module = "model.init_args"
    editor.cap(f"{module}.sampling.max_new_tokens", MAX_NEW_TOKENS, why)
    editor.cap(f"{module}.eval_max_new_tokens", MAX_NEW_TOKENS, why)
    editor.cap(f"{module}.sampling.num_steps", FLOW_STEPS, why)
    editor.cap(f"{module}.sampling.eval_num_steps", FLOW_STEPS, why)
    if editor.get(f"{POLICY}.resolution") is not None:
        editor.set(f"{POLICY}.resolution", None, "size: the tiny model's own resolution")
    for index, reward in enumerate(editor.get(f"{module}.rewards") or []):
        if isinstance(reward, dict) and (reward.get("init_args") or {}).get("num_workers"):
            editor.set(f"{module}.rewards.{index}.init_args.num_workers", 0, "scored inline: cheaper than workers")
    editor.cap("data.init_args.batch_size", BATCH_SIZE, why)
    editor.cap("data.init_args.image_size", IMAGE_SIZE, why)
    editor.cap("data.init_args.train_size", TRAIN_ITEMS, why)
    editor.cap("data.init_args.epoch_size", TRAIN_ITEMS, why)
    for name in ("val_size", "test_size"):
        editor.cap(f"data.init_args.{name}", 0, "validation is off")
    editor.cap("data.init_args.num_workers", 0, "loader in the main process: cheaper than worker processes")


def _run_settings(editor: _Editor, out: Path) -> None:
    editor.set("trainer.default_root_dir", str(out), "the rehearsal's folder")
    for name in ("max_epochs", "val_check_interval", "check_val_every_n_epoch"):
        if editor.get(f"trainer.{name}", _MISSING) is not _MISSING:
            editor.set(f"trainer.{name}", None if name != "check_val_every_n_epoch" else 1, "the fit is a few steps")
    editor.set("trainer.limit_val_batches", 0, "validation is off")
    editor.set("trainer.num_sanity_val_steps", 0, "validation is off")
    if editor.get("validate_before_and_after"):
        editor.set("validate_before_and_after", False, "validation is off")
    logger = editor.get("trainer.logger")
    if isinstance(logger, dict) and "save_dir" in (logger.get("init_args") or {}):
        editor.set("trainer.logger.init_args.save_dir", str(out), "the rehearsal's folder")
    callbacks = editor.get("trainer.callbacks") or []
    if not any(isinstance(c, dict) and c.get("class_path", "").endswith("ModelCheckpoint") for c in callbacks):
        callbacks = [*callbacks, {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {}}]
        editor.plan.config["trainer"]["callbacks"] = callbacks
        why = "Lightning's default checkpoint writes at epoch ends only"
        editor.plan.changes.append(Change("trainer.callbacks", None, "+ ModelCheckpoint", why))
    for index, callback in enumerate(callbacks):
        if not isinstance(callback, dict):
            continue
        prefix = f"trainer.callbacks.{index}.init_args"
        if callback.get("class_path", "").endswith("ModelCheckpoint"):
            editor.set(f"{prefix}.dirpath", str(out / "checkpoints"), "the rehearsal's folder")
            editor.set(f"{prefix}.every_n_train_steps", 1, "a checkpoint every step, to resume from")
            editor.set(f"{prefix}.save_last", True, "a checkpoint every step, to resume from")
            editor.set(f"{prefix}.save_top_k", 0, "only last.ckpt, the one resumed from")
        elif "output_dir" in (callback.get("init_args") or {}):
            name = Path(str(callback["init_args"]["output_dir"])).name
            editor.set(f"{prefix}.output_dir", str(out / name), "the rehearsal's folder")


def _data(editor: _Editor, recipe_text: str, root: Path) -> None:
    """Point the data module's ``data/...`` URLs under ``root`` and generate them with the recipe header's own
    ``python -m app.tasks`` commands, at :data:`SAMPLES` samples per split."""
    relocate: Callable[[str], str] = lambda path: str(root / Path(path).relative_to("data"))  # noqa: E731
    for name in ("train_urls", "val_urls", "test_urls"):
        urls = editor.get(f"data.init_args.{name}")
        if isinstance(urls, str) and urls.startswith("data/"):
            editor.set(f"data.init_args.{name}", relocate(urls), "the rehearsal's generated shards")
    for command in header_task_commands(recipe_text):
        args = list(command)
        for flag, value in (("--num", str(SAMPLES)), ("--max-per-shard", str(SAMPLES_PER_SHARD))):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        if "--out" in args and args[args.index("--out") + 1].startswith("data/"):
            args[args.index("--out") + 1] = relocate(args[args.index("--out") + 1])
        editor.plan.data_commands.append(args)
    train_urls = editor.get("data.init_args.train_urls")
    if isinstance(train_urls, str) and not editor.plan.data_commands:
        raise ConfigError(
            f"{editor.plan.name}: data.init_args.train_urls is {train_urls!r} but the recipe's header has no "
            "'python -m app.tasks ...' command that writes it"
        )


def header_task_commands(recipe_text: str) -> list[list[str]]:
    """The ``python -m app.tasks ...`` commands of a recipe's header comment, as argument lists after ``app.tasks``."""
    commands = []
    for line in recipe_text.splitlines():
        if not line.startswith("#"):
            break
        for part in line.lstrip("#").split("&&"):
            if part.strip().startswith("python -m app.tasks "):
                commands.append(shlex.split(part.strip())[3:])
    return commands


def _trained_by_rewards(editor: _Editor) -> bool:
    """Whether the recipe's module trains on its rewards: a :class:`~app.modules.GRPOModule`, the reward-driven loop
    of every RL module (flow-GRPO, DiffusionNFT, VLM GRPO), whatever its class is called."""
    from app.modules import GRPOModule

    class_path = str(editor.get("model.class_path", ""))
    module_name, _, class_name = class_path.rpartition(".")
    try:
        module = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"{editor.plan.name}: model.class_path {class_path!r} cannot be imported: {error}") from error
    return isinstance(module, type) and issubclass(module, GRPOModule)


def _variety_reward(editor: _Editor) -> None:
    if not _trained_by_rewards(editor):
        return
    class_path = VARIETY_REWARDS[_family(editor)]
    rewards = editor.plan.config["model"]["init_args"].setdefault("rewards", [])
    rewards.append({"class_path": class_path, "init_args": {"weight": 1.0}})
    why = "a random tiny model's completions differ in it, so its groups get advantages"
    editor.plan.changes.append(Change("model.init_args.rewards", None, f"+ {class_path}", why))
