"""Reinforcement fine-tuning of visual reasoning on Lightning.

GRPO for vision-language models (Qwen2-VL / Qwen2.5-VL / Qwen3-VL) and flow-GRPO for flow-matching generators, with
TorchMetrics-style verifiable rewards. Run ``python -m app fit --config configs/quickstart/quickstart.yaml``.
"""

__version__ = "0.1.0"
