"""``VLMGRPOModule``'s loss path called directly on a hand-made rollout (no Trainer): each micro batch's loss weighted
by its share of the aggregation's normaliser sums to the loss of the whole batch, with the module's clip range, beta,
aggregation, generation budget and sampling temperature; the rollout logs; the loss mask ``loss_mask`` builds (through
the skeleton's ``finish_rollout``); and ``loss_mass``, each rollout's weight when several make one update. The
objectives (GSPO, CISPO, off-policy masking, high-entropy tokens) reach every micro-batch's loss, the masked fraction is
logged when masking is on, the entropy always, and the fused loss computes GSPO and refuses what Liger cannot compute.
The module's own arguments (defaults, settings blocks given as hyper-parameter dicts, what the hyper-parameters record)
on a stand-in policy.

The rollout: 2 prompts x K = 2 completions of L = 5 tokens (budget 6, so ``constant`` divides by 6, not L), one row
left out of the loss entirely and one with a single token, stored old log-probs whose ratios reach both clip bounds on
tokens where the clip acts, and reference log-probs 0.3 above the policy's (k3 KL = e^0.3 - 1.3 per token).
"""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from doubles import LinearPolicy, Logs
from tolerances import TINY_VLM_LOGIT_L1, TINY_VLM_VOCAB, entropy_atol

from app.algorithms import grpo_loss
from app.modules import VLMGRPOModule
from app.modules.group_scoring import ScoredGroups
from app.rewards import AccuracyReward
from app.settings import GRPOSettings, PassAtK, SamplingSettings, VLMLossSettings
from app.types import CompletionBatch, Generation, RewardOutput, Rollout, SampledCompletions

K, L, MAX_NEW_TOKENS, TEMPERATURE = 2, 5, 6, 0.7
EPS_LOW, EPS_HIGH, BETA = 0.1, 0.3, 0.1
COMPLETION_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
LOSS_MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
"""8 tokens in 3 rows (row 1 all masked, row 2 a single token) of 4."""
ADVANTAGES = torch.tensor([1.0, -1.0, 0.5, -0.5])
RATIOS = torch.tensor(
    [[1.25, 1.35, 0.7, 1.0, 1.1], [0.5, 2.0, 1.0, 1.0, 1.0], [1.4, 1.0, 1.0, 1.0, 1.0], [0.85, 0.75, 1.0, 1.0, 1.0]]
)
"""Policy / old probability of each token: above 1 + eps_high (clipped, A > 0), between the bounds of eps 0.2 and
the module's, and below 1 - eps_low (clipped, A < 0)."""
SHARES = {  # micro_batch_size 1: kept tokens / 8, rows with a token / 3, rows / 4
    "token_mean": [5 / 8, 0.0, 1 / 8, 2 / 8],
    "sequence_mean": [1 / 3, 0.0, 1 / 3, 1 / 3],
    "constant": [1 / 4] * 4,
}
AGGREGATIONS = sorted(SHARES)


GRPO_FIELDS = {field.name for field in dataclasses.fields(GRPOSettings)}
LOSS_FIELDS = {field.name for field in dataclasses.fields(VLMLossSettings)}


def grpo_module(policy, **options) -> VLMGRPOModule:
    """The module of the hand-made rollout (K, budget, temperature, clip range); ``options`` are :class:`GRPOSettings`
    or :class:`VLMLossSettings` fields or the module's own arguments."""
    grpo = {name: options.pop(name) for name in GRPO_FIELDS & options.keys()}
    loss = {"eps_low": EPS_LOW, "eps_high": EPS_HIGH} | {
        name: options.pop(name) for name in LOSS_FIELDS & options.keys()
    }
    return VLMGRPOModule(
        policy,
        [AccuracyReward()],
        SamplingSettings(group_size=K, max_new_tokens=MAX_NEW_TOKENS, temperature=TEMPERATURE),
        grpo=GRPOSettings(**grpo),
        loss=VLMLossSettings(**loss),
        **options,
    )


def with_logprobs(rollout: Rollout, old: torch.Tensor | None, ref: torch.Tensor | None) -> Rollout:
    """``rollout`` with other stored old and reference log-probs."""
    return dataclasses.replace(
        rollout, sampled=dataclasses.replace(rollout.sampled, old_logprobs=old, ref_logprobs=ref)
    )


@pytest.fixture(scope="module")
def case(tiny_policy, new_samples):
    """``(rollout, logprobs)``: the hand-made rollout and the policy's log-probs ``[N, L]`` of its completions at the
    sampling temperature, computed on the whole batch."""
    samples = new_samples(2)
    prompt_inputs = tiny_policy.encode_prompts(samples, rows_per_prompt=K)
    tokens = torch.randint(0, 1000, (2 * K, L), generator=torch.Generator().manual_seed(0))
    pad = tiny_policy.processor.tokenizer.pad_token_id
    completion_ids = torch.where(COMPLETION_MASK.bool(), tokens, pad)
    with torch.no_grad():
        logprobs = tiny_policy.sequence_logprobs(prompt_inputs, completion_ids, COMPLETION_MASK, TEMPERATURE)
    completions = CompletionBatch(completion_ids, COMPLETION_MASK, [""] * 4, torch.zeros(4, dtype=torch.bool), K)
    sampled = SampledCompletions(
        prompt_inputs, completions, old_logprobs=logprobs - RATIOS.log(), ref_logprobs=logprobs + 0.3
    )
    rollout = Rollout(
        samples, sampled, RewardOutput(ADVANTAGES, {}), advantages=ADVANTAGES, loss_mask=LOSS_MASK, rows_per_prompt=K
    )
    return rollout, logprobs


def expected_loss(logprobs, rollout, aggregation, beta=BETA, **options):
    """The pure loss of the stored rollout at ``logprobs`` (``options``: the objective's own keywords)."""
    sampled = rollout.sampled
    return grpo_loss(
        logprobs,
        sampled.old_logprobs,
        rollout.advantages,
        rollout.loss_mask,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        beta=beta,
        ref_logprobs=sampled.ref_logprobs,
        aggregation=aggregation,
        max_length=MAX_NEW_TOKENS,
        **options,
    )


def weighted_sum(parts, field="loss"):
    return sum(share * getattr(out, field) for out, share in parts)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("micro_batch_size", [1, None])
def test_share_weighted_micro_batch_losses_are_the_full_batch_loss(tiny_policy, case, aggregation, micro_batch_size):
    rollout, logprobs = case
    module = grpo_module(tiny_policy, beta=BETA, aggregation=aggregation, micro_batch_size=micro_batch_size)
    parts = list(module.weighted_losses(rollout))
    shares = [float(share) for _, share in parts]
    assert shares == pytest.approx(SHARES[aggregation] if micro_batch_size == 1 else [1.0])

    expected = expected_loss(logprobs, rollout, aggregation)
    assert expected.clip_fraction > 0 and expected.kl > 0  # the clip acts, the reference counts
    for field in ("loss", "policy_loss", "kl"):
        torch.testing.assert_close(weighted_sum(parts, field), getattr(expected, field), msg=field)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_one_kept_token_carries_the_whole_weight(tiny_policy, case, aggregation):
    """Only row 2's single token is kept: its micro batch is the whole token / row normaliser."""
    rollout, logprobs = case
    one_token = torch.zeros_like(LOSS_MASK)
    one_token[2, 0] = 1
    rollout = dataclasses.replace(rollout, loss_mask=one_token)
    module = grpo_module(tiny_policy, beta=BETA, aggregation=aggregation, micro_batch_size=1)
    parts = list(module.weighted_losses(rollout))
    expected_shares = [1 / 4] * 4 if aggregation == "constant" else [0.0, 0.0, 1.0, 0.0]
    assert [float(share) for _, share in parts] == pytest.approx(expected_shares)
    torch.testing.assert_close(weighted_sum(parts), expected_loss(logprobs, rollout, aggregation).loss)


def test_without_stored_log_probs_the_ratio_is_one_and_the_loss_minus_the_mean_advantage(tiny_policy, case):
    """No old log-probs: the current ones detached (ratio exactly 1, nothing clipped); no reference: KL 0. The token
    mean of -A over the kept tokens is -(5 * 1 + 0.5 - 2 * 0.5) / 8."""
    rollout, _ = case
    rollout = with_logprobs(rollout, old=None, ref=None)
    parts = list(grpo_module(tiny_policy, micro_batch_size=1).weighted_losses(rollout))
    assert [float(out.ratio_mean) for out, _ in parts] == [1.0, 0.0, 1.0, 1.0]  # 0: no token in row 1
    assert [float(out.clip_fraction) for out, _ in parts] == [0.0] * 4
    assert [float(out.kl) for out, _ in parts] == [0.0] * 4
    assert float(weighted_sum(parts).detach()) == pytest.approx(-4.5 / 8)


def test_old_log_probs_stored_at_the_sampling_temperature_give_ratio_one(tiny_policy, case):
    """The loss recomputes the log-probs at the sampling temperature, so the ones stored at generation time match."""
    rollout, logprobs = case
    rollout = with_logprobs(rollout, old=logprobs, ref=None)
    module = grpo_module(tiny_policy, num_iterations=2, micro_batch_size=2)
    for out, _ in module.weighted_losses(rollout):
        torch.testing.assert_close(out.ratio_mean, torch.tensor(1.0))
        assert out.clip_fraction == 0


def test_the_fused_loss_gives_each_micro_batch_loss(tiny_policy, case):
    """With ``loss.fused_linear`` the losses come from liger-kernel's fused loss: the same total, but no ratio."""
    pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed (extra 'gpu')")
    rollout, logprobs = case
    module = grpo_module(
        tiny_policy, beta=BETA, micro_batch_size=2, num_iterations=2, fused_linear=True, fused_compiled=False
    )
    parts = list(module.weighted_losses(rollout))
    assert len(parts) == 2
    assert all(out.ratio_mean is None for out, _ in parts)  # a statistic Liger does not return
    expected = expected_loss(logprobs, rollout, "token_mean").loss
    torch.testing.assert_close(weighted_sum(parts), expected, atol=1e-6, rtol=1e-4)


# --------------------------------------------------------------------------------------------- the objectives
OBJECTIVES = {
    "gspo": {"importance_sampling_level": "sequence"},
    "cispo": {"objective": "cispo"},
    "masked": {"off_policy_max_log_ratio": 0.2, "off_policy_max_kl": 0.5},
}
"""The ``grpo:`` options beside PPO-clip. On this rollout the sequence ratios are e^0.052 (row 0, inside the module's
clip range 0.9 .. 1.3), 1.4 (row 2, A > 0: clipped) and e^-0.225 (row 3, A < 0: clipped); rows 2 and 3 have
|log s| > 0.2, so the mask leaves them out (2 of the 3 rows with a token)."""


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_each_objective_reaches_the_loss_of_every_micro_batch(tiny_policy, case, name, aggregation):
    """The module passes its ``grpo`` options to ``grpo_loss``: the share-weighted micro-batch losses are the pure
    function's on the whole batch's log-probs, and differ from PPO-clip's."""
    rollout, logprobs = case
    options = OBJECTIVES[name]
    module = grpo_module(tiny_policy, beta=BETA, aggregation=aggregation, micro_batch_size=2, **options)
    parts = list(module.weighted_losses(rollout))
    assert len(parts) == 2
    expected = expected_loss(logprobs, rollout, aggregation, **options)
    for field in ("loss", "policy_loss", "kl"):
        torch.testing.assert_close(weighted_sum(parts, field), getattr(expected, field), msg=field)
    assert not torch.isclose(expected.loss, expected_loss(logprobs, rollout, aggregation).loss)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_high_entropy_tokens_are_chosen_in_each_micro_batch_and_the_entropy_is_logged(tiny_policy, case, aggregation):
    """``top_entropy_quantile`` reaches every micro-batch's loss with that micro-batch's entropies, whose threshold is
    the micro-batch's own (as in TRL, where it is each forward pass's); the update logs the entropy over the loss's
    tokens, overall and per task."""
    rollout, logprobs = case
    sampled = rollout.sampled
    with torch.no_grad():
        _, entropy = tiny_policy.sequence_logprobs_and_entropy(
            sampled.prompt_inputs, sampled.completions.completion_ids, COMPLETION_MASK, TEMPERATURE
        )
    module = grpo_module(tiny_policy, beta=BETA, aggregation=aggregation, micro_batch_size=2, top_entropy_quantile=0.5)
    parts = list(module.weighted_losses(rollout))
    shares = [sum(SHARES[aggregation][:2]), sum(SHARES[aggregation][2:])]
    assert [float(share) for _, share in parts] == pytest.approx(shares)
    for (out, _), rows in zip(parts, (slice(0, 2), slice(2, 4)), strict=True):
        expected = grpo_loss(
            logprobs[rows],
            sampled.old_logprobs[rows],
            rollout.advantages[rows],
            rollout.loss_mask[rows],
            eps_low=EPS_LOW,
            eps_high=EPS_HIGH,
            beta=BETA,
            ref_logprobs=sampled.ref_logprobs[rows],
            aggregation=aggregation,
            max_length=MAX_NEW_TOKENS,
            entropy=entropy[rows],
            top_entropy_quantile=0.5,
        )
        torch.testing.assert_close(out.loss, expected.loss)
    assert not torch.isclose(weighted_sum(parts), expected_loss(logprobs, rollout, aggregation).loss)
    # logged: the entropy's mean over the 8 tokens of the loss, for all and for the one task
    tally = parts[0][0].entropy + parts[1][0].entropy
    logs = Logs(module)
    stats = parts[0][0].statistics() | {"entropy": tally}
    module._log_step(rollout, stats, batch_size=4)
    ((values, _),) = logs.dicts
    want = float(entropy[LOSS_MASK.bool()].mean())
    task = rollout.samples[0].task
    assert {rollout.samples[1].task} == {task}
    # micro-batches of 2 rows against the whole batch: the head's 64-term sums may round in another order
    logit_max = TINY_VLM_LOGIT_L1 / TEMPERATURE
    atol = entropy_atol(TINY_VLM_VOCAB, logit_max, sums=[64], logit_l1=logit_max)
    assert float(values["train/entropy"]) == pytest.approx(want, abs=atol, rel=0)
    assert float(values[f"train/entropy/{task}"]) == float(values["train/entropy"])


def test_the_masked_fraction_is_logged_only_with_off_policy_masking(tiny_policy, case):
    rollout, _ = case
    for options, logged in (({}, None), (OBJECTIVES["masked"], 2 / 3)):
        module = grpo_module(tiny_policy, beta=BETA, **options)
        ((out, share),) = module.weighted_losses(rollout)
        assert float(share) == 1.0
        if logged is None:
            assert out.off_policy_masked is None
        else:
            assert float(out.off_policy_masked) == pytest.approx(logged)
        logs = Logs(module)
        stats = out.statistics()
        module._log_step(rollout, stats, batch_size=4)
        ((values, _),) = logs.dicts
        assert values.get("train/off_policy_masked") == (pytest.approx(logged) if logged else None)


def test_the_fused_loss_computes_gspo_and_refuses_what_liger_does_not(tiny_policy, case):
    pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed (extra 'gpu')")
    rollout, logprobs = case
    fused = dict(fused_linear=True, fused_compiled=False)
    module = grpo_module(tiny_policy, beta=BETA, micro_batch_size=2, importance_sampling_level="sequence", **fused)
    expected = grpo_loss(
        logprobs,
        rollout.sampled.old_logprobs,
        rollout.advantages,
        rollout.loss_mask,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        beta=BETA,
        ref_logprobs=rollout.sampled.ref_logprobs,
        importance_sampling_level="sequence",
    )
    torch.testing.assert_close(weighted_sum(module.weighted_losses(rollout)), expected.loss, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="needs loss.eps_low >= 1"):
        grpo_module(tiny_policy, objective="cispo", **fused)  # the module's eps_low is 0.1
    with pytest.raises(ValueError, match=r"cannot mask off-policy sequences \(loss.off_policy_max_kl set\)"):
        grpo_module(tiny_policy, off_policy_max_kl=0.5, **fused)
    with pytest.raises(ValueError, match=r"cannot select high-entropy tokens \(loss.top_entropy_quantile = 0.2\)"):
        grpo_module(tiny_policy, top_entropy_quantile=0.2, **fused)


# ------------------------------------------------------------------------------------ rollout logs and loss mask
TRUNCATING = CompletionBatch(
    completion_ids=torch.zeros(4, 4, dtype=torch.long),
    completion_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]),
    texts=[""] * 4,
    truncated=torch.tensor([True, False, False, False]),  # row 1 ends with its end token at the budget
    rows_per_prompt=K,
)
"""Completions of a budget of 4 tokens: lengths 4, 4, 1, 2 (mean 2.75), one of four truncated."""


def test_rollout_logs_are_the_mean_completion_length_and_the_truncated_fraction(tiny_policy):
    logs = grpo_module(tiny_policy).rollout_logs(SimpleNamespace(sampled=SimpleNamespace(completions=TRUNCATING)))
    assert {key: float(value) for key, value in logs.items()} == {
        "train/completion_length": 2.75,
        "train/frac_truncated": 0.25,
    }


@pytest.mark.parametrize(
    "mask_truncated, kept_rows",
    [(False, [True, True, False, False]), (True, [False, True, False, False])],
    ids=["truncated_kept", "truncated_masked"],
)
def test_loss_mask_leaves_out_dropped_groups_and_truncated_rows(tiny_policy, mask_truncated, kept_rows):
    """Group 1 (rows 2, 3) is dropped; row 0 is truncated, left out only with ``mask_truncated``."""
    module = grpo_module(tiny_policy, mask_truncated=mask_truncated)
    completions = dataclasses.replace(TRUNCATING, completion_mask=TRUNCATING.completion_mask.clone())
    sampled = SampledCompletions(prompt_inputs=None, completions=completions, old_logprobs=None, ref_logprobs=None)
    rewards = RewardOutput(torch.tensor([1.0, 0.0, 1.0, 1.0]), {})
    scored = ScoredGroups(rewards, advantages=torch.tensor([1.0, -1.0, 0.0, 0.0]), keep=torch.tensor([1, 1, 0, 0]) > 0)
    batch = module.finish_rollout(Generation([], sampled), scored)

    expected = TRUNCATING.completion_mask * torch.tensor(kept_rows)[:, None]
    assert torch.equal(batch.loss_mask, expected)
    assert torch.equal(
        batch.sampled.completions.completion_mask, TRUNCATING.completion_mask
    )  # the completions keep theirs
    assert batch.advantages is scored.advantages and batch.rewards is rewards and batch.rows_per_prompt == K


def test_log_probs_of_a_rollout_are_computed_in_micro_batches_at_the_given_temperature(tiny_policy, case):
    """What generation stores (old and reference log-probs) goes through the policy in micro-batches of the module's
    size (its sampler's) of rows of similar length, each re-padded to its longest completion and at the sampling
    temperature, and comes back in row order at the rollout's length. The completions hold 5, 3, 1 and 2 tokens:
    rows 0, 1 and 3 make the first micro-batch (5 tokens wide), row 2 the second (1 token wide)."""
    rollout, _ = case
    module = grpo_module(tiny_policy, micro_batch_size=3)
    calls = []

    def token_ids(prompt_inputs, completion_ids, completion_mask, temperature):
        calls.append((len(prompt_inputs), tuple(completion_ids.shape), tuple(completion_mask.shape), temperature))
        return completion_ids.float()

    completions = rollout.sampled.completions
    out = module.sampler._in_micro_batches(token_ids, rollout.sampled.prompt_inputs, completions)
    assert calls == [(3, (3, 5), (3, 5), TEMPERATURE), (1, (1, 1), (1, 1), TEMPERATURE)]
    expected = completions.completion_ids.float().clone()
    expected[2, 1:] = 0  # row 2 was scored 1 token wide: the rest is padding, outside every mask
    assert out.shape == (4, L) and torch.equal(out, expected)


# ----------------------------------------------------------------------------------- several rollouts in one update
MASKS = (
    torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]]),
    torch.tensor([[1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]]),
)
"""Two rollouts' loss masks of MAX_NEW_TOKENS = 6 tokens: an empty row and single-token rows; 8 : 6 tokens, 3 : 2 rows
with a token, 4 : 2 rows."""
MASSES = {"token_mean": (8.0, 6.0), "sequence_mean": (3.0, 2.0), "constant": (4.0, 2.0)}


@pytest.mark.parametrize("aggregation", sorted(MASSES))
def test_mass_weighted_losses_of_rollouts_are_the_loss_of_all_their_rows(tiny_policy, aggregation, random_seed):
    """When several rollouts make one update (dynamic sampling), each weighs its aggregation's normaliser (kept tokens,
    rows with a token, or all rows), so the mass-weighted sum of their losses is the loss of all their rows together."""
    module = VLMGRPOModule(
        tiny_policy,
        [AccuracyReward()],
        SamplingSettings(max_new_tokens=MAX_NEW_TOKENS),
        loss={"aggregation": aggregation},
    )
    masses = [module.loss_mass(SimpleNamespace(loss_mask=mask)) for mask in MASKS]  # it reads only the loss mask
    assert [mass.item() for mass in masses] == list(MASSES[aggregation])

    g = torch.Generator().manual_seed(random_seed)
    mask = torch.cat(MASKS)  # [6, MAX_NEW_TOKENS]
    logprobs = -torch.rand(mask.shape, generator=g)
    old = logprobs + 0.3 * torch.randn(mask.shape, generator=g)
    advantages = torch.randn(mask.shape[0], generator=g)

    def loss(rows):
        return grpo_loss(
            logprobs[rows], old[rows], advantages[rows], mask[rows], aggregation=aggregation, max_length=MAX_NEW_TOKENS
        )

    weighted = sum(
        mass / sum(masses) * loss(rows).loss for mass, rows in zip(masses, (slice(0, 4), slice(4, 6)), strict=True)
    )
    torch.testing.assert_close(weighted, loss(slice(None)).loss)


# ------------------------------------------------------------------------------------------------- arguments
# The constructor reads no weights: the two-weight stand-in policy of the skeleton's tests is enough.
def test_the_module_s_own_arguments_default_as_documented():
    module = VLMGRPOModule(LinearPolicy(), [AccuracyReward()])
    assert (module.records_per_step, module.eval_max_new_tokens) == (16, 256)
    assert (module.loss.aggregation, module.loss.mask_truncated, module.pass_at_k, module.fused_loss) == (
        "token_mean",
        False,
        None,
        None,
    )
    assert (module.loss.eps_low, module.loss.eps_high) == (0.2, 0.2)  # PPO's and the GRPO paper's clip range
    assert module.sampling == SamplingSettings()


def test_the_module_s_own_arguments_are_recorded_as_given():
    """Every constructor argument is in the hyper-parameters (a fit resumed through the CLI is built from them)."""
    pass_at_k = PassAtK(num_samples=2, k=(1, 2))
    module = VLMGRPOModule(
        LinearPolicy(),
        [AccuracyReward()],
        loss=VLMLossSettings(aggregation="sequence_mean", mask_truncated=True, fused_compiled=False),
        records_per_step=3,
        eval_max_new_tokens=7,
        pass_at_k=pass_at_k,
    )
    loss = module.hparams["loss"]
    assert (loss["aggregation"], loss["mask_truncated"], module.hparams["records_per_step"]) == (
        "sequence_mean",
        True,
        3,
    )
    assert module.hparams["eval_max_new_tokens"] == 7 and module.hparams["pass_at_k"] == dataclasses.asdict(pass_at_k)
    assert loss["fused_linear"] is False and loss["fused_compiled"] is False
    assert (module.loss.aggregation, module.loss.mask_truncated, module.eval_max_new_tokens) == (
        "sequence_mean",
        True,
        7,
    )


def test_settings_blocks_given_as_hyper_parameter_dicts_are_built_into_settings():
    """A resumed run hands the module its blocks as saved in the hyper-parameters: plain dicts."""
    module = VLMGRPOModule(
        LinearPolicy(),
        [AccuracyReward()],
        sampling={"group_size": 2, "max_new_tokens": 5},
        grpo={"beta": 0.0, "micro_batch_size": 3},
        loss={"aggregation": "constant", "eps_high": 0.28},
        optimizer={"learning_rate": 0.5},
        pass_at_k={"num_samples": 2, "k": [1, 2]},
    )
    assert module.loss == VLMLossSettings(aggregation="constant", eps_high=0.28)
    assert module.sampling == SamplingSettings(group_size=2, max_new_tokens=5)
    assert module.sampler.settings is module.sampling and module.sampler.micro_batch_size == 3
    assert module.pass_at_k == PassAtK(num_samples=2, k=(1, 2))
    assert module.optimizer_settings.learning_rate == 0.5


def test_an_unknown_loss_aggregation_is_refused_by_name():
    with pytest.raises(
        ValueError,
        match=r"loss.aggregation must be one of \('token_mean', 'global_token_mean', 'sequence_mean', 'constant'\), "
        r"got 'sum'",
    ):
        VLMGRPOModule(LinearPolicy(), [AccuracyReward()], loss={"aggregation": "sum"})


def test_global_token_mean_is_token_mean_within_a_rank_and_scales_by_the_ranks_token_counts(tiny_policy, case):
    """On one rank the micro-batch losses, shares and masses are ``token_mean``'s and the gradient scale is 1; on two
    ranks the scale is ``world * local tokens / all tokens`` from one all-reduce (a stand-in strategy sums here; the
    two-process run is tests/parallel/test_global_tokens.py)."""
    rollout, _ = case
    token, global_ = (grpo_module(tiny_policy, beta=BETA, aggregation=a, micro_batch_size=1) for a in AGG_PAIR)
    for (a, share_a), (b, share_b) in zip(
        token.weighted_losses(rollout), global_.weighted_losses(rollout), strict=True
    ):
        assert float(share_a) == float(share_b) and torch.equal(a.loss, b.loss)
    assert float(global_.loss_mass(rollout)) == float(token.loss_mass(rollout)) == 8
    assert global_.gradient_scale([rollout]) == 1.0  # no trainer: one process

    class TwoRanks:
        world_size = 2
        strategy = SimpleNamespace(reduce=lambda tensor, reduce_op: tensor + 24 if reduce_op == "sum" else None)

    for module, scale in ((global_, 2 * 8 / 32), (token, 1.0)):
        module._trainer = TwoRanks()
        try:
            assert module.gradient_scale([rollout]) == pytest.approx(scale)  # this rank 8 tokens, the other 24
        finally:
            module._trainer = None


AGG_PAIR = ("token_mean", "global_token_mean")
