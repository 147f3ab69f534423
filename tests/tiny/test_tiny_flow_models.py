"""Embedded tiny flow models: built offline, cached as a diffusers pipeline folder, loaded through
``from_pretrained``."""

from pathlib import Path

import pytest
import torch

from app.tiny import flow_models as embedded
from app.tiny.flow_models import TINY_FLOWS, load_flow_components, resolve_flow_pretrained

NAMES = ["tiny-sd3", "tiny-wan"]
SUBFOLDERS = ["transformer", "vae", "text_encoder", "tokenizer", "scheduler"]


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory):
    """A cache folder of this module's own, so the first resolve really builds."""
    return tmp_path_factory.mktemp("flow-cache")


def velocity(components, seed: int = 0) -> torch.Tensor:
    """One transformer forward on fixed inputs, with the text encoder's real output as conditioning."""
    transformer = components["transformer"]
    tokenizer, text_encoder = components["tokenizers"]["tokenizer"], components["text_encoders"]["text_encoder"]
    ids = tokenizer(["a red dot"], padding="max_length", max_length=tokenizer.model_max_length, return_tensors="pt")
    out = text_encoder(ids.input_ids, output_hidden_states=True)
    generator = torch.Generator().manual_seed(seed)
    if "temperal_downsample" in components["vae"].config:
        latents = torch.randn(1, 4, 2, 4, 4, generator=generator)
        kwargs = dict(encoder_hidden_states=out.last_hidden_state)
    else:
        latents = torch.randn(1, 4, 16, 16, generator=generator)
        kwargs = dict(encoder_hidden_states=out.hidden_states[-2], pooled_projections=out.text_embeds)
    with torch.no_grad():
        return transformer(hidden_states=latents, timestep=torch.tensor([500.0]), return_dict=False, **kwargs)[0]


def test_the_three_families_are_embedded():
    # tiny-flux is covered by tests/models/test_flow_flux, the image-conditioned variants by
    # tests/models/test_flow_conditioning
    conditioned = ["tiny-flux-kontext", "tiny-wan-i2v", "tiny-wan-ti2v"]
    assert sorted(TINY_FLOWS) == sorted([*NAMES, "tiny-flux", *conditioned])


@pytest.mark.parametrize("name", NAMES)
def test_builds_caches_and_reloads_identically(name, fresh_cache, monkeypatch):
    monkeypatch.setenv("APP_CACHE_DIR", str(fresh_cache))
    folder = Path(resolve_flow_pretrained(name))
    assert folder.is_relative_to(fresh_cache) and folder.name == f"{name}-seed0"
    for sub in SUBFOLDERS:
        assert (folder / sub).is_dir(), sub
    assert (folder / "model_index.json").exists()
    mtime = (folder / "model_index.json").stat().st_mtime_ns

    first = load_flow_components(name)

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a cached embedded flow model was rebuilt")

    monkeypatch.setattr(embedded, "build_tiny_flow", no_rebuild)
    assert resolve_flow_pretrained(name) == str(folder)
    assert (folder / "model_index.json").stat().st_mtime_ns == mtime
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "staging folders left behind"
    second = load_flow_components(str(folder))  # the folder itself loads like any pipeline folder
    assert torch.equal(velocity(first), velocity(second))
    assert sum(p.numel() for p in second["transformer"].parameters()) < 200_000


def test_building_leaves_the_global_generator_alone():
    """A seeded run draws the same numbers whether the embedded model was cached or had to be built first."""
    state = torch.get_rng_state()
    embedded.build_tiny_flow("tiny-sd3", seed=3)
    assert torch.equal(torch.get_rng_state(), state)


def test_unknown_embedded_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown embedded flow model 'tiny-nope'.*tiny-sd3"):
        resolve_flow_pretrained("tiny-nope")
    assert resolve_flow_pretrained("org/some-model") == "org/some-model"
