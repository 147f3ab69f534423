"""A check shared by the export tests (a plain module: ``conftest`` names are ambiguous across test folders)."""


def assert_export_matches_policy(policy, exported_dir, samples, min_change: float) -> None:
    """The Hugging Face folder ``exported_dir`` gives ``policy``'s log-probs (< 1e-5) on reference completions of
    ``samples``, and those differ from the reference policy's by more than ``min_change`` (the adapter trained)."""
    import torch
    from transformers import AutoModelForImageTextToText

    policy = policy.eval()
    prompts = policy.encode_prompts(samples)
    targets = policy.encode_targets(["<think>red x=3</think><answer>yes</answer>", "<answer>no</answer>"])
    exported = AutoModelForImageTextToText.from_pretrained(exported_dir).eval()
    with torch.no_grad():
        expected = policy.sequence_logprobs(prompts, targets.completion_ids, targets.completion_mask)
        base = policy.reference_logprobs(prompts, targets.completion_ids, targets.completion_mask)
        got = policy.sequence_logprobs(prompts, targets.completion_ids, targets.completion_mask, hf_model=exported)
    mask = targets.completion_mask.bool()
    assert (expected - base)[mask].abs().max() > min_change, "the trained adapter should change the policy"
    assert (got - expected)[mask].abs().max() < 1e-5
