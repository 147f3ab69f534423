"""Embedded tiny models: built offline, cached, loaded through ``from_pretrained``, and able to generate."""

from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from app.tiny import models as embedded
from app.tiny.models import TINY_VLMS, build_tiny_vlm, resolve_pretrained
from app.tiny.tokenizer import REASONING_TOKENS

NAMES = ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"]


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory):
    """A cache folder of this module's own, so the first resolve really builds."""
    return tmp_path_factory.mktemp("embedded-cache")


def test_the_three_families_are_embedded():
    assert sorted(TINY_VLMS) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_builds_caches_loads_and_generates(name, fresh_cache, monkeypatch):
    monkeypatch.setenv("APP_CACHE_DIR", str(fresh_cache))
    folder = Path(resolve_pretrained(name))
    assert folder.is_relative_to(fresh_cache)
    assert (folder / "config.json").exists()
    config_mtime = (folder / "config.json").stat().st_mtime_ns

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a cached embedded model was rebuilt")

    monkeypatch.setattr(embedded, "build_tiny_vlm", no_rebuild)
    assert resolve_pretrained(name) == str(folder)
    assert (folder / "config.json").stat().st_mtime_ns == config_mtime
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "staging folders left behind"

    model = AutoModelForImageTextToText.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    content = [{"type": "image"}, {"type": "text", "text": "Is the red dot left of the blue dot?"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(text=[text], images=[[Image.new("RGB", (64, 64), (200, 30, 30))]], return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**inputs, max_new_tokens=6, do_sample=True, min_new_tokens=6)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 6)


@pytest.mark.parametrize("name", NAMES)
def test_build_is_deterministic_for_a_seed(name):
    (a, _), (b, _) = build_tiny_vlm(name, seed=3), build_tiny_vlm(name, seed=3)
    for (key, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), key


def test_building_leaves_the_global_generator_alone():
    """A seeded run draws the same numbers whether the embedded model was cached or had to be built first."""
    state = torch.get_rng_state()
    build_tiny_vlm("tiny-qwen2-vl", seed=3)
    assert torch.equal(torch.get_rng_state(), state)


def test_tokenizer_keeps_reasoning_tags_through_decode():
    processor = AutoProcessor.from_pretrained(resolve_pretrained("tiny-qwen2-vl"))
    tokenizer = processor.tokenizer
    text = "<think>red x=3, blue x=40</think><answer>yes</answer>"
    ids = tokenizer(text + tokenizer.eos_token, add_special_tokens=False).input_ids
    for tag in REASONING_TOKENS:  # each tag is one token
        assert tokenizer.convert_tokens_to_ids(tag) in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.eos_token not in tokenizer.decode(ids, skip_special_tokens=True)


def test_vision_token_ids_agree_between_config_and_tokenizer():
    folder = resolve_pretrained("tiny-qwen2.5-vl")
    model = AutoModelForImageTextToText.from_pretrained(folder)
    tokenizer = AutoProcessor.from_pretrained(folder).tokenizer
    assert model.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert model.config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")


def test_unknown_embedded_name_is_a_clear_error_when_built():
    with pytest.raises(ValueError, match=r"unknown embedded model 'tiny-qwen9-vl'.*tiny-qwen2-vl"):
        build_tiny_vlm("tiny-qwen9-vl")


def test_misspelt_embedded_name_is_a_clear_error_when_resolved():
    """A typo of an embedded name must not go to the hub (a minute of retries, then a connection error)."""
    with pytest.raises(ValueError, match="tiny-qwen2.5vl"):
        resolve_pretrained("tiny-qwen2.5vl")


def test_local_folder_and_hub_id_pass_through_unchanged(tmp_path):
    assert resolve_pretrained(str(tmp_path)) == str(tmp_path)
    assert resolve_pretrained("Qwen/Qwen2.5-VL-3B-Instruct") == "Qwen/Qwen2.5-VL-3B-Instruct"


def test_cache_folder_is_keyed_by_the_builder_code_and_library_versions(tmp_path, monkeypatch):
    """A changed builder (or library version) must never load a model that an older builder cached."""
    import importlib.metadata

    from app.tiny import cache

    monkeypatch.setenv("APP_CACHE_DIR", str(tmp_path))
    first = embedded.cache_root()
    assert first == tmp_path / "tiny" / cache.builder_fingerprint()
    assert len(cache.builder_fingerprint()) == 12

    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.0.0" if name == "transformers" else real_version(name)
    )
    cache.builder_fingerprint.cache_clear()
    try:
        assert embedded.cache_root() != first, "a new transformers version must build anew"
    finally:
        monkeypatch.undo()
        cache.builder_fingerprint.cache_clear()
    assert cache.builder_fingerprint() == first.name

    builder_source = Path(cache.__file__).parent / "models.py"
    real_read_bytes = Path.read_bytes
    monkeypatch.setattr(
        Path, "read_bytes", lambda self: real_read_bytes(self) + (b"# edit" if self == builder_source else b"")
    )
    cache.builder_fingerprint.cache_clear()
    try:
        assert cache.builder_fingerprint() != first.name, "an edited builder must build anew"
    finally:
        monkeypatch.undo()
        cache.builder_fingerprint.cache_clear()
