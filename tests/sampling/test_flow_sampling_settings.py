"""FlowGRPOSamplingSettings: the values it accepts at their bounds, and the message naming each value it refuses."""

import re

import pytest

from app.settings import FlowGRPOSamplingSettings


@pytest.mark.parametrize(
    "settings",
    [
        dict(group_size=1, num_steps=2),  # the last step is never trained: 2 is the fewest
        dict(sampler="cps", eta=1.0),
        dict(sampler="sde", eta=1.5),  # no upper bound for the SDE sampler
        dict(eta=1e-6, timestep_fraction=1.0),
        dict(timestep_fraction=1e-6),
        dict(eval_sampler="unipc", guidance_scale=1.0),
        dict(guidance_scale=4.5),
    ],
)
def test_values_at_their_bounds_are_accepted(settings):
    made = FlowGRPOSamplingSettings(**settings)
    assert all(getattr(made, name) == value for name, value in settings.items())


@pytest.mark.parametrize(
    ("window", "num_steps", "kept"),
    [([0, 1], 2, (0, 1)), ((2, 9), 10, (2, 9)), ((8, 10), 10, (8, 10)), (("1", "3"), 4, (1, 3))],
)
def test_an_sde_window_is_kept_as_a_tuple_of_ints(window, num_steps, kept):
    assert FlowGRPOSamplingSettings(num_steps=num_steps, sde_window=window).sde_window == kept


NEED = "need group_size >= 1 and num_steps >= 1, got {} and {}"
WINDOW = (
    "sde_window must be (start, end) with 0 <= start < end and start < num_steps - 1 = {} (the last step is never "
    "trained), got {}"
)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(group_size=0), NEED.format(0, 10)),
        (dict(num_steps=0), NEED.format(8, 0)),
        (dict(sampler="ode"), "sampler must be 'sde' or 'cps', got 'ode'"),
        (dict(eta=0.0), "eta must be > 0 (and <= 1 for cps): eta = 0 makes every step deterministic, got 0.0"),
        (
            dict(sampler="sde", eta=-0.5),
            "eta must be > 0 (and <= 1 for cps): eta = 0 makes every step deterministic, got -0.5",
        ),
        (
            dict(sampler="cps", eta=1.01),
            "eta must be > 0 (and <= 1 for cps): eta = 0 makes every step deterministic, got 1.01",
        ),
        (dict(timestep_fraction=0.0), "timestep_fraction must be in (0, 1], got 0.0"),
        (dict(timestep_fraction=1.5), "timestep_fraction must be in (0, 1], got 1.5"),
        (dict(eval_sampler="ddim"), "eval_sampler must be 'euler' or 'unipc', got 'ddim'"),
        (dict(guidance_scale=0.99), "guidance_scale must be >= 1 (1 disables guidance), got 0.99"),
        (dict(num_steps=1), "flow-GRPO needs num_steps >= 2 (the last step is never trained), got 1"),
        (dict(num_steps=10, sde_window=(3, 3)), WINDOW.format(9, (3, 3))),  # start == end
        (dict(num_steps=10, sde_window=(9, 10)), WINDOW.format(9, (9, 10))),  # starts at the last step
        (dict(num_steps=10, sde_window=(-1, 4)), WINDOW.format(9, (-1, 4))),
        (dict(num_steps=10, sde_window=(1, 2, 3)), WINDOW.format(9, (1, 2, 3))),
        (dict(num_steps=10, sde_window=(1,)), WINDOW.format(9, (1,))),
    ],
)
def test_each_refused_value_is_named_in_the_message(settings, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FlowGRPOSamplingSettings(**settings)


def test_a_moving_window_steps_later_every_n_steps_and_stops_at_the_last_trainable_steps():
    settings = FlowGRPOSamplingSettings(num_steps=8, sde_window=(0, 2), window_stride=2, window_every_n_steps=3)
    windows = [settings.window_at(step) for step in range(0, 16)]
    assert windows[:3] == [(0, 2)] * 3 and windows[3:6] == [(2, 4)] * 3 and windows[6] == (4, 6)
    assert set(windows[9:]) == {(5, 7)}  # the window's steps all stochastic: it ends before the last step (7)
    assert FlowGRPOSamplingSettings(num_steps=8, sde_window=(1, 3)).window_at(100) == (1, 3)  # a fixed window
    assert FlowGRPOSamplingSettings(num_steps=8).window_at(5) is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(window_stride=1), "window_stride moves the sde_window: set sde_window, the window's first position"),
        (
            dict(sde_window=(0, 2), window_stride=-1),
            "need window_stride >= 0 and window_every_n_steps >= 1, got -1 and 1",
        ),
        (
            dict(sde_window=(0, 2), window_every_n_steps=0),
            "need window_stride >= 0 and window_every_n_steps >= 1, got 0 and 0",
        ),
        (dict(ode_tail="dpm"), "ode_tail must be 'euler' or 'unipc', got 'dpm'"),
        (dict(step_weighting="snr"), "step_weighting must be 'uniform' or 'noise_std', got 'snr'"),
    ],
)
def test_a_bad_moving_window_is_refused_naming_the_value(settings, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FlowGRPOSamplingSettings(**settings)
