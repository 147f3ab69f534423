"""What every module of the package shares: one policy, AdamW with warm-up, and checkpoints that resume exactly."""

from __future__ import annotations

from contextlib import AbstractContextManager

import lightning as L

from app.models.policy import Policy
from app.modules.checkpoints import (
    fit_optimizers,
    omit_frozen_parameters,
    restore_frozen_parameters,
    restore_rng_states,
    rng_states,
)
from app.modules.optim import adamw_with_warmup
from app.parallel.fsdp import FSDP2Strategy, gathered, is_sharded, shard_policy

HPARAMS_IGNORED = ["policy", "rewards", "eval_rewards", "sampling"]
"""Constructor arguments that are objects, not hyper-parameters (``sampling`` is stored as plain data instead)."""


class PolicyModule(L.LightningModule):
    """A LightningModule around one :class:`~app.models.policy.Policy`.

    It optimises the policy's trainable parameters with AdamW and a linear warm-up, and writes lean checkpoints (only
    what an optimizer updates, see :mod:`app.modules.checkpoints`) that carry the global random generators' states.
    It records the constructor arguments of the whole subclass chain as hyper-parameters.

    Args:
        policy: the model to train.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up, in optimizer steps.
    """

    def __init__(
        self, policy: Policy, learning_rate: float, weight_decay: float = 0.0, warmup_steps: int = 0
    ):  # pragma: no mutate block (save_hyperparameters reads the subclasses' frames; a trampoline would hide them)
        super().__init__()
        self.save_hyperparameters(ignore=HPARAMS_IGNORED)
        self.policy = policy

    def configure_model(self) -> None:
        """Shard the policy when the trainer runs :class:`~app.parallel.FSDP2Strategy` (Lightning calls this before
        it builds the optimizer, so the optimizer holds the sharded parameters); nothing otherwise."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        if not isinstance(strategy, FSDP2Strategy) or is_sharded(self.policy):
            return
        shard_policy(self.policy.sharding_plan(), strategy.shard_settings(), strategy.reshard_after_forward)

    def gathered_policy(self) -> AbstractContextManager[None]:
        """Rollouts and evaluation run inside: the sharded policy is gathered once, and resharded after."""
        return gathered(self.policy)

    def configure_optimizers(self):
        parameters = self.policy.trainable_parameters()
        if not parameters:
            raise ValueError("the policy has no trainable parameters: set a LoRA adapter or freeze less")
        hp = self.hparams
        return adamw_with_warmup(parameters, hp.learning_rate, hp.weight_decay, hp.warmup_steps)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Sampling draws from the global generators: save them so a resumed run samples what an uninterrupted one would.
        checkpoint["rng_states"] = rng_states()
        omit_frozen_parameters(self, checkpoint, fit_optimizers(self))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:
            restore_rng_states(checkpoint["rng_states"])
        restore_frozen_parameters(self, checkpoint)
