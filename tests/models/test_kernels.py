"""Optional kernels: which modules Liger replaces (the VLM's language model only; the flow transformers' RMSNorms), that
the replacement keeps the weights, the clear errors when a kernel is requested without its package or CUDA, and the
attention-implementation choices. Liger's Triton kernels themselves run only in the ``gpu`` tests."""

import importlib.util
import sys

import pytest
import torch

from app.models import FlowPolicy, VLMPolicy
from app.models.kernels import (
    ATTN_IMPLEMENTATIONS,
    FLOW_ATTENTION_BACKENDS,
    flow_rms_norm_targets,
    liger_targets,
    replace_flow_rms_norms,
    replace_with_liger,
    require_liger,
    set_flow_attention_backend,
    validate_attn_implementation,
)
from app.tiny.flow_models import load_flow_components
from app.tiny.models import load_vlm

HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def qwen25():
    model, _ = load_vlm("tiny-qwen2.5-vl")
    return model


def keep_rotary(monkeypatch, targets):
    """Restore the modeling modules' rotary function after the test (the replacement is process-wide)."""
    for name in targets.rotary_modules:
        monkeypatch.setattr(sys.modules[name], "apply_rotary_pos_emb", sys.modules[name].apply_rotary_pos_emb)


# ------------------------------------------------------------------------------------------------------- targets
def test_liger_targets_are_the_language_models_norms_mlps_and_rotary(qwen25):
    targets = liger_targets(qwen25)
    layers = qwen25.config.text_config.num_hidden_layers
    assert len(targets.rms_norms) == 2 * layers + 1  # input / post-attention norm per layer, the final norm
    assert all(".language_model." in name for name in targets.rms_norms + targets.mlps)
    assert targets.mlps == [f"model.language_model.layers.{i}.mlp" for i in range(layers)]
    assert targets.rotary_modules == ["transformers.models.qwen2_5_vl.modeling_qwen2_5_vl"]
    vision_norms = [n for n, m in qwen25.model.visual.named_modules() if type(m).__name__.endswith("RMSNorm")]
    assert vision_norms, "the tiny Qwen2.5-VL vision tower has RMSNorms, and they are left alone"


def test_liger_targets_include_qwen3_query_key_norms():
    model, _ = load_vlm("tiny-qwen3-vl")
    targets = liger_targets(model)
    layers = model.config.text_config.num_hidden_layers
    assert len(targets.rms_norms) == 4 * layers + 1  # + q_norm and k_norm per layer
    assert sum(name.endswith("self_attn.q_norm") for name in targets.rms_norms) == layers
    assert targets.rotary_modules == ["transformers.models.qwen3_vl.modeling_qwen3_vl"]


@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed (optional extra 'gpu')")
def test_liger_replacement_keeps_the_weights_and_the_state_dict(monkeypatch):
    model, _ = load_vlm("tiny-qwen2.5-vl")
    before = dict(model.named_parameters())
    keys = list(model.state_dict())
    targets = liger_targets(model)
    keep_rotary(monkeypatch, targets)
    from liger_kernel.transformers import LigerRMSNorm, LigerSwiGLUMLP, liger_rotary_pos_emb

    replace_with_liger(model, targets)

    assert all(isinstance(model.get_submodule(n), LigerRMSNorm) for n in targets.rms_norms)
    assert all(isinstance(model.get_submodule(n), LigerSwiGLUMLP) for n in targets.mlps)
    assert sys.modules[targets.rotary_modules[0]].apply_rotary_pos_emb is liger_rotary_pos_emb
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and list(model.state_dict()) == keys
    assert all(after[name] is before[name] for name in before)  # the same parameter objects, nothing re-initialised
    assert not any(p.is_meta for p in model.parameters())
    assert not isinstance(model.model.visual.blocks[0].norm1, LigerRMSNorm)


# -------------------------------------------------------------------------------------------------------- errors
@pytest.mark.skipif(HAS_LIGER and CUDA, reason="Liger can run here")
def test_use_liger_kernel_without_liger_or_cuda_is_a_short_error():
    with pytest.raises(RuntimeError, match=r"use_liger_kernel=True needs .*(liger-kernel|a CUDA device)"):
        require_liger()
    with pytest.raises(RuntimeError, match="use_liger_kernel"):
        VLMPolicy("tiny-qwen2-vl", use_liger_kernel=True)


def test_attn_implementation_choices():
    assert validate_attn_implementation(None) is None
    assert validate_attn_implementation("sdpa") == "sdpa"
    with pytest.raises(ValueError, match="attn_implementation must be one of .*'flash_attention_3'"):
        validate_attn_implementation("flash_attention_3")
    if not (HAS_FLASH_ATTN and CUDA):
        with pytest.raises(RuntimeError, match="attn_implementation='flash_attention_2' needs .*use 'sdpa'"):
            validate_attn_implementation("flash_attention_2")
        with pytest.raises(RuntimeError, match="flash_attention_2"):
            VLMPolicy("tiny-qwen2-vl", attn_implementation="flash_attention_2")
    assert set(ATTN_IMPLEMENTATIONS) == {"sdpa", "eager", "flash_attention_2"}


def test_eager_and_sdpa_policies_agree(samples):
    policies = {name: VLMPolicy("tiny-qwen2.5-vl", attn_implementation=name).eval() for name in ("eager", "sdpa")}
    assert policies["eager"].hf_model.config._attn_implementation == "eager"
    assert policies["sdpa"].hf_model.config._attn_implementation == "sdpa"
    prompts = policies["eager"].encode_prompts(samples[:2])
    completion = torch.randint(3, 200, (2, 5))
    mask = torch.ones_like(completion)
    with torch.no_grad():
        eager, sdpa = (policies[n](prompts, completion, mask) for n in ("eager", "sdpa"))
    torch.testing.assert_close(sdpa, eager, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------- flow fused RMSNorm
def sd3_with_qk_norm():
    """The tiny SD3 transformer with SD3.5's ``qk_norm: rms_norm`` (diffusers' own RMSNorm class)."""
    transformer = load_flow_components("tiny-sd3", dtype=torch.float32, seed=0)["transformer"]
    return type(transformer).from_config({**transformer.config, "qk_norm": "rms_norm"})


def test_flow_rms_norm_targets_are_the_query_key_norms():
    for model in ("tiny-wan", "tiny-flux"):
        transformer = load_flow_components(model, dtype=torch.float32, seed=0)["transformer"]
        targets = flow_rms_norm_targets(transformer)
        every_rms_norm = [n for n, m in transformer.named_modules() if isinstance(m, torch.nn.RMSNorm)]
        assert targets == every_rms_norm and targets, model
        assert {n.rsplit(".", 1)[1] for n in targets} <= {"norm_q", "norm_k", "norm_added_q", "norm_added_k"}
    sd3 = load_flow_components("tiny-sd3", dtype=torch.float32, seed=0)["transformer"]
    assert flow_rms_norm_targets(sd3) == []  # SD3 / SD3.5-medium without qk_norm: LayerNorms only
    from diffusers.models.normalization import RMSNorm

    sd35 = sd3_with_qk_norm()
    targets = flow_rms_norm_targets(sd35)
    assert targets and all(isinstance(sd35.get_submodule(n), RMSNorm) for n in targets)


@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed (optional extra 'gpu')")
@pytest.mark.parametrize("model", ["tiny-wan", "tiny-flux", "sd3.5-qk-norm"])
def test_flow_rms_norm_replacement_keeps_the_weights_and_the_state_dict(model):
    from liger_kernel.transformers import LigerRMSNorm

    if model == "sd3.5-qk-norm":
        transformer = sd3_with_qk_norm()
    else:
        transformer = load_flow_components(model, dtype=torch.float32, seed=0)["transformer"]
    before, keys = dict(transformer.named_parameters()), list(transformer.state_dict())
    eps = {n: transformer.get_submodule(n).eps for n in flow_rms_norm_targets(transformer)}
    replace_flow_rms_norms(transformer, list(eps))
    assert flow_rms_norm_targets(transformer) == []
    for name, value in eps.items():
        module = transformer.get_submodule(name)
        assert isinstance(module, LigerRMSNorm) and module.variance_epsilon == value and module.offset == 0.0
        assert module.casting_mode == ("llama" if model == "sd3.5-qk-norm" else "gemma")
    after = dict(transformer.named_parameters())
    assert list(transformer.state_dict()) == keys and after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)  # the same parameter objects
    assert not any(p.is_meta for p in transformer.parameters())


@pytest.mark.skipif(HAS_LIGER and CUDA, reason="Liger can run here")
def test_flow_use_liger_kernel_without_liger_or_cuda_is_a_short_error():
    with pytest.raises(RuntimeError, match=r"use_liger_kernel=True needs .*(liger-kernel|a CUDA device)"):
        FlowPolicy("tiny-wan", use_liger_kernel=True)


# ------------------------------------------------------------------------------------------ flow attention backend
def backends(transformer) -> set[str]:
    return {
        str(getattr(m.processor, "_attention_backend", None)) for m in transformer.modules() if hasattr(m, "processor")
    }


def test_flow_native_backend_is_set_and_changes_nothing(random_seed):
    policy = FlowPolicy("tiny-flux", lora=None, attention_backend="native")
    assert backends(policy.base_network) == {"AttentionBackendName.NATIVE"}
    latents = policy.initial_noise(2, torch.Generator().manual_seed(random_seed))
    sigma, cond = torch.tensor([0.8, 0.4]), policy.encode_prompts(["a red dot", "two dots"])
    with torch.no_grad():
        native = policy.velocity(latents, sigma, cond)
        policy.base_network.reset_attention_backend()
        assert backends(policy.base_network) == {"None"}  # diffusers' default
        default = policy.velocity(latents, sigma, cond)
    assert torch.equal(native, default)


@pytest.mark.parametrize("model", ["tiny-wan", "tiny-flux"])
def test_flow_backend_errors_name_what_is_missing(model):
    transformer = load_flow_components(model, dtype=torch.float32, seed=0)["transformer"]
    with pytest.raises(ValueError, match=r"attention_backend must be one of .*'sage'"):
        set_flow_attention_backend(transformer, "sage")
    if not CUDA:
        with pytest.raises(RuntimeError, match=r"attention_backend='_native_flash' needs a CUDA device; use 'native'"):
            set_flow_attention_backend(transformer, "_native_flash")
    if not (HAS_FLASH_ATTN and CUDA):
        with pytest.raises(RuntimeError, match=r"attention_backend='flash' needs .*flash-attn"):
            set_flow_attention_backend(transformer, "flash")
    if importlib.util.find_spec("flash_attn_interface") is None:
        with pytest.raises(RuntimeError, match=r"attention_backend='_flash_3' needs .*FlashAttention-3"):
            set_flow_attention_backend(transformer, "_flash_3")
    assert backends(transformer) == {"None"}, "a refused backend leaves the transformer as it was"
    assert FLOW_ATTENTION_BACKENDS == ("native", "_native_flash", "flash", "_flash_3")


def test_sd3_attention_is_not_dispatched_so_only_native_applies():
    transformer = load_flow_components("tiny-sd3", dtype=torch.float32, seed=0)["transformer"]
    set_flow_attention_backend(transformer, "native")  # SDPA is what SD3's processor runs
    with pytest.raises(RuntimeError, match=r"does not apply to SD3Transformer2DModel: .*JointAttnProcessor2_0"):
        set_flow_attention_backend(transformer, "_native_flash")


# ----------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_LIGER and CUDA), reason="needs liger-kernel and CUDA")
def test_liger_kernels_match_pytorch_on_cuda(monkeypatch):
    from app.models.kernels import apply_liger_kernels

    model, _ = load_vlm("tiny-qwen2.5-vl")
    model = model.cuda().eval()
    ids = torch.randint(3, 200, (2, 16), device="cuda")
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        keep_rotary(monkeypatch, liger_targets(model))
        apply_liger_kernels(model)
        actual = model(input_ids=ids).logits
    torch.testing.assert_close(actual, expected, atol=2e-4, rtol=2e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_LIGER and CUDA), reason="needs liger-kernel and CUDA")
@pytest.mark.parametrize("model", ["tiny-wan", "tiny-flux"])
def test_flow_liger_rms_norm_matches_pytorch_on_cuda(model, random_seed):
    """Same velocities, and LoRA still on the same projections, with Liger's RMSNorm in the query/key norms."""
    reference = FlowPolicy(model).cuda().eval()
    fused = FlowPolicy(model, use_liger_kernel=True).cuda().eval()
    assert fused.liger_rms_norms == flow_rms_norm_targets(reference.base_network)
    assert list(fused.model.state_dict()) == list(reference.model.state_dict())
    latents = reference.initial_noise(2, torch.Generator().manual_seed(random_seed)).cuda()
    sigma = torch.tensor([0.8, 0.4], device="cuda")
    with torch.no_grad():
        cond = reference.encode_prompts(["a red dot", "two dots"])
        expected = reference.velocity(latents, sigma, cond)
        actual = fused.velocity(latents, sigma, cond)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
