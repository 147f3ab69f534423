"""What every module of the package shares: one policy, AdamW with warm-up, and checkpoints that resume exactly."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, ExitStack, nullcontext

import lightning as L
import torch

from app.models.policy import Policy
from app.modules.checkpoints import (
    RANK_STATES,
    fit_optimizers,
    gather_rank_states,
    omit_frozen_parameters,
    restore_frozen_parameters,
    restore_rng_states,
    rng_states,
    saved_rank_state,
    seed_rng_states,
)
from app.modules.ema import PolicyEMA
from app.modules.finite_step import FiniteStepGuard, named_tensors, nonfinite_flags
from app.modules.optim import adamw_with_warmup
from app.modules.precision import report_precision
from app.parallel.fsdp import FSDP2Strategy, full_tensor, gathered, is_sharded, local_tensor, shard_policy
from app.parallel.loading import deferred_networks, materialize
from app.settings import EMASettings, OptimizerSettings, as_settings, plain, with_defaults

log = logging.getLogger(__name__)


NONFINITE_GRADIENT = "a non-finite loss or gradient"
"""The reason :meth:`PolicyModule._count_skip` logs for an update left out before its optimizer step."""
UNDONE = "an optimizer step that left NaN or inf behind, undone"
"""The reason :meth:`PolicyModule._count_skip` logs for a step :meth:`PolicyModule.guarded_step` undid."""


class NonFiniteTrainingError(RuntimeError):
    """Training cannot go on: updates or rewards stayed non-finite for ``max_nonfinite_steps`` steps in a row (or an
    optimizer step went non-finite with ``restore_nonfinite_steps`` off)."""


class NonFiniteCheckpointError(NonFiniteTrainingError):
    """A checkpoint about to be written holds a NaN or an infinity in its weights or optimizer state: it is not
    written."""


class PolicyModule(L.LightningModule):
    """A LightningModule around one :class:`~app.models.policy.Policy`.

    It optimises the policy's trainable parameters with AdamW and a linear warm-up, and writes lean checkpoints (only
    what an optimizer updates, see :mod:`app.modules.checkpoints`) that carry the global random generators' states.
    Its hyper-parameters (``hparams``, saved in checkpoints and logged) are what each subclass records with
    :meth:`record_hyperparameters`: plain data only, so a checkpoint loads with ``weights_only=True``.

    Args:
        policy: the model to train.
        optimizer: AdamW, its warm-up, and what happens to a non-finite step (:class:`~app.settings.OptimizerSettings`).
        default_learning_rate: the learning rate when ``optimizer.learning_rate`` is None (the module's default).
        ema: a moving average of the trainable weights, used for validation and export (:class:`~app.settings.
            EMASettings`, :mod:`app.modules.ema`); None: the trained weights are used.
    """

    def __init__(
        self,
        policy: Policy,
        optimizer: OptimizerSettings | None,
        default_learning_rate: float,
        ema: EMASettings | None = None,
    ):
        super().__init__()
        settings = as_settings(OptimizerSettings, optimizer) or OptimizerSettings()
        self.optimizer_settings = with_defaults(settings, learning_rate=default_learning_rate)
        self.policy = policy
        self.ema_settings = as_settings(EMASettings, ema)
        self.policy_ema: PolicyEMA | None = None  # built with the (sharded) parameters, in configure_model
        self._evaluation_weights: ExitStack | None = None
        self.record_hyperparameters(optimizer=plain(self.optimizer_settings))
        if self.ema_settings is not None:
            self.record_hyperparameters(ema=plain(self.ema_settings))
        self.skipped_updates = 0  # non-finite updates skipped so far
        self._consecutive_skips = 0
        self._dropped_step = False  # automatic optimisation: this step's gradients were dropped as non-finite
        self._last_update_applied = (
            True  # whether the latest optimizer step changed the weights (see lr_scheduler_step)
        )
        self._step_guards: dict[int, FiniteStepGuard] = {}  # per optimizer: see _step_guard

    def configure_model(self) -> None:
        """Shard the policy when the trainer runs :class:`~app.parallel.FSDP2Strategy` (Lightning calls this before
        it builds the optimizer, so the optimizer holds the sharded parameters): the networks a policy built empty
        (:mod:`app.parallel.loading`) are then filled shard by shard. What is not sharded and was built empty (any run
        without FSDP2) is loaded whole."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, FSDP2Strategy) and not is_sharded(self.policy):
            shard_policy(self.policy.sharding_plan(), strategy.shard_settings(), strategy.reshard_after_forward)
        materialize(deferred_networks(self.policy))
        if self.ema_settings is not None and self.policy_ema is None:  # on the parameters the optimizer will hold
            self.policy_ema = PolicyEMA(self.policy.trainable_parameters(), self.ema_settings)

    # ---------------------------------------------------------------------------------------------------- EMA
    def evaluation_weights(self) -> AbstractContextManager[None]:
        """Inside, the policy holds the weights validation and export use: the moving average when ``ema`` is on
        (the trained weights come back after), else the trained weights themselves."""
        return self.policy_ema.swapped_in() if self.policy_ema is not None else nullcontext()

    # validate, test and predict all run on the evaluation weights: a `test` of an EMA run scores what `validate` does
    def on_validation_start(self) -> None:
        self._enter_evaluation_weights()

    def on_validation_end(self) -> None:
        self._leave_evaluation_weights()

    def on_test_start(self) -> None:
        self._enter_evaluation_weights()

    def on_test_end(self) -> None:
        self._leave_evaluation_weights()

    def on_predict_start(self) -> None:
        self._enter_evaluation_weights()

    def on_predict_end(self) -> None:
        self._leave_evaluation_weights()

    def _enter_evaluation_weights(self) -> None:
        self._leave_evaluation_weights()  # a stage that raised never reached its end hook
        self._evaluation_weights = ExitStack()
        self._evaluation_weights.enter_context(self.evaluation_weights())

    def _leave_evaluation_weights(self) -> None:
        if self._evaluation_weights is not None:
            self._evaluation_weights.close()
            self._evaluation_weights = None

    def gathered_policy(self) -> AbstractContextManager[None]:
        """Rollouts and evaluation run inside: the sharded policy is gathered once, and resharded after."""
        return gathered(self.policy)

    def configure_optimizers(self):
        """AdamW with warm-up over the policy's ``parameter_groups(learning_rate)`` (param groups with their own
        rates) when it has that method, else over its ``trainable_parameters()`` at the module's rate."""
        parameters = self.policy.trainable_parameters()
        if not parameters:
            raise ValueError("the policy has no trainable parameters: set a LoRA adapter or freeze less")
        settings = self.optimizer_settings
        if hasattr(self.policy, "parameter_groups"):
            parameters = self.policy.parameter_groups(settings.learning_rate)
        return adamw_with_warmup(parameters, settings.learning_rate, settings.weight_decay, settings.warmup_steps)

    def record_hyperparameters(self, **values) -> None:
        """Add ``values`` (plain data: numbers, strings, lists, dicts; each a constructor argument) to the
        hyper-parameters. They carry the module's class path as LightningCLI records it (``_class_path``), so that a
        fit resumed through the CLI (``--ckpt_path``) parses them against this class."""
        cls = type(self)
        self.save_hyperparameters({"_class_path": f"{cls.__module__}.{cls.__qualname__}", **self.hparams, **values})

    def on_train_start(self) -> None:
        """Say in which dtypes the fit stores and computes (:mod:`app.modules.precision`, a warning when trainable
        weights are 16-bit), and warn about trainable modules in eval mode. Lightning's warning counts every module in
        eval mode, including the frozen VAE, encoders and reference kept there on purpose, so
        ``app.command_line.console`` filters it for this one."""
        if self._trainer is not None:  # tests call the hook on a bare module
            report_precision(self, fit_optimizers(self), self._trainer)
        stray = [name for name, module in self.named_modules() if not module.training and _trains_own_weights(module)]
        if stray:
            log.warning(
                "%d module(s) with trainable parameters are in eval mode at the start of training (dropout and "
                "normalisation statistics act as in evaluation): %s",
                len(stray),
                ", ".join(stray[:3]) + (", ..." if len(stray) > 3 else ""),
            )

    # --------------------------------------------------------------------------------------------------- faults
    def on_before_optimizer_step(self, optimizer) -> None:
        """Automatic optimisation (SFT, flow matching): drop the gradients of a non-finite step, so the optimizer
        leaves every parameter and its state unchanged; :meth:`optimizer_step` counts it (manual optimisation checks
        in its own update). Lightning calls this inside the step, after the callbacks' own hook."""
        if not self.automatic_optimization:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = full_tensor(torch.nn.utils.get_total_norm(grads))  # 0 without gradients
        self._dropped_step = self._any_rank(not bool(torch.isfinite(norm)))
        if self._dropped_step:
            optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Automatic optimisation's step (Lightning runs forward, backward and :meth:`on_before_optimizer_step` inside
        it, through the closure), guarded by :meth:`guarded_step` and counted once: a step whose gradients were dropped
        or that was undone is a skipped update."""
        self._dropped_step = False
        undone = self.guarded_step(optimizer, optimizer_closure)
        if self._dropped_step:
            self._count_skip(NONFINITE_GRADIENT)
        elif undone:
            self._count_skip(UNDONE)
        else:
            self._count_applied()
        # batch_size only weighs epoch means: this on_step value never reads it
        self.log("train/skipped_updates", float(self.skipped_updates), batch_size=1)

    def lr_scheduler_step(self, scheduler, metric) -> None:
        """Lightning steps the schedule after every optimizer step of automatic optimisation; a skipped or undone
        step changed nothing, so the schedule stays where it is, as AdamW's step count does (see
        :meth:`idle_step` for the counters)."""
        if self._last_update_applied:
            super().lr_scheduler_step(scheduler, metric)

    def guarded_step(self, optimizer, closure=None) -> bool:
        """``optimizer.step(closure)`` that leaves no NaN or inf in the weights or the optimizer state, on every rank
        alike (:mod:`app.modules.finite_step`). When the step left one on any rank, the values from before it are put
        back and True is returned (count it as a skipped update); with ``restore_nonfinite_steps`` off there is no
        copy to put back, and :class:`NonFiniteTrainingError` stops the run. With a closure (automatic optimisation
        runs forward and backward inside the step) the copy is taken after the closure has run."""
        guard = self._step_guard(optimizer)
        if closure is None:
            guard.snapshot()
            optimizer.step()
        else:
            optimizer.step(closure=guard.after(closure))
        local = guard.nonfinite()
        if not self._any_rank(local > 0):
            self._average_step()
            return False
        where = f"{local} non-finite tensor(s) on this rank" if local else "non-finite tensors on another rank"
        if not guard.restorable:
            reason = (
                "restore_nonfinite_steps is off, so no copy was kept to put back"
                if not self.optimizer_settings.restore_nonfinite_steps
                else "the optimizer never ran its closure, so no copy was taken (restore_nonfinite_steps needs one)"
            )
            raise NonFiniteTrainingError(
                f"the optimizer step left NaN or inf in the weights or the optimizer state ({where}) and {reason}; "
                "stopping before anything trains on them or saves them (the weights in memory are not finite). Set "
                "model.init_args.optimizer.restore_nonfinite_steps: true to undo and skip such a step, or lower the "
                "learning rate and check the model's dtype"
            )
        guard.restore()
        log.warning(
            "the optimizer step left NaN or inf in the weights or the optimizer state (%s): put back the values from "
            "before the step",
            where,
        )
        self._average_step()  # the step still counts (global_step), with the weights from before it
        return True

    def idle_step(self, optimizer) -> None:
        """An optimizer step that changes nothing, for an update left out (a non-finite loss or gradient, nothing to
        train on): without gradients AdamW skips every parameter, so no weight, moment, weight decay or step count
        moves. The counters then agree for every kind of update:

        - ``trainer.global_step`` counts every update, taken, undone or left out (it ends a fit at ``max_steps``,
          names checkpoints and clocks the moving average, whose step count equals it);
        - AdamW's step count and the learning-rate schedule (its warm-up) count the updates that changed the weights:
          ``global_step`` minus ``train/skipped_updates`` minus ``train/empty_updates``."""
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        self._average_step()

    def _average_step(self) -> None:
        """Take the weights of the optimizer step just made into the moving average, inside the training step, so
        that a checkpoint written at the end of the batch holds the average of that step."""
        if self.policy_ema is not None:
            self.policy_ema.step()

    def _step_guard(self, optimizer) -> FiniteStepGuard:
        """The guard of ``optimizer`` (a ``LightningOptimizer`` or what it wraps), kept across steps so its copy's
        memory is allocated once, ready for this step."""
        key = id(getattr(optimizer, "optimizer", optimizer))
        guards = self._step_guards
        if key not in guards or guards[key].keep_copy != self.optimizer_settings.restore_nonfinite_steps:
            guards[key] = FiniteStepGuard(optimizer, keep_copy=self.optimizer_settings.restore_nonfinite_steps)
        guards[key].next_step(optimizer)
        return guards[key]

    def _any_rank(self, decision: bool) -> bool:
        """True on every rank when ``decision`` is True on any (so all ranks skip or stop together)."""
        if self._trainer is None:
            return decision
        return self._trainer.strategy.reduce_boolean_decision(decision, all=False)

    def _count_applied(self) -> None:
        """The latest optimizer step changed the weights."""
        self._consecutive_skips = 0
        self._last_update_applied = True

    def _count_skip(self, reason: str) -> None:
        """The latest optimizer step was left out or undone because of ``reason``; stop after
        ``max_nonfinite_steps`` in a row."""
        self._last_update_applied = False
        self.skipped_updates += 1
        self._consecutive_skips += 1
        log.warning(
            "skipped an update with %s (%d in a row, %d in all); trainer.global_step counts it, AdamW's step count and "
            "the learning-rate schedule do not",
            reason,
            self._consecutive_skips,
            self.skipped_updates,
        )
        if self._consecutive_skips >= self.optimizer_settings.max_nonfinite_steps:
            raise NonFiniteTrainingError(
                f"{self._consecutive_skips} consecutive updates were not finite and were skipped (the last: {reason}); "
                "stopping (the weights are unchanged since the last finite update). Lower the learning rate, check "
                "the rewards and the model's dtype, or raise model.init_args.optimizer.max_nonfinite_steps"
            )

    # ---------------------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Sampling draws from the global generators (and a module's own), which differ between ranks: Lightning calls
        # this hook on every rank and writes the checkpoint from rank 0, so every rank's states are gathered into it.
        checkpoint[RANK_STATES] = gather_rank_states(self.rank_state())
        omit_frozen_parameters(self, checkpoint, fit_optimizers(self))
        check_finite_checkpoint(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        world_size = self._trainer.world_size if self._trainer is not None else 1
        self.load_rank_state(*saved_rank_state(checkpoint, self.global_rank, world_size))
        restore_frozen_parameters(self, checkpoint)

    def rank_state(self) -> dict:
        """This process's random state for a checkpoint, as plain data and tensors: the global generators' states
        (``"rng"``); a subclass adds its own generators."""
        return {"rng": rng_states()}

    def load_rank_state(self, saved: dict, fresh_seed: int | None) -> None:
        """Take back what :meth:`rank_state` saved on this rank. ``fresh_seed`` is set when the checkpoint holds no
        state for this rank (see :func:`~app.modules.checkpoints.saved_rank_state`): fresh generators come from it."""
        if "rng" in saved:
            restore_rng_states(saved["rng"])
        elif fresh_seed is not None:
            seed_rng_states(fresh_seed)


def check_finite_checkpoint(checkpoint: dict) -> None:
    """Raise :class:`NonFiniteCheckpointError` on every rank when any rank's ``checkpoint`` holds a NaN or inf in its
    ``state_dict`` or ``optimizer_states`` tensors (their local shards for DTensors, as a sharded checkpoint holds
    them), naming the first such tensor and how many there are, so that Lightning never writes it. A collective under
    ``torch.distributed``, as the rest of ``on_save_checkpoint``: every rank calls it."""
    named = [
        (name, local_tensor(tensor))
        for part in ("state_dict", "optimizer_states")
        for name, tensor in named_tensors(checkpoint.get(part), part)
    ]
    bad = [name for (name, _), flag in zip(named, nonfinite_flags([t for _, t in named]), strict=True) if flag]
    reports = gather_rank_states((len(bad), len(named), bad[0] if bad else None))
    total = sum(count for count, _, _ in reports)
    if not total:
        return
    rank, (_, _, first) = next((rank, report) for rank, report in enumerate(reports) if report[0])
    checked = sum(n for _, n, _ in reports)
    on_rank = f" (rank {rank})" if len(reports) > 1 else ""
    raise NonFiniteCheckpointError(
        f"refusing to write a checkpoint in which {total} of {checked} tensors hold NaN or inf, the first {first!r}"
        f"{on_rank}; nothing non-finite is saved. Resume from an earlier checkpoint (a non-finite optimizer step is "
        "undone and skipped unless model.init_args.optimizer.restore_nonfinite_steps is false)"
    )


def _trains_own_weights(module: torch.nn.Module) -> bool:
    """Whether ``module`` itself (not a child) holds a parameter that requires gradients."""
    return any(p.requires_grad for p in module.parameters(recurse=False))
