"""PEFT LoRA settings of both families, validated in one place: :class:`LoRASettings` (vision-language policies) and
:class:`FlowLoRASettings` (flow transformers), which differ only in their defaults."""

from __future__ import annotations

from dataclasses import dataclass

LANGUAGE_MODEL_PROJECTIONS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
FLOW_ATTENTION_PROJECTIONS = r".*attn\d?\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"


@dataclass
class LoRASettings:
    """PEFT LoRA on a vision-language model's language model (and, when the targets reach it, the vision tower).

    Every base weight stays frozen under LoRA; only the adapters train, wherever they are. Adapters on layers of the
    vision tower (``visual``) train whatever ``VLMPolicy.freeze_vision`` says (it is about the tower's base weights).

    Attributes:
        r: rank of the update.
        alpha: scaling numerator (``lora_alpha``); the update is scaled by alpha / r.
        dropout: dropout on the LoRA input.
        target_modules: a regex that must match a whole module name (PEFT's ``re.fullmatch``), or a list of names,
            each the name of a module or its last dotted parts (``["qkv"]`` selects every ``...attn.qkv``). The
            default hits the language model's attention and MLP projections and nothing in the vision tower; for
            the vision blocks add e.g. ``|.*visual.blocks.*(qkv|proj|fc1|fc2)``. A regex, or a list
            entry, that matches no module of the model is an error naming it (:mod:`app.models.lora_targets`).
    """

    r: int = 32
    alpha: int = 64
    dropout: float = 0.05
    target_modules: str | list[str] = LANGUAGE_MODEL_PROJECTIONS

    def __post_init__(self):
        if self.r < 1 or self.alpha <= 0:
            raise ValueError(f"LoRA needs r >= 1 and alpha > 0, got r={self.r}, alpha={self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")


@dataclass
class FlowLoRASettings(LoRASettings):
    """PEFT LoRA on a flow transformer's attention projections: :class:`LoRASettings` with other defaults.

    Attributes:
        dropout: 0 by default.
        target_modules: by default the query/key/value/output projections of every attention, and SD3/Flux's
            context-stream projections of joint attention (``add_{q,k,v}_proj``, ``to_add_out``), as Flow-GRPO's SD3
            recipe does. A regex, or a list entry, that matches no module of the transformer is an error naming it.
        r, alpha: see :class:`LoRASettings`.
    """

    dropout: float = 0.0
    target_modules: str | list[str] = FLOW_ATTENTION_PROJECTIONS
