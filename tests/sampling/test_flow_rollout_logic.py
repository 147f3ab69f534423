"""The flow denoising loop's logic on a closed-form stand-in policy (no model is built): settings validation, step
selection, micro-batched and guided velocities, the configured sampler, shared initial noise and the conditioning rows.
The same loop on the tiny SD3 policy is in test_flow_rollout.py."""

import logging

import pytest
import torch

from app.sampling import FlowSampler, stochastic_steps, train_steps
from app.sampling.flow import cps_step, flow_sigmas, sde_step
from app.settings import FlowGRPOSamplingSettings


class StandInPolicy:
    """A policy shaped like FlowPolicy with a closed-form velocity ``v = sigma x + text + 2 image`` (a one-row
    conditioning broadcasts, as in the real transformers); it records the rows and sigma device of each forward pass."""

    def __init__(self, **attributes):
        self.passes = []  # (rows, sigma device) per velocity call
        self.__dict__.update(attributes)

    def encode_prompts(self, prompts):
        return {"text": torch.tensor([[float(len(p)), 1.0, -1.0, 0.5] for p in prompts])}  # [B, 4]

    def encode_conditions(self, images):
        return {"image": images.flatten(1)[:, :4]}  # [B, 4]

    def initial_noise(self, batch, generator=None):
        return torch.randn(batch, 4, generator=generator)

    def velocity(self, x, sigma, conditioning):
        self.passes.append((len(x), sigma.device))
        v = sigma[:, None] * x + conditioning["text"]
        return v + 2 * conditioning["image"] if "image" in conditioning else v


# ---------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eta": 0.0}, "eta must be > 0"),
        ({"sampler": "cps", "eta": 1.5}, "<= 1 for cps"),
        ({"sampler": "ode"}, "sampler must be 'sde' or 'cps'"),
        ({"timestep_fraction": 0.0}, "timestep_fraction"),
        ({"sde_window": (3, 4), "num_steps": 4}, "sde_window must be"),
        ({"sde_window": (2, 1)}, "sde_window must be"),
        ({"guidance_scale": 0.5}, "guidance_scale must be >= 1"),
        ({"group_size": 0}, "group_size >= 1"),
    ],
)
def test_bad_settings_are_refused_with_a_message_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlowGRPOSamplingSettings(**kwargs)


def test_settings_accept_their_boundary_values():
    assert FlowGRPOSamplingSettings(group_size=1, num_steps=2).num_steps == 2
    assert FlowGRPOSamplingSettings(sampler="cps", eta=1.0).eta == 1.0
    assert FlowGRPOSamplingSettings(sampler="sde", eta=1.5).eta == 1.5  # the SDE's noise level has no upper bound
    assert FlowGRPOSamplingSettings(timestep_fraction=1.0).timestep_fraction == 1.0
    with pytest.raises(ValueError, match=r"timestep_fraction must be in \(0, 1\], got 1.5"):
        FlowGRPOSamplingSettings(timestep_fraction=1.5)


def test_a_bad_sde_window_message_names_the_last_trainable_start():
    with pytest.raises(ValueError, match=r"start < num_steps - 1 = 3 \(the last step is never trained\), got \(3, 4\)"):
        FlowGRPOSamplingSettings(num_steps=4, sde_window=(3, 4))


def test_the_sde_window_becomes_a_tuple_of_ints():
    assert FlowGRPOSamplingSettings(sde_window=[0, 2]).sde_window == (0, 2)


# ---------------------------------------------------------------------------------------------- step selection
def test_the_last_step_is_never_stochastic_and_the_window_bounds_the_rest():
    sigmas = flow_sigmas(6)
    assert stochastic_steps(sigmas) == [0, 1, 2, 3, 4]
    assert stochastic_steps(sigmas, (2, 4)) == [2, 3]
    assert stochastic_steps(sigmas, (3, 6)) == [3, 4]  # the window reaches the last step; it stays an Euler step


def test_a_schedule_not_ending_at_zero_has_every_step_stochastic():
    sigmas = torch.tensor([1.0, 0.6, 0.3])  # a truncated schedule: the last step lands on 0.3, not 0
    assert stochastic_steps(sigmas) == [0, 1]
    assert stochastic_steps(sigmas, (1, 5)) == [1]


def test_train_steps_takes_a_random_subset_of_the_fraction():
    candidates = [0, 1, 2, 3, 4, 5, 6, 7]
    assert train_steps(candidates, 1.0) == candidates
    generator = torch.Generator().manual_seed(0)
    subsets = {tuple(train_steps(candidates, 0.5, generator)) for _ in range(20)}
    assert all(len(s) == 4 and list(s) == sorted(s) and set(s) <= set(candidates) for s in subsets)
    assert len(subsets) > 1  # drawn anew each time
    assert len(train_steps(candidates, 0.01)) == 1  # at least one step


def test_train_steps_draws_from_the_generator_only_for_a_strict_subset():
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    assert train_steps([5, 2, 7], 1.0, generator) == [5, 2, 7]  # all of them, as given, nothing drawn
    assert torch.equal(generator.get_state(), state)
    torch.manual_seed(1)  # the global generator plays no part
    first = train_steps(list(range(8)), 0.5, generator)
    assert not torch.equal(generator.get_state(), state)
    torch.manual_seed(2)
    assert train_steps(list(range(8)), 0.5, torch.Generator().manual_seed(0)) == first


# --------------------------------------------------------------------------------------------------------- velocities
def test_velocities_run_micro_batch_size_rows_per_forward_pass_and_sigma_on_the_latents_device():
    stand_in = StandInPolicy()
    sampler = FlowSampler(stand_in, FlowGRPOSamplingSettings(), micro_batch_size=1)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    conditioning = stand_in.encode_prompts(["ab", "cde", "f"])
    with torch.no_grad():
        v = sampler.velocity(x, torch.tensor(0.5), conditioning)
    torch.testing.assert_close(v, 0.5 * x + conditioning["text"])
    assert [rows for rows, _ in stand_in.passes] == [1, 1, 1]
    stand_in.passes.clear()
    meta = torch.zeros(2, 4, device="meta")
    sampler.velocity(meta, torch.tensor(0.5), {"text": torch.zeros(1, 4, device="meta")})
    assert stand_in.passes == [(2, torch.device("meta"))]


def test_guidance_of_a_one_row_conditioning_broadcasts_it_and_keeps_the_image_in_both_branches():
    stand_in = StandInPolicy()
    sampler = FlowSampler(stand_in, FlowGRPOSamplingSettings(guidance_scale=2.0))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.8, 0.5, 0.2])
    text, image = stand_in.encode_prompts(["a prompt"])["text"], torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    guided = sampler.velocity(x, sigma, {"text": text, "image": image})  # one row for all 3 latents
    v_cond = sigma[:, None] * x + text + 2 * image
    v_uncond = sigma[:, None] * x + torch.tensor([[0.0, 1.0, -1.0, 0.5]]) + 2 * image  # the empty prompt, same image
    torch.testing.assert_close(guided, v_uncond + 2.0 * (v_cond - v_uncond))
    assert [rows for rows, _ in stand_in.passes] == [6]  # both branches in one pass


def test_guidance_scale_one_runs_the_prompt_alone():
    stand_in = StandInPolicy()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    conditioning = stand_in.encode_prompts(["a", "bb", "ccc"])
    v = FlowSampler(stand_in, FlowGRPOSamplingSettings(guidance_scale=1.0)).velocity(x, torch.tensor(0.4), conditioning)
    assert torch.equal(v, 0.4 * x + conditioning["text"])
    assert [rows for rows, _ in stand_in.passes] == [3]


def test_guidance_on_a_guidance_distilled_policy_warns_once_with_both_scales(caplog):
    distilled = StandInPolicy(guidance_distilled=True, flux_guidance=3.5)
    with caplog.at_level(logging.WARNING, logger="app.sampling.flow_rollout"):
        FlowSampler(distilled, FlowGRPOSamplingSettings(guidance_scale=1.0))
        FlowSampler(StandInPolicy(), FlowGRPOSamplingSettings(guidance_scale=2.0))  # no guidance_distilled attribute
        assert caplog.records == []
        FlowSampler(distilled, FlowGRPOSamplingSettings(guidance_scale=2.0))
    assert [r.getMessage() for r in caplog.records] == [
        "guidance_scale=2.0 runs true CFG on a guidance-distilled FLUX (twice the compute per step) on top of "
        "flux_guidance=3.5"
    ]


def test_a_micro_batch_size_of_one_is_accepted():
    assert FlowSampler(StandInPolicy(), FlowGRPOSamplingSettings(), micro_batch_size=1).micro_batch_size == 1


def test_micro_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        FlowSampler(StandInPolicy(), FlowGRPOSamplingSettings(), micro_batch_size=0)


# ----------------------------------------------------------------------------------------------------------- the loop
def test_shared_initial_noise_is_drawn_from_the_given_generator():
    stand_in = StandInPolicy()
    sampler = FlowSampler(stand_in, FlowGRPOSamplingSettings(group_size=2, shared_initial_noise=True))
    torch.manual_seed(0)
    first = sampler.initial_noise(2, torch.Generator().manual_seed(6))
    torch.manual_seed(1)  # the global generator plays no part
    assert torch.equal(first, sampler.initial_noise(2, torch.Generator().manual_seed(6)))
    expected = stand_in.initial_noise(2, torch.Generator().manual_seed(6)).repeat_interleave(2, dim=0)
    assert torch.equal(first, expected)
    assert not torch.equal(first, sampler.initial_noise(2, torch.Generator().manual_seed(7)))


@pytest.mark.parametrize(("sampler", "step"), [("sde", sde_step), ("cps", cps_step)])
def test_stochastic_steps_use_the_configured_sampler(sampler, step):
    x, v = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(0)).unbind()
    flow_sampler = FlowSampler(StandInPolicy(), FlowGRPOSamplingSettings(sampler=sampler, eta=0.7))
    out = flow_sampler.step(x, v, 0.8, 0.6, generator=torch.Generator().manual_seed(1))
    expected = step(x, v, 0.8, 0.6, 0.7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.sample, expected.sample) and torch.equal(out.log_prob, expected.log_prob)


def test_condition_images_must_match_the_prompts():
    sampler = FlowSampler(StandInPolicy(), FlowGRPOSamplingSettings())
    with pytest.raises(ValueError, match="got 1 condition images for 2 prompts"):
        sampler.conditioning(["a", "b"], images=torch.zeros(1, 3, 2, 2))


def test_conditioning_repeats_each_prompt_s_text_and_image_rows_group_major():
    """Prompts "ab" and "abcd" (text row starts with the length), two distinct images, K = 3: rows b * K + k."""
    sampler = FlowSampler(StandInPolicy(), FlowGRPOSamplingSettings())
    images = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)  # [B, 3, H, W]
    conditioning = sampler.conditioning(["ab", "abcd"], rows_per_prompt=3, images=images)
    assert set(conditioning) == {"text", "image"}
    assert conditioning["text"][:, 0].tolist() == [2.0, 2.0, 2.0, 4.0, 4.0, 4.0]
    assert conditioning["image"].tolist() == [[0.0, 1.0, 2.0, 3.0]] * 3 + [[12.0, 13.0, 14.0, 15.0]] * 3
    assert set(sampler.conditioning(["ab"], rows_per_prompt=2)) == {"text"}  # no images, no image conditions
