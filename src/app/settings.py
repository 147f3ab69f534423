"""Every settings block a config sets, in one place: how outputs are sampled, how GRPO updates, how the optimizer steps,
how rollouts and rewards overlap, LoRA, and pass@k evaluation.

Each block is a frozen-by-convention dataclass that checks its values when built, so a bad config fails before any
model loads, with a message naming the field. In a YAML config a block is a plain mapping under the module's (or the
policy's) ``init_args``: ``sampling: {group_size: 8}``, ``grpo: {beta: 0.04}``, ``optimizer: {learning_rate: 1e-5}``.
The group size K (outputs drawn per prompt) is ``group_size`` wherever it appears.

A block holds what every module that takes it reads: ``grpo:`` (:class:`GRPOSettings`) what the GRPO skeleton uses in
every family; each family's own loss options are in its own block (VLM GRPO's ``loss:``, flow-GRPO's ``loss:``,
DiffusionNFT's ``nft:``), so no block carries a field one of its readers ignores.

A field left ``None`` where the families differ takes the family's default, filled in by the module or policy that
knows its family (:func:`with_defaults`): the learning rate, and LoRA's dropout and target modules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

LANGUAGE_MODEL_PROJECTIONS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
"""LoRA's default targets on a vision-language model: the language model's attention and MLP projections."""
FLOW_ATTENTION_PROJECTIONS = r".*attn\d?\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
"""LoRA's default targets on a flow transformer: every attention's projections, SD3/Flux's context stream included."""

Settings = TypeVar("Settings")


def with_defaults(settings: Settings, **defaults: Any) -> Settings:
    """``settings`` with each field named in ``defaults`` that is None set to its default (the others kept)."""
    missing = {name: value for name, value in defaults.items() if getattr(settings, name) is None}
    return dataclasses.replace(settings, **missing) if missing else settings


def as_settings(cls: type[Settings], value: Settings | dict | None) -> Settings | None:
    """``value`` as a ``cls``: a mapping (a block as saved in a checkpoint's hyper-parameters) is built into one."""
    return cls(**value) if isinstance(value, dict) else value


def settings_or_default(cls: type[Settings], value: Settings | dict | None) -> Settings:
    """``value`` as a ``cls`` (:func:`as_settings`), or ``cls()``'s defaults when it is None."""
    built = as_settings(cls, value)
    return cls() if built is None else built


def plain(settings: Any) -> dict[str, Any] | None:
    """A settings block as plain data (what hyper-parameters and ``torch.load(weights_only=True)`` hold)."""
    return dataclasses.asdict(settings) if settings is not None else None


# --------------------------------------------------------------------------------------------------- sampling
@dataclass
class SamplingSettings:
    """How a vision-language policy's completions are drawn.

    Attributes:
        group_size: completions per prompt (K, >= 1), the group GRPO normalises rewards in.
        temperature: softmax temperature of sampling (> 0); the stored log-probs are those of this distribution.
        top_p: nucleus sampling, in ``(0, 1]``: draw from the smallest set of tokens whose probability reaches
            ``top_p`` (1: all).
        max_new_tokens: the completion budget in tokens (>= 1); a completion that reaches it without an end token is
            truncated.
    """

    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use greedy decoding for validation), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class FlowSamplingSettings:
    """How a flow policy's samples are drawn, in both flow families (flow-GRPO's trajectory options are in
    :class:`FlowGRPOSamplingSettings`).

    Attributes:
        group_size: samples per prompt (K).
        num_steps: denoising steps T of a rollout (and of deterministic evaluation samples).
        sampler: ``cps`` (coefficients-preserving) or ``sde`` (Flow-GRPO) for the stochastic steps: flow-GRPO's, and
            DiffusionNFT's with ``nft.solver: stochastic``.
        eta: the sampler's noise level, > 0 (``cps``: at most 1).
        shared_initial_noise: the K samples of a prompt start from the same noise (DanceGRPO), so the rewards within
            a group differ only through the sampler's noise, which the policy gradient can credit; False (Flow-GRPO)
            draws one starting noise per sample, whose effect on the reward the gradient cannot credit.
        guidance_scale: classifier-free guidance weight; > 1 runs the empty prompt alongside (twice the compute):
            ``v = v_uncond + g (v_cond - v_uncond)``. On a guidance-distilled FLUX it comes on top of the policy's
            ``flux_guidance``. An image condition is kept in both branches (as the I2V and Kontext pipelines do).
        eval_sampler: the solver of deterministic evaluation samples (:meth:`~app.sampling.FlowSampler.generate`):
            ``euler`` (the rollout's ODE step) or ``unipc`` (diffusers' ``UniPCMultistepScheduler`` in flow mode,
            order 2, on the same sigmas), the two samplers VBVR-Pro evaluates with.
    """

    group_size: int = 8
    num_steps: int = 10
    sampler: Literal["sde", "cps"] = "cps"
    eta: float = 0.7
    shared_initial_noise: bool = False
    guidance_scale: float = 1.0
    eval_sampler: Literal["euler", "unipc"] = "euler"

    def __post_init__(self):
        if self.group_size < 1 or self.num_steps < 1:
            raise ValueError(f"need group_size >= 1 and num_steps >= 1, got {self.group_size} and {self.num_steps}")
        if self.sampler not in ("sde", "cps"):
            raise ValueError(f"sampler must be 'sde' or 'cps', got {self.sampler!r}")
        if not (self.eta > 0 and (self.sampler == "sde" or self.eta <= 1)):
            raise ValueError(
                f"eta must be > 0 (and <= 1 for cps): eta = 0 makes every step deterministic, got {self.eta}"
            )
        if self.eval_sampler not in ("euler", "unipc"):
            raise ValueError(f"eval_sampler must be 'euler' or 'unipc', got {self.eval_sampler!r}")
        if self.guidance_scale < 1.0:
            raise ValueError(f"guidance_scale must be >= 1 (1 disables guidance), got {self.guidance_scale}")


@dataclass
class FlowGRPOSamplingSettings(FlowSamplingSettings):
    """How flow-GRPO's denoising trajectories are drawn: :class:`FlowSamplingSettings` and which steps are stochastic
    and trained (see :mod:`app.sampling.flow_rollout`), the ``sampling:`` block of
    :class:`~app.modules.FlowGRPOModule`.

    Attributes:
        group_size: trajectories per prompt (K).
        num_steps: denoising steps T of a rollout (and of deterministic evaluation samples); at least 2 (the last
            step is never trained).
        sampler: ``cps`` (coefficients-preserving) or ``sde`` (Flow-GRPO) for the stochastic steps.
        eta: the sampler's noise level, > 0 (``cps``: at most 1).
        shared_initial_noise: the K trajectories of a prompt start from the same noise (DanceGRPO); False
            (Flow-GRPO): one starting noise per trajectory (see :class:`FlowSamplingSettings`).
        guidance_scale: classifier-free guidance weight, >= 1 (1: none; see :class:`FlowSamplingSettings`).
        eval_sampler: the solver of deterministic evaluation samples, ``euler`` or ``unipc``.
        timestep_fraction: fraction of the stochastic steps trained per rollout (a random subset); 1.0 trains all.
        sde_window: ``(start, end)``: only steps ``start <= i < end`` are stochastic (and trained), the others are
            ODE steps; None: every step but the last.
        window_stride: MixGRPO's moving window: after every ``window_every_n_steps`` optimizer steps the window moves
            this many denoising steps later (its size kept; it stops at the last trainable steps). 0: a fixed window.
            Needs ``sde_window`` (the first position).
        window_every_n_steps: optimizer steps between two moves of the window.
        ode_tail: the solver of the deterministic steps after the window: ``euler`` (first order, as before it) or
            ``unipc`` (diffusers' ``UniPCMultistepScheduler`` in flow mode, order 2, no gradients: MixGRPO-Flash's
            higher-order ODE part).
        ode_tail_steps: with ``ode_tail: unipc``, the solver steps from the window's end to the sample: None takes
            every remaining step of the schedule; a number takes that many, on sigmas spaced evenly in index along the
            remaining schedule (its ends kept), so the tail costs that many velocity evaluations (MixGRPO-Flash's
            compressed ODE part; a tail already that short is taken whole).
        step_weighting: how a rollout's loss weighs its trained steps: ``uniform`` (Flow-GRPO: each 1 / S) or
            ``noise_std`` (each in proportion to its transition's noise std, normalised to sum to 1: the noisy early
            steps, where an exploration changes the sample most, weigh more; after TempFlow-GRPO's noise-aware
            weighting, which scales the policy loss by the step's noise level).
    """

    timestep_fraction: float = 1.0
    sde_window: tuple[int, int] | None = None
    window_stride: int = 0
    window_every_n_steps: int = 1
    ode_tail: Literal["euler", "unipc"] = "euler"
    ode_tail_steps: int | None = None
    step_weighting: Literal["uniform", "noise_std"] = "uniform"

    def __post_init__(self):
        super().__post_init__()
        if self.num_steps < 2:
            raise ValueError(f"flow-GRPO needs num_steps >= 2 (the last step is never trained), got {self.num_steps}")
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"timestep_fraction must be in (0, 1], got {self.timestep_fraction}")
        if self.sde_window is not None:
            window = tuple(int(i) for i in self.sde_window)
            if len(window) != 2 or not 0 <= window[0] < min(window[1], self.num_steps - 1):
                raise ValueError(
                    f"sde_window must be (start, end) with 0 <= start < end and start < num_steps - 1 = "
                    f"{self.num_steps - 1} (the last step is never trained), got {self.sde_window}"
                )
            self.sde_window = window
        if self.window_stride < 0 or self.window_every_n_steps < 1:
            raise ValueError(
                f"need window_stride >= 0 and window_every_n_steps >= 1, got {self.window_stride} and "
                f"{self.window_every_n_steps}"
            )
        if self.window_stride and self.sde_window is None:
            raise ValueError("window_stride moves the sde_window: set sde_window, the window's first position")
        if self.step_weighting not in ("uniform", "noise_std"):
            raise ValueError(f"step_weighting must be 'uniform' or 'noise_std', got {self.step_weighting!r}")
        if self.ode_tail not in ("euler", "unipc"):
            raise ValueError(f"ode_tail must be 'euler' or 'unipc', got {self.ode_tail!r}")
        if self.ode_tail_steps is not None and (self.ode_tail != "unipc" or self.ode_tail_steps < 1):
            raise ValueError(
                f"ode_tail_steps compresses the UniPC tail: it needs ode_tail: unipc and at least 1 step, got "
                f"ode_tail {self.ode_tail!r} and ode_tail_steps {self.ode_tail_steps}"
            )

    def window_at(self, step: int) -> tuple[int, int] | None:
        """The SDE window of the rollout drawn after ``step`` optimizer steps: ``sde_window`` moved by
        ``window_stride`` every ``window_every_n_steps`` steps, up to the last trainable steps (the last denoising
        step is never stochastic)."""
        if self.sde_window is None or not self.window_stride:
            return self.sde_window
        start, end = self.sde_window
        last_start = self.num_steps - 1 - (end - start)
        moved = min(start + self.window_stride * (step // self.window_every_n_steps), max(last_start, start))
        return moved, moved + (end - start)


# -------------------------------------------------------------------------------------------------- the update
@dataclass
class GRPOSettings:
    """How the GRPO skeleton turns a scored rollout into updates (docs/algorithms.md#grpo): what VLM GRPO, flow-GRPO
    and DiffusionNFT all use. Each family's own loss options are in its own block: ``loss:``
    (:class:`VLMLossSettings`, :class:`FlowGRPOLossSettings`) or ``nft:`` (:class:`NFTSettings`).

    Attributes:
        beta: weight of the KL to the reference policy (k3 on log-probs in GRPO, DiffusionNFT's velocity distance);
            0 skips the reference passes (and, with full fine-tuning, the reference copy).
        num_iterations: optimizer updates per rollout (mu in the GRPO paper). With 1 (and no delayed pipeline) the
            ratio is exactly 1 and the clip range has no effect.
        advantage_scale: ``group`` (std of the group), ``batch`` (std of this rank's batch), ``global`` (std of every
            rank's rewards of the step: one all-reduce; flow_grpo's ``global_std``), ``per_prompt`` (mean and std of
            the prompt's last ``prompt_history`` rewards over steps, kept per rank and saved in checkpoints; flow_grpo's
            ``per_prompt_stat_tracking``) or ``none`` (Dr. GRPO). Every scale but ``per_prompt`` centres on the group.
        prompt_history: rewards kept per prompt for ``per_prompt`` (a prompt is its task and question).
        group_ranks: consecutive ranks that share each group (DanceGRPO's groups across GPUs): they draw the same
            prompts, each rank K / group_ranks of every group's outputs (noise drawn as one process holding the whole
            group draws it), and their rewards are all-gathered, so advantages and dropped groups are those of the whole
            group of K. 1: every group on one rank. Must divide K and the number of ranks; > 1 needs a sampler that
            draws a rank's part of a group (the flow families') and rewards of scope ``completion``.
        drop_zero_std_groups: leave groups whose rewards are all equal out of the loss (they carry no signal).
        micro_batch_size: rows per forward/backward; gradients accumulate over the micro-batches of a rollout and
            reproduce the full-batch gradient. None: all N = B * K rows at once.
        gradient_clip_val: clip the global gradient norm to this value before each step (0 disables).
    """

    beta: float = 0.0
    num_iterations: int = 1
    advantage_scale: Literal["group", "batch", "global", "per_prompt", "none"] = "group"
    prompt_history: int = 64
    group_ranks: int = 1
    drop_zero_std_groups: bool = False
    micro_batch_size: int | None = None
    gradient_clip_val: float = 1.0

    def __post_init__(self):
        if not self.beta >= 0:  # NaN fails too
            raise ValueError(f"grpo.beta must be >= 0, got {self.beta}")
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {self.num_iterations}")
        scales = ("group", "batch", "global", "per_prompt", "none")
        if self.advantage_scale not in scales:
            raise ValueError(f"grpo.advantage_scale must be one of {scales}, got {self.advantage_scale!r}")
        if self.prompt_history < 1:
            raise ValueError(f"grpo.prompt_history must be >= 1, got {self.prompt_history}")
        if self.group_ranks < 1:
            raise ValueError(f"grpo.group_ranks must be >= 1 (1: every group on one rank), got {self.group_ranks}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {self.micro_batch_size}")
        if self.gradient_clip_val < 0:
            raise ValueError(f"grpo.gradient_clip_val must be >= 0 (0 disables clipping), got {self.gradient_clip_val}")


def _check_clip_range(eps_low: float, eps_high: float) -> None:
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        if not value >= 0:  # NaN fails too
            raise ValueError(f"loss.{name} must be >= 0, got {value}")


VLM_AGGREGATIONS = ("token_mean", "global_token_mean", "sequence_mean", "constant")
FUSED_CISPO_AGGREGATIONS = ("token_mean", "global_token_mean", "constant")
"""The aggregations of ``objective: cispo`` on the fused loss (Liger's ``cispo`` divides by the token count)."""


@dataclass
class VLMLossSettings:
    """VLM GRPO's loss, every option in one place: the ``loss:`` block of :class:`~app.modules.VLMGRPOModule`
    (docs/algorithms.md#grpo-loss).

    Attributes:
        eps_low: lower clip range of the token ratio (1 - eps_low), >= 0; PPO's and the GRPO paper's 0.2.
        eps_high: upper clip range of the ratio (1 + eps_high), >= 0; > eps_low is DAPO's clip-higher.
        aggregation: ``token_mean`` (divides by this rank's tokens of the step: TRL's ``bnpo``),
            ``global_token_mean`` (by the step's tokens on every rank, all-reduced once per step: DAPO's token-level
            mean; the same as ``token_mean`` on one process), ``sequence_mean`` or ``constant`` (Dr. GRPO, divides by
            B*K*max_new_tokens).
        mask_truncated: leave completions that hit max_new_tokens without an end token out of the loss.
        importance_sampling_level: ``token`` (GRPO: one ratio and clip per token) or ``sequence`` (GSPO: one ratio
            per completion, the geometric mean of its token ratios, clipped per completion; each completion's loss is
            put on every one of its tokens, then ``aggregation`` applies as usual, so GSPO's own objective is
            ``sequence_mean``). ``eps_low`` / ``eps_high`` then bound the sequence ratio, which moves far less than a
            token's: the GSPO paper clips at 3e-4 below and 4e-4 above.
        objective: ``ppo_clip`` (the clipped surrogate) or ``cispo`` (MiniMax-M1: every token is trained with its
            importance weight clipped to ``[1 - eps_low, 1 + eps_high]`` and detached, none is clipped away). MiniMax-M1
            bounds the weight only above: set ``eps_low`` >= 1 for that (the fused loss requires it). ``cispo`` is
            token-level only (``importance_sampling_level: sequence`` is refused).
        off_policy_max_log_ratio: leave out of the loss each completion whose mean log-ratio to the sampling policy
            (``log s_i``, the log of GSPO's sequence ratio) exceeds this in absolute value, > 0; None: no such mask.
        off_policy_max_kl: leave out of the loss each completion whose mean k3 estimate of KL(sampling policy ||
            policy) over its tokens exceeds this, > 0; None: no such mask. Both masks act only when the rollout is
            stale (``grpo.num_iterations > 1`` or a delayed pipeline); a masked completion adds nothing to the loss but
            stays in its normaliser, and the masked fraction is logged as ``train/off_policy_masked``.
        top_entropy_quantile: train the policy term only on the tokens whose entropy is in the top fraction of a
            micro-batch's loss tokens, in (0, 1] (Wang et al. 2025, "high-entropy minority tokens": 0.2; TRL's option
            of the same name); the KL still covers every token and the normaliser is unchanged. 1: every token.
        fused_linear: compute the loss with liger-kernel's fused linear GRPO loss from the last hidden states and
            the output head instead of per-token log-probs (:mod:`app.algorithms.fused_linear`; needs liger-kernel).
            The same loss and gradients; ``train/ratio_mean`` (when old log-probs are stored) and, for
            ``sequence_mean`` with ``grpo.beta > 0``, ``train/kl`` and ``train/loss/policy`` are not logged. It
            computes GSPO and CISPO (not with ``sequence_mean``, and with ``eps_low >= 1``) but neither off-policy
            masking nor high-entropy token selection (it never sees the log-probs or logits).
        fused_compiled: let Liger ``torch.compile`` the fused loss's math; None: on CUDA only.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: Literal["token_mean", "global_token_mean", "sequence_mean", "constant"] = "token_mean"
    mask_truncated: bool = False
    importance_sampling_level: Literal["token", "sequence"] = "token"
    objective: Literal["ppo_clip", "cispo"] = "ppo_clip"
    off_policy_max_log_ratio: float | None = None
    off_policy_max_kl: float | None = None
    top_entropy_quantile: float = 1.0
    fused_linear: bool = False
    fused_compiled: bool | None = None

    def __post_init__(self):
        _check_clip_range(self.eps_low, self.eps_high)
        if self.aggregation not in VLM_AGGREGATIONS:
            raise ValueError(f"loss.aggregation must be one of {VLM_AGGREGATIONS}, got {self.aggregation!r}")
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(
                f"loss.importance_sampling_level must be 'token' or 'sequence', got {self.importance_sampling_level!r}"
            )
        if self.objective not in ("ppo_clip", "cispo"):
            raise ValueError(f"loss.objective must be 'ppo_clip' or 'cispo', got {self.objective!r}")
        if self.objective == "cispo" and self.importance_sampling_level == "sequence":
            raise ValueError(
                "loss.objective 'cispo' is token-level (each token's own clipped weight); "
                "loss.importance_sampling_level 'sequence' is defined for 'ppo_clip' only (GSPO): set one of them back"
            )
        for name in ("off_policy_max_log_ratio", "off_policy_max_kl"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"loss.{name} must be > 0 or null, got {value}")
        if not 0 < self.top_entropy_quantile <= 1:
            raise ValueError(
                f"loss.top_entropy_quantile must be in (0, 1] (1: every token), got {self.top_entropy_quantile}"
            )
        if self.fused_linear:
            self._check_fused()

    def _check_fused(self) -> None:
        """What liger-kernel's fused loss cannot compute, refused naming the option."""
        masks = [name for name in ("off_policy_max_log_ratio", "off_policy_max_kl") if getattr(self, name) is not None]
        if masks:
            raise ValueError(
                f"loss.fused_linear cannot mask off-policy sequences (loss.{' and loss.'.join(masks)} set): the fused "
                "loss never materialises the log-probs the mask is decided on; unset it or set fused_linear: false"
            )
        if self.top_entropy_quantile != 1:
            raise ValueError(
                f"loss.fused_linear cannot select high-entropy tokens (loss.top_entropy_quantile = "
                f"{self.top_entropy_quantile}): Liger's fused loss computes no entropy; set it to 1 or "
                "fused_linear: false"
            )
        if self.objective == "cispo" and self.aggregation not in FUSED_CISPO_AGGREGATIONS:
            raise ValueError(
                f"loss.fused_linear with loss.objective 'cispo' supports loss.aggregation "
                f"{list(FUSED_CISPO_AGGREGATIONS)} (Liger's cispo divides by the token count), "
                f"got {self.aggregation!r}; "
                "set fused_linear: false"
            )
        if self.objective == "cispo" and not self.eps_low >= 1:
            raise ValueError(
                f"loss.fused_linear with loss.objective 'cispo' needs loss.eps_low >= 1 (Liger bounds the importance "
                f"weight only above, as MiniMax-M1 does), got eps_low = {self.eps_low}; set eps_low: 1.0 or "
                "fused_linear: false"
            )


@dataclass
class FlowGRPOLossSettings:
    """Flow-GRPO's loss: the ``loss:`` block of :class:`~app.modules.FlowGRPOModule` (docs/algorithms.md#flow-grpo).

    Attributes:
        eps_low: lower clip range of the ratio of per-step mean log-densities (1 - eps_low), >= 0. 1e-4: Flow-GRPO's
            range for that log-prob (see :mod:`app.modules.flow_grpo`; a mean over thousands of latent elements
            moves very little per update, so a PPO-style 0.2 would never clip).
        eps_high: upper clip range of the ratio (1 + eps_high), >= 0.
        ratio_normalization: GRPO-Guard (docs/algorithms.md#grpo-guard): each step's log-ratio gets its noise bias
            ``mean((mu - mu_old)^2) / (2 std^2)`` added back and is multiplied by the transition's std, so the ratio
            is centred on 1 at every step, and each step's clipped surrogate is divided by its ``dt = s - s'``
            (:func:`~app.algorithms.flow_guard.guarded_loss`). The normalised log-ratio is some ``std`` times smaller
            than the plain one: ``eps_low`` / ``eps_high`` bound it, so set them to match (verl-omni's example: 2e-6).
            Not with ``pipeline.delay > 0`` (the stale rollout's transition means are not stored).
        advantage_clip: clamp every advantage to ``[-advantage_clip, advantage_clip]`` in the loss, > 0 (DanceGRPO's
            ``adv_clip_max``, 5.0); None: no clamp. With ``grpo.advantage_scale: group`` an advantage never exceeds
            ``sqrt(K - 1)`` (the population std of a group of K), so 5.0 acts only for K > 26 or another scale.
    """

    eps_low: float = 1e-4
    eps_high: float = 1e-4
    ratio_normalization: bool = False
    advantage_clip: float | None = None

    def __post_init__(self):
        _check_clip_range(self.eps_low, self.eps_high)
        if self.advantage_clip is not None and not self.advantage_clip > 0:
            raise ValueError(f"loss.advantage_clip must be > 0 or null, got {self.advantage_clip}")


@dataclass
class FlowDPOSettings:
    """Online Diffusion-DPO's update: the ``dpo:`` block of :class:`~app.modules.FlowDPOModule`
    (docs/algorithms.md#diffusion-dpo).

    Attributes:
        beta: the strength of the implicit KL to the reference, > 0 (Diffusion-DPO's training script: 5000, on the
            epsilon-prediction error of SD 1.5; here the error is the velocity's, so it does not carry over exactly).
        solver: how the policy draws its K samples per prompt: ``euler`` or ``unipc`` (deterministic: the samples of a
            group differ by their starting noise, so ``sampling.shared_initial_noise`` must be false) or
            ``stochastic`` (``sampling.sampler`` at ``sampling.eta`` on every step but the last).
        timestep_fraction: the share of the schedule's T noise levels each update trains at (a random subset; one
            fresh noise per pair and level, the same for both samples of a pair), in (0, 1].
    """

    beta: float = 5000.0
    solver: Literal["euler", "unipc", "stochastic"] = "euler"
    timestep_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"dpo.beta must be > 0, got {self.beta}")
        if self.solver not in ("euler", "unipc", "stochastic"):
            raise ValueError(f"dpo.solver must be 'euler', 'unipc' or 'stochastic', got {self.solver!r}")
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"dpo.timestep_fraction must be in (0, 1], got {self.timestep_fraction}")


@dataclass
class OptimizerSettings:
    """AdamW with a linear warm-up, and what happens to a step that is not finite; shared by every module.

    Attributes:
        learning_rate: AdamW learning rate. None: the module's default (1e-6 for VLM GRPO and SFT, 5e-6 for flow
            GRPO, 1e-3 for flow-matching pretraining).
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up, in applied updates (AdamW's step count): an update skipped, undone
            or left empty does not advance the schedule, though ``trainer.global_step`` counts it.
        max_nonfinite_steps: an update whose loss or gradients are not finite, or whose optimizer step left a
            non-finite parameter or optimizer state (see ``restore_nonfinite_steps``), is skipped (the weights and the
            optimizer state stay as they were; counted as ``train/skipped_updates``), so NaN never reaches the weights
            or a checkpoint; after this many consecutive skips (or, in GRPO, this many consecutive rollouts whose
            rewards were all non-finite) the run stops with ``NonFiniteTrainingError``. Every rank takes the same
            decision. A skipped update is a step of ``trainer.global_step`` and of the moving average, not of AdamW's
            step count or the learning-rate schedule, in every module.
        restore_nonfinite_steps: copy the trainable parameters and their optimizer state before each optimizer step
            (:mod:`app.modules.finite_step`: the copy is the size of what the optimizer updates, small under LoRA), so
            a step that leaves a NaN or inf in either on any rank (one that arose inside the step, after the gradient
            check) is undone on every rank, bit for bit, and counted as a skipped update. False keeps no copy: such a
            step stops the run at once with ``NonFiniteTrainingError``, before anything trains on the non-finite
            values or saves them. Either way a checkpoint that would hold a non-finite weight or optimizer state is
            refused (``NonFiniteCheckpointError``).
    """

    learning_rate: float | None = None
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_nonfinite_steps: int = 3
    restore_nonfinite_steps: bool = True

    def __post_init__(self):
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"optimizer.learning_rate must be > 0 or null, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")


# -------------------------------------------------------------------------------------------------- the pipeline
@dataclass(frozen=True)
class PipelineSettings:
    """How rollouts, rewards and updates overlap, and whether flat groups are refilled
    (:mod:`app.modules.rollout_queue`).

    Attributes:
        delay: 0: rollout -> rewards -> update in one step (rewards scored inline). 1: the step generates rollout k+1
            and submits its rewards, then updates with rollout k (policy lag <= 1 rollout; VBVR-Pro's "single-step
            lag"); the first step only primes the pipeline, and the rollout still pending when fit ends is dropped.
        workers: where rewards run when ``delay`` is 1: ``thread`` (cheap text rewards), ``process`` (CPU scorers; the
            reward and its inputs are pickled to the workers), ``inline`` (in the training thread, no overlap). A reward
            with its own workers (``VBVRScorerReward(num_workers > 0)``) uses them whatever this says. An executor set
            on the module (``module.reward_executor = ...``) replaces this one.
        num_workers: threads or processes of the reward executor.
        reward_timeout_s: how long a step waits for a rollout's rewards before failing with a ``RewardError`` naming
            the reward (None: no limit; a dead worker process fails at once either way).
        dynamic_sampling: DAPO's dynamic sampling: groups whose rewards are all equal are dropped, and more prompts
            are rolled out and scored until the step holds B informative groups or ``max_extra_rollouts`` more
            rollouts were made; surplus groups are left out of the loss. The extra rollouts are scored inline (they
            are on the critical path). The extra prompts come from the training data without moving the main loader:
            drawn by index from a map-style data set by a seeded sampler (``seed`` + rank;
            :class:`~app.modules.prompt_drawers.IndexDrawer`), or, for streamed shards (``ShardDataModule``), from a
            second, seeded pass over this rank's training stream that cycles through epochs
            (:class:`~app.modules.prompt_drawers.StreamDrawer`). Either resumes from a checkpoint where it stood. Any
            other data set (an ``IterableDataset`` of your own) is refused with a ``TypeError``.
        max_extra_rollouts: cap on extra rollouts per step (logged as ``train/dynamic/extra_rollouts``).
        seed: seeds the prompt sampler of dynamic sampling (with the rank for map-style data; for shards, the refill
            stream's seed is derived from it alone: see :class:`~app.modules.prompt_drawers.StreamDrawer`).
    """

    delay: int = 0
    workers: Literal["thread", "process", "inline"] = "thread"
    num_workers: int = 1
    reward_timeout_s: float | None = None
    dynamic_sampling: bool = False
    max_extra_rollouts: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.delay not in (0, 1):
            raise ValueError(f"pipeline.delay must be 0 or 1, got {self.delay}")
        if self.workers not in ("thread", "process", "inline"):
            raise ValueError(f"pipeline.workers must be 'thread', 'process' or 'inline', got {self.workers!r}")
        if self.num_workers < 1:
            raise ValueError(f"pipeline.num_workers must be >= 1, got {self.num_workers}")
        if self.reward_timeout_s is not None and not self.reward_timeout_s > 0:
            raise ValueError(f"pipeline.reward_timeout_s must be > 0 or null, got {self.reward_timeout_s}")
        if self.max_extra_rollouts < 0:
            raise ValueError(f"pipeline.max_extra_rollouts must be >= 0, got {self.max_extra_rollouts}")

    @property
    def carries_state(self) -> bool:
        """Whether the pipeline carries state from step to step that a checkpoint must hold: rollouts waiting for
        their update (``delay`` > 0) or dynamic sampling's prompt sampler."""
        return self.delay > 0 or self.dynamic_sampling


# --------------------------------------------------------------------------------------------------------- EMA
@dataclass(frozen=True)
class EMASettings:
    """An exponential moving average of the policy's trainable weights (:class:`~app.modules.ema.PolicyEMA`), used in
    place of the trained weights for validation and export, as Flow-GRPO's ``ema`` option does.

    After optimizer step ``t`` (``trainer.global_step``, which counts every update, a skipped, undone or empty one
    included, with the weights from before it): before ``start_step`` the average follows the weights
    (``ema = w``); from then on, every ``every_n_steps`` steps, ``ema <- decay * ema + (1 - decay) * w``.

    Attributes:
        decay: weight of the old average in each update, in (0, 1); an average over about 1 / (1 - decay) updates.
        start_step: the first optimizer step that averages (the weights before it are taken as they are).
        every_n_steps: steps between two updates of the average, counted from ``start_step``.
    """

    decay: float = 0.9
    start_step: int = 0
    every_n_steps: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"ema.decay must be in (0, 1), got {self.decay}")
        if self.start_step < 0 or self.every_n_steps < 1:
            raise ValueError(
                f"ema needs start_step >= 0 and every_n_steps >= 1, got {self.start_step} and {self.every_n_steps}"
            )


@dataclass(frozen=True)
class NFTSettings:
    """DiffusionNFT's update (:class:`~app.modules.FlowNFTModule`, docs/algorithms.md#diffusionnft).

    Attributes:
        beta: the step of the implicit policies ``v+ = (1 - beta) v_old + beta v_theta`` and
            ``v- = (1 + beta) v_old - beta v_theta``, > 0 (the reference recipes: 1.0, 0.1 for OCR and multi-reward).
        advantage_clip: advantages are clipped to ``[-advantage_clip, advantage_clip]`` and mapped to the optimality
            probability ``r = 0.5 + 0.5 A / advantage_clip`` (the reference code's ``adv_clip_max``, 5).
        solver: how the sampling policy draws its samples: ``euler`` or ``unipc`` (deterministic, the paper's
            default is a second-order ODE solver) or ``stochastic`` (``sampling.sampler`` at ``sampling.eta`` on every
            step but the last). A deterministic solver needs ``sampling.shared_initial_noise: false``, or a group's K
            samples would be one.
        timestep_fraction: the share of the schedule's T noise levels each update trains at (a random subset, one
            fresh noise per sample and level); 1.0 trains all T.
        weighting: ``adaptive`` (the reference code: the clean-sample error over its own detached mean absolute
            value, per sample) or ``velocity`` (the paper's plain flow-matching error ``||v_hat - v||^2``).
        old_decay_rate: the sampling policy ``v_old`` follows the trained weights as a moving average,
            ``old <- d old + (1 - d) theta`` after every training step, with
            ``d = min(old_decay_rate * max(0, step - old_decay_start), old_decay_max)``: this is how fast ``d`` grows
            per step, >= 0 (the reference code's ``decay_type`` 1: rate 0.001, max 0.5, start 0; its type 2: 0.0075,
            0.999, 75). 0: ``d`` stays 0 and ``v_old`` is the weights of the last step, fully on-policy.
        old_decay_max: the cap of ``d``, in ``[0, 1)`` (0.5: ``v_old`` never moves less than halfway to the weights).
        old_decay_start: training steps before ``d`` starts to grow from 0, >= 0 (until then ``v_old`` is the weights
            of the last step).
    """

    beta: float = 1.0
    advantage_clip: float = 5.0
    solver: Literal["euler", "unipc", "stochastic"] = "euler"
    timestep_fraction: float = 1.0
    weighting: Literal["adaptive", "velocity"] = "adaptive"
    old_decay_rate: float = 0.001
    old_decay_max: float = 0.5
    old_decay_start: int = 0

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"nft.beta must be > 0, got {self.beta}")
        if self.advantage_clip <= 0:
            raise ValueError(f"nft.advantage_clip must be > 0, got {self.advantage_clip}")
        if self.solver not in ("euler", "unipc", "stochastic"):
            raise ValueError(f"nft.solver must be 'euler', 'unipc' or 'stochastic', got {self.solver!r}")
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"nft.timestep_fraction must be in (0, 1], got {self.timestep_fraction}")
        if self.weighting not in ("adaptive", "velocity"):
            raise ValueError(f"nft.weighting must be 'adaptive' or 'velocity', got {self.weighting!r}")
        if self.old_decay_rate < 0 or not 0 <= self.old_decay_max < 1 or self.old_decay_start < 0:
            raise ValueError(
                f"nft needs old_decay_rate >= 0, 0 <= old_decay_max < 1 and old_decay_start >= 0, got "
                f"{self.old_decay_rate}, {self.old_decay_max} and {self.old_decay_start}"
            )

    def old_decay(self, step: int) -> float:
        """``d`` of the ``step``-th move of ``v_old`` (0 for the first, after the first training step)."""
        return min(self.old_decay_rate * max(0, step - self.old_decay_start), self.old_decay_max)


# -------------------------------------------------------------------------------------------------------- LoRA
@dataclass
class LoRASettings:
    """PEFT LoRA, on a vision-language model's language model or on a flow transformer's attention.

    Every base weight stays frozen under LoRA; only the adapters train, wherever they are. On a VLM, adapters on layers
    of the vision tower (``visual``) train whatever ``VLMPolicy.freeze_vision`` says (it is about the tower's base
    weights).

    Attributes:
        r: rank of the update.
        alpha: scaling numerator (``lora_alpha``); the update is scaled by alpha / r.
        dropout: dropout on the LoRA input. None: the family's default, 0.05 on a VLM, 0 on a flow transformer (as
            Flow-GRPO's SD3 recipe). It acts in supervised fine-tuning only: the GRPO modules (flow-GRPO and
            DiffusionNFT included) turn every dropout off, so the log-prob passes of the ratio see one network.
        target_modules: a regex that must match a whole module name (PEFT's ``re.fullmatch``), or a list of names,
            each the name of a module or its last dotted parts (``["qkv"]`` selects every ``...attn.qkv``). A regex, or
            a list entry, that matches no module of the model is an error naming it (:mod:`app.models.lora_targets`).
            None: the family's default, :data:`LANGUAGE_MODEL_PROJECTIONS` on a VLM (nothing in the vision tower; for
            its blocks add e.g. ``|.*visual.blocks.*(qkv|proj|fc1|fc2)``), :data:`FLOW_ATTENTION_PROJECTIONS` on a
            flow transformer.
    """

    r: int = 32
    alpha: int = 64
    dropout: float | None = None
    target_modules: str | list[str] | None = None

    def __post_init__(self):
        if self.r < 1 or self.alpha <= 0:
            raise ValueError(f"LoRA needs r >= 1 and alpha > 0, got r={self.r}, alpha={self.alpha}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")


# -------------------------------------------------------------------------------------------------- evaluation
@dataclass
class PassAtK:
    """pass@k in evaluation: ``num_samples`` completions sampled per prompt (besides the greedy one).

    Attributes:
        num_samples: n, completions sampled per prompt.
        k: the k values to report (each <= n); logged as ``<stage>/pass@<k>``.
        temperature: sampling temperature of those completions.
        reward: the evaluation reward whose value decides correctness (``eval_rewards`` name).
        threshold: a completion is correct when that reward is >= this.
    """

    num_samples: int = 8
    k: tuple[int, ...] = (1, 4, 8)
    temperature: float = 1.0
    reward: str = "accuracy"
    threshold: float = 1.0

    def __post_init__(self) -> None:
        self.k = tuple(self.k)
        if self.num_samples < 1 or not self.k or not all(1 <= k <= self.num_samples for k in self.k):
            raise ValueError(f"pass@k needs num_samples >= 1 and every k in [1, num_samples], got {self}")
