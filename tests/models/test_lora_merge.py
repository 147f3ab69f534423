"""LoRA adapters folded into copies of the base weights for a rollout: the same outputs as the adapter branch, the
base weight tensors back bit for bit afterwards, layers that cannot be folded left computing their adapters."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from app.models.lora_merge import mergeable_lora_layers, merged_lora
from app.settings import SamplingSettings


def lora_mlp(dtype=torch.float32, use_dora=False, seed=0) -> nn.Module:
    """A 3-layer MLP with LoRA r 4 on both hidden linears and a non-zero (trained-looking) adapter."""
    torch.manual_seed(seed)
    base = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8)).to(dtype)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["0", "2"], use_dora=use_dora))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    return model.eval()


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_merged_layers_give_the_adapter_branchs_outputs_and_run_one_product():
    model = lora_mlp()
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))
    expected = model(x)
    calls = []
    hooks = [m.register_forward_hook(lambda *a: calls.append(1)) for n, m in model.named_modules() if "lora_A" in n]
    with torch.no_grad(), merged_lora(model) as merged:
        got = model(x)
        assert not calls  # the adapter branch is bypassed
    assert merged == 2
    for h in hooks:
        h.remove()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    with model.disable_adapter():
        assert (model(x) - expected).abs().max() > 1e-2  # the adapter matters at these values


def test_base_weights_are_the_same_tensors_bit_for_bit_after_many_bf16_rollouts():
    model = lora_mlp(torch.bfloat16)
    before = base_weights(model)
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    x = torch.randn(3, 16, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for _ in range(5):
            with merged_lora(model):
                model(x)
    for name, weight in base_weights(model).items():
        assert torch.equal(weight, before[name]), name
    assert pointers == {n: p.data_ptr() for n, p in model.named_parameters()}
    layers = mergeable_lora_layers(model)
    assert len(layers) == 2 and not any(layer.disable_adapters for layer in layers)


def test_an_exception_inside_restores_weights_and_adapters():
    model = lora_mlp()
    before = base_weights(model)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(3))
    expected = model(x)
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), merged_lora(model):
        raise RuntimeError("boom")
    assert all(torch.equal(w, before[n]) for n, w in base_weights(model).items())
    assert torch.equal(model(x), expected)


def test_dora_layers_and_models_without_lora_are_left_as_they_are():
    model = lora_mlp(use_dora=True)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(4))
    expected = model(x)
    assert mergeable_lora_layers(model) == []
    with torch.no_grad(), merged_lora(model) as merged:
        assert merged == 0
        torch.testing.assert_close(model(x), expected, atol=0, rtol=0)
    plain = nn.Linear(3, 3)
    with merged_lora(plain) as merged:
        assert merged == 0


@pytest.mark.parametrize("vision", [False, True], ids=["language-model", "vision-too"])
def test_vlm_rollout_with_merged_adapters_draws_the_unmerged_completions(new_policy, new_samples, vision):
    from policy_helpers import perturb, vision_lora_policy

    policy = vision_lora_policy("tiny-qwen2-vl") if vision else new_policy("tiny-qwen2-vl", lora_r=4)
    perturb([p for n, p in policy.model.named_parameters() if "lora_B" in n], scale=0.2)  # an adapter that matters
    prompts = policy.encode_prompts(new_samples(2, seed=5), rows_per_prompt=4)
    completions = {}
    for merge in (False, True, False):
        policy.merge_lora_for_rollout = merge
        torch.manual_seed(7)
        completions[merge] = policy.generate(
            prompts, SamplingSettings(max_new_tokens=12), rows_per_prompt=4
        ).completion_ids
    assert torch.equal(completions[True], completions[False])
    with policy.model.disable_adapter():
        torch.manual_seed(7)
        base = policy.generate(prompts, SamplingSettings(max_new_tokens=12), rows_per_prompt=4).completion_ids
    assert not torch.equal(base, completions[True])  # the adapter changes what is drawn, so the equality says something
    merged = {id(layer) for layer in mergeable_lora_layers(policy.model)}
    merged_vision = [n for n, m in policy.model.named_modules() if id(m) in merged and ".visual." in n]
    assert bool(merged_vision) == vision  # the vision tower's adapters are folded too
