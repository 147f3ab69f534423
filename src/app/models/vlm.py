"""The VLM policy: a Qwen-VL model + processor with optional PEFT LoRA, sampling and chunked per-token log-probs.

One class owns everything that touches the model, so the Lightning modules only see prompts, completions and
log-prob tensors. Group layout: completion row ``b * K + k`` belongs to prompt ``b``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn
from transformers import LogitsProcessorList
from transformers.video_utils import VideoMetadata

from app.algorithms import LossOutput
from app.algorithms.fused_linear import FusedLinearGRPOLoss
from app.algorithms.logprobs import chunked_token_logprobs, chunked_token_logprobs_and_entropy
from app.data.video import capped_video
from app.dtypes import parse_dtype
from app.formats import REASONING_INSTRUCTION
from app.models.kernels import apply_liger_kernels, require_liger, validate_attn_implementation
from app.models.lora import lora_adapter
from app.models.lora_merge import merged_lora
from app.models.packing import packed_hidden_states, packs
from app.models.policy import SwitchableReference
from app.models.shared_prefix import (
    PER_TOKEN_KEYS,
    group_heads,
    prefill_shared_prefix,
    prefix_shared_hidden_states,
    repeat_rows,
    shared_prompt_features,
    static_cache,
)
from app.models.token_sampling import InverseCDFSampling
from app.parallel.fsdp import gathered
from app.parallel.loading import keeping_new_parameters, lean_loading_requested
from app.parallel.plan import ShardingPlan, repeated_blocks
from app.settings import LANGUAGE_MODEL_PROJECTIONS, LoRASettings, SamplingSettings, with_defaults
from app.tiny.models import load_vlm
from app.types import IMAGE_TOKEN, VIDEO_TOKEN, VISUAL_INPUTS, CompletionBatch, PromptInputs, Video, VisualSample

log = logging.getLogger(__name__)

_VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


_PLACEHOLDERS = {IMAGE_TOKEN: "image", VIDEO_TOKEN: "video"}
_PLACEHOLDER_PATTERN = re.compile("(" + "|".join(re.escape(token) for token in _PLACEHOLDERS) + ")")


def prompt_content(text: str, num_images: int, num_videos: int = 0) -> list[dict[str, str]]:
    """A user turn's chat content: each image and video where the text's ``<image>`` and ``<video>`` placeholders put
    it, or, in a text without placeholders, every image, then every video, before the text. ``ValueError`` when the
    placeholders are not one per image and one per video."""
    pieces = _PLACEHOLDER_PATTERN.split(text)  # text, placeholder, text, ...
    if len(pieces) == 1:
        media = [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos
        return [dict(item) for item in media] + [{"type": "text", "text": text}]
    counts = {token: pieces[1::2].count(token) for token in _PLACEHOLDERS}
    if counts[IMAGE_TOKEN] != num_images or counts[VIDEO_TOKEN] != num_videos:
        raise ValueError(
            f"{counts[IMAGE_TOKEN]} {IMAGE_TOKEN} and {counts[VIDEO_TOKEN]} {VIDEO_TOKEN} placeholders for "
            f"{num_images} images and {num_videos} videos in {text[:80]!r}"
        )
    content = []
    for i, piece in enumerate(pieces):
        if i % 2:
            content.append({"type": _PLACEHOLDERS[piece]})
        elif piece:
            content.append({"type": "text", "text": piece})
    return content


class VLMPolicy(SwitchableReference, nn.Module):
    """A vision-language policy loaded through ``from_pretrained``.

    Args:
        model: an embedded name (``tiny-qwen2-vl``, ``tiny-qwen2.5-vl``, ``tiny-qwen3-vl``), a hub id such as
            ``Qwen/Qwen2.5-VL-3B-Instruct``, or a local folder (for example an exported SFT policy).
        lora: LoRA settings; None trains all language-model parameters (full fine-tuning).
        freeze_vision: keep the base weights of the vision tower (and its merger) frozen. It matters for full
            fine-tuning only (False trains the whole tower, True none of it): under LoRA every base weight is frozen
            anyway, and LoRA adapters that ``lora.target_modules`` puts in the vision tower train either way.
        vision_learning_rate: the learning rate of the vision tower's trainable parameters (its LoRA adapters, or
            the whole tower under full fine-tuning with ``freeze_vision=False``), in an optimizer group of their own
            (see :meth:`parameter_groups`; the warm-up scales it like the module's); None: the module's rate.
        dtype: weight dtype: float32, bfloat16 or float16.
        attn_implementation: ``sdpa`` (PyTorch picks its flash kernel when the inputs allow it), ``eager`` or
            ``flash_attention_2`` (needs flash-attn and CUDA); None = library default.
        use_liger_kernel: replace the language model's RMSNorm, SwiGLU MLP and rotary with Liger's fused kernels
            (needs liger-kernel and CUDA: an error otherwise, see :mod:`app.models.kernels`).
        gradient_checkpointing: recompute activations in backward to save memory.
        shared_prefix: in ``generate``, run the vision tower and the prompt prefill once per group of identical rows
            and expand the KV cache to the group (same completions for the same seed); in the log-prob forward, run
            the prompt once per distinct prompt, its completions attending to its keys and values (the same log-probs
            and gradients up to rounding; under gradient checkpointing or packing only the images and the 3-D
            positions are computed once per prompt). False: every row.
        static_cache: decode into a fixed-size KV cache (prompt + ``max_new_tokens`` positions, allocated per
            rollout) instead of a growing one. On CUDA, transformers then compiles the decoding step with
            ``torch.compile`` (the first rollout of each shape pays the compilation); on CPU it only costs memory.
            Same completions as the growing cache (tests/models/test_static_cache.py).
        merge_lora_for_rollout: with LoRA, ``generate`` decodes with each adapter folded into a copy of its base
            weight (one product per layer instead of three; the base weights are left bit-identical, see
            :mod:`app.models.lora_merge`). Sampled tokens can differ from the unmerged computation by rounding only;
            the training log-probs always use the unmerged adapters.
        logprob_chunk_size: completion tokens per chunk when computing log-probs (bounds the float32 logits in memory).
        padding_free: run the log-prob forward on the rows' real tokens packed into one row, with per-sequence
            positions (:mod:`app.models.packing`; the same log-probs). None: when the attention is variable-length
            (``flash_attention_2``), where it saves the padding's work; sdpa and eager would need a ``[T, T]`` mask.
        instruction: appended to every question; the reasoning-format instruction of the papers by default.
        max_video_frames: most frames of a video the processor sees (>= 2). A longer clip is sampled uniformly over its
            length to the largest even count within the cap (its rate lowered to keep its duration) and a warning
            names the row; default 768, the Qwen-VL video processors' ``max_frames``.
        max_video_pixels: most pixels (width x height) of a video frame the processor sees; larger frames are scaled
            down (aspect kept) first, with a warning. Default ``768 * 28 * 28``, the Qwen2/2.5-VL video processors'
            per-frame cap (``qwen-vl-utils``' ``VIDEO_MAX_PIXELS``); the processor then applies its own size range.
            A video costs about ``frames / 2 x pixels / (patch x merge)^2`` visual tokens (docs/vlm_grpo.md
            "Video memory").
        seed: seed of the embedded model's random weights (ignored for real checkpoints).
    """

    def __init__(
        self,
        model: str = "tiny-qwen2.5-vl",
        lora: LoRASettings | None = None,
        freeze_vision: bool = True,
        vision_learning_rate: float | None = None,
        dtype: str = "float32",
        attn_implementation: str | None = None,
        use_liger_kernel: bool = False,
        gradient_checkpointing: bool = False,
        shared_prefix: bool = True,
        static_cache: bool = False,
        merge_lora_for_rollout: bool = True,
        logprob_chunk_size: int = 1024,
        padding_free: bool | None = None,
        instruction: str = REASONING_INSTRUCTION,
        max_video_frames: int = 768,
        max_video_pixels: int = 768 * 28 * 28,
        seed: int = 0,
    ):
        super().__init__()
        if max_video_frames < 2:
            raise ValueError(f"max_video_frames must be >= 2, got {max_video_frames}")
        if max_video_pixels < 1:
            raise ValueError(f"max_video_pixels must be >= 1, got {max_video_pixels}")
        self.max_video_frames, self.max_video_pixels = max_video_frames, max_video_pixels
        self._reported_video_caps: set[str] = set()  # the caps a warning was logged for (one each per policy)
        torch_dtype = parse_dtype(dtype)
        if vision_learning_rate is not None and not vision_learning_rate > 0:
            raise ValueError(f"vision_learning_rate must be > 0 or null, got {vision_learning_rate}")
        self.vision_learning_rate = vision_learning_rate
        attn_implementation = validate_attn_implementation(attn_implementation)
        if use_liger_kernel:
            require_liger()  # before loading the weights
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        # empty (meta parameters, weights read after sharding) inside app.parallel.loading.lean_loading
        empty = lean_loading_requested()
        hf_model, self.processor = load_vlm(model, dtype=torch_dtype, seed=seed, empty=empty, **extra)
        self.processor.tokenizer.padding_side = "left"
        self.model_name = model
        self.instruction = instruction
        self.logprob_chunk_size = logprob_chunk_size
        self.padding_free = padding_free
        self.shared_prefix = shared_prefix
        self.static_cache = static_cache
        self.merge_lora_for_rollout = merge_lora_for_rollout
        self.uses_lora = lora is not None
        self.kernels = apply_liger_kernels(hf_model) if use_liger_kernel else None  # LigerTargets: what was replaced
        if gradient_checkpointing:
            hf_model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        with keeping_new_parameters(hf_model):  # an empty model keeps the adapters' initial values
            self.model = self._wrap(hf_model, lora, freeze_vision, model)  # PeftModel with LoRA, else the HF model
        self.model.train()  # from_pretrained returns eval mode; generation switches to eval and back itself
        self.frozen_reference: nn.Module | None = None  # full fine-tuning's KL reference, see enable_reference
        self._use_reference = False
        tokenizer = self.processor.tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.eos_token_ids = _as_list(hf_model.generation_config.eos_token_id) or [tokenizer.eos_token_id]
        self.suppressed_token_ids = [
            i
            for i in tokenizer.convert_tokens_to_ids(list(_VISION_TOKENS))
            if i is not None and i != tokenizer.unk_token_id
        ]

    @staticmethod
    def _wrap(hf_model: nn.Module, lora: LoRASettings | None, freeze_vision: bool, model_name: str) -> nn.Module:
        """The PEFT model (LoRA: the adapters train, every base weight is frozen, in the vision tower too) or the HF
        model with everything trainable but, with ``freeze_vision``, the vision tower."""
        vision = _vision_tower(hf_model)
        if lora is None:
            hf_model.requires_grad_(True)
            vision.requires_grad_(not freeze_vision)
            return hf_model
        lora = with_defaults(lora, dropout=0.05, target_modules=LANGUAGE_MODEL_PROJECTIONS)
        adapted = lora_adapter(hf_model, lora, model_name)
        targets = [name for name, module in hf_model.named_modules() if hasattr(module, "lora_A")]
        vision_prefix = next(name for name, module in hf_model.named_modules() if module is vision) + "."
        in_vision = sum(name.startswith(vision_prefix) for name in targets)
        if not freeze_vision:
            log.warning(
                "freeze_vision=False has no effect with LoRA: the vision tower's base weights stay frozen (%s)",
                f"{in_vision} of its modules carry trained adapters" if in_vision else "no LoRA target reaches it",
            )
        elif in_vision:
            log.info("LoRA adapts %d modules of the vision tower (its base weights stay frozen)", in_vision)
        return adapted

    # ----------------------------------------------------------------------------------------------------- prompts
    def prompt_text(self, sample: VisualSample) -> str:
        content = prompt_content(sample.question + self.instruction, len(sample.images), len(sample.videos))
        messages = [{"role": "user", "content": content}]
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode_prompts(self, samples: Sequence[VisualSample], rows_per_prompt: int = 1) -> PromptInputs:
        """Processor inputs for the prompts, each row repeated ``rows_per_prompt`` times (group-major), left-padded.
        Each prompt goes through the processor once; its tensors are then repeated.

        Videos go through the processor's video path as the frames they hold (no further frame sampling), with their
        rate as metadata: Qwen2.5-VL derives its time positions from it, Qwen3-VL the timestamps it writes. A video
        over ``max_video_frames`` or ``max_video_pixels`` is capped first (:meth:`_capped_video`)."""
        if rows_per_prompt < 1:
            raise ValueError(f"rows_per_prompt must be >= 1, got {rows_per_prompt}")
        texts = [self.prompt_text(s) for s in samples]
        images = [list(s.images) for s in samples]
        videos = [self._capped_video(video, row, s.task) for row, s in enumerate(samples) for video in s.videos]
        kwargs = _video_kwargs(videos) if videos else {}
        inputs = self.processor(
            text=texts, images=images if any(images) else None, return_tensors="pt", padding=True, **kwargs
        )
        tensors = {k: v.to(self.device) for k, v in inputs.items()}
        videos_per_row = [len(s.videos) for s in samples] if videos else None
        prompts = PromptInputs(tensors, [len(row) for row in images], videos_per_row=videos_per_row)
        return repeat_rows(prompts, rows_per_prompt) if rows_per_prompt > 1 else prompts

    def _capped_video(self, video: Video, row: int, task: str) -> Video:
        """``video`` within ``max_video_frames`` and ``max_video_pixels`` (:func:`~app.data.video.capped_video`); the
        first video over each cap is reported in a warning naming its row, its size and the setting."""
        capped = capped_video(video, self.max_video_frames, self.max_video_pixels)
        if capped is video:
            return video
        (count, height, width), (kept, new_height, new_width) = video.frames.shape[:3], capped.frames.shape[:3]
        over = []
        if kept < count:
            over.append(
                f"{count} frames, over max_video_frames={self.max_video_frames}: {kept} frames sampled uniformly "
                "over its length"
            )
        if (new_height, new_width) != (height, width):
            over.append(
                f"frames of {width}x{height} pixels, over max_video_pixels={self.max_video_pixels}: scaled down to "
                f"{new_width}x{new_height}"
            )
        settings = {setting for setting in ("max_video_frames", "max_video_pixels") if any(setting in o for o in over)}
        if settings - self._reported_video_caps:
            log.warning(
                "row %d (%s): a video of %s (later videos over the cap are capped without a warning)",
                row,
                task,
                "; ".join(over),
            )
            self._reported_video_caps |= settings
        return capped

    # ------------------------------------------------------------------------------------------------- sampling
    @torch.no_grad()
    def generate(
        self,
        prompt_inputs: PromptInputs,
        sampling: SamplingSettings | None = None,
        greedy: bool = False,
        rows_per_prompt: int = 1,
    ) -> CompletionBatch:
        """Draw one completion per row of ``prompt_inputs`` (already repeated K times by ``encode_prompts``).

        With ``shared_prefix`` and groups of ``rows_per_prompt`` identical rows, each prompt's images and text are
        encoded and prefilled once and the KV cache is expanded to its K rows
        (see :mod:`app.models.shared_prefix`)."""
        sampling = sampling or SamplingSettings()
        kwargs = {"do_sample": False}  # sampled rows are drawn by the last logits processor (see token_sampling)
        if greedy:
            kwargs["suppress_tokens"] = self.suppressed_token_ids
        else:  # it suppresses the vision tokens itself: one logits processor per decoding step, not two
            sampler = InverseCDFSampling(sampling.temperature, sampling.top_p, self.suppressed_token_ids)
            kwargs["logits_processor"] = LogitsProcessorList([sampler])
        was_training = self.model.training
        self.model.eval()
        try:
            merge = merged_lora(self.model) if self.uses_lora and self.merge_lora_for_rollout else nullcontext()
            with gathered(self), merge, torch.inference_mode():  # FSDP: one all-gather for the whole generation
                # inference mode: no version counters or view tracking on the decoding loop's many small operations
                inputs = dict(prompt_inputs.tensors)
                heads = group_heads(prompt_inputs, rows_per_prompt) if self.shared_prefix else None
                if heads is not None:
                    inputs = {k: v for k, v in inputs.items() if k in PER_TOKEN_KEYS}
                    inputs["cache"] = prefill_shared_prefix(self.hf_model, heads, rows_per_prompt)
                if self.static_cache:
                    length = prompt_inputs.tensors["input_ids"].shape[1] + sampling.max_new_tokens
                    inputs["cache"] = static_cache(self.hf_model.config, length, inputs.get("cache"))
                sequences = self.model.generate(
                    **inputs,
                    max_new_tokens=sampling.max_new_tokens,
                    pad_token_id=self.pad_token_id,
                    eos_token_id=self.eos_token_ids,
                    **kwargs,
                )
        finally:
            self.model.train(was_training)
        # a normal tensor again (an inference tensor cannot be saved for the update's backward)
        completion_ids = sequences[:, prompt_inputs.tensors["input_ids"].shape[1] :].clone()  # [N, L]
        return self._completion_batch(completion_ids, rows_per_prompt)

    def _completion_batch(self, completion_ids: torch.Tensor, rows_per_prompt: int) -> CompletionBatch:
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=completion_ids.device))  # [N, L]
        has_eos = is_eos.any(dim=1)  # [N]
        first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), completion_ids.shape[1] - 1)  # [N]
        positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)  # [L]
        mask = (positions[None, :] <= first_eos[:, None]).long()  # [N, L]
        completion_ids = completion_ids.masked_fill(mask == 0, self.pad_token_id)
        texts = self.processor.batch_decode(completion_ids, skip_special_tokens=True)
        return CompletionBatch(completion_ids, mask, texts, truncated=~has_eos, rows_per_prompt=rows_per_prompt)

    def encode_targets(self, targets: Sequence[str], rows_per_prompt: int = 1) -> CompletionBatch:
        """Tokenise reference completions (for SFT), each closed with the end-of-turn token, right-padded."""
        tokenizer = self.processor.tokenizer
        rows = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in targets]
        length = max(len(r) for r in rows)
        ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        return self._completion_batch(ids.to(self.device), rows_per_prompt)

    # ------------------------------------------------------------------------------------------------ log-probs
    def sequence_logprobs(
        self,
        prompt_inputs: PromptInputs,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        temperature: float = 1.0,
        hf_model: nn.Module | None = None,
    ) -> torch.Tensor:
        """Per-token log-probs ``[N, L]`` (float32) of the completion tokens, computed in chunks over the vocabulary,
        under ``hf_model`` (default: the policy, or the reference inside :meth:`reference`). It is the policy's
        forward, so that FSDP gathers the sharded embeddings and output head around it."""
        return self(prompt_inputs, completion_ids, completion_mask, temperature, hf_model)

    def sequence_logprobs_and_entropy(
        self,
        prompt_inputs: PromptInputs,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sequence_logprobs` and the entropy ``[N, L]`` (float32, detached) of the policy's tempered
        next-token distribution at each completion position, from the same chunks of logits (no second pass)."""
        return self(prompt_inputs, completion_ids, completion_mask, temperature, with_entropy=True)

    def fused_grpo_loss(
        self,
        loss: FusedLinearGRPOLoss,
        prompt_inputs: PromptInputs,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> LossOutput:
        """The GRPO loss of the completions computed by liger-kernel's fused linear GRPO loss from the language
        model's last hidden states and the output head (no log-probs over the vocabulary are kept; see
        :mod:`app.algorithms.fused_linear`). It runs inside the policy's forward, so that FSDP gathers the head."""
        head = functools.partial(
            loss, advantages=advantages, mask=loss_mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs
        )
        return LossOutput(*self(prompt_inputs, completion_ids, completion_mask, temperature, fused_loss=head))

    def forward(
        self,
        prompt_inputs: PromptInputs,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        temperature: float = 1.0,
        hf_model: nn.Module | None = None,
        fused_loss: Callable[..., LossOutput] | None = None,
        with_entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """See :meth:`sequence_logprobs`; with ``with_entropy``, ``(logprobs, entropy)``
        (:meth:`sequence_logprobs_and_entropy`); with ``fused_loss`` (see :meth:`fused_grpo_loss`), the fields of its
        :class:`~app.algorithms.LossOutput` as a tuple (tensors FSDP's backward hooks can see)."""
        hf_model = hf_model or (self.frozen_reference if self._use_reference else self.hf_model)
        hidden = self._completion_hidden_states(hf_model, prompt_inputs, completion_ids, completion_mask)  # [N, L, H]
        if fused_loss is not None:
            out = fused_loss(hidden, hf_model.lm_head, completion_ids, temperature=temperature)
            return tuple(getattr(out, f.name) for f in dataclasses.fields(out))
        chunked = chunked_token_logprobs_and_entropy if with_entropy else chunked_token_logprobs
        out = chunked(
            hidden, hf_model.lm_head, completion_ids, chunk_size=self.logprob_chunk_size, temperature=temperature
        )
        if with_entropy:
            return tuple(_not_a_view(t) for t in out)
        return _not_a_view(out)

    def _completion_hidden_states(
        self,
        hf_model: nn.Module,
        prompt_inputs: PromptInputs,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
    ) -> torch.Tensor:
        """``[N, L, H]`` last hidden states of ``hf_model``'s backbone that predict the completion tokens: with
        ``shared_prefix`` and repeated prompts, each prompt's layers once and the completions attending to its keys
        and values (:func:`~app.models.shared_prefix.prefix_shared_hidden_states`; not under gradient checkpointing,
        which turns the cache off, nor when packing), else one forward over each row's prompt and completion."""
        inner = hf_model.model
        packed = packs(hf_model, self.padding_free)
        if self.shared_prefix and not packed and not getattr(hf_model, "is_gradient_checkpointing", False):
            hidden = prefix_shared_hidden_states(inner, prompt_inputs, completion_ids, completion_mask)
            if hidden is not None:
                return hidden
        prompt = prompt_inputs.tensors
        inputs = dict(prompt)
        inputs["input_ids"] = torch.cat([prompt["input_ids"], completion_ids], dim=1)  # [N, P+L]
        inputs["attention_mask"] = torch.cat([prompt["attention_mask"], completion_mask], dim=1)
        if "mm_token_type_ids" in inputs:
            inputs["mm_token_type_ids"] = torch.cat(
                [prompt["mm_token_type_ids"], torch.zeros_like(completion_ids)], dim=1
            )
        shared = shared_prompt_features(inner, prompt_inputs, completion_mask) if self.shared_prefix else None
        if shared is not None:  # the vision tower and the positions once per distinct prompt, not once per row
            for kind in VISUAL_INPUTS:
                inputs.pop(kind.patches, None)
            inputs.update(shared)
        if packed:  # the rows' real tokens in one row: no layer computes on padding
            hidden = packed_hidden_states(inner, inputs, inputs.pop("position_ids", None))  # [N, P+L, H]
        else:
            hidden = inner(**inputs, use_cache=False).last_hidden_state  # [N, P+L, H]
        return hidden[:, prompt["input_ids"].shape[1] - 1 : -1]  # [N, L, H] states that predict the completion tokens

    @torch.no_grad()
    def reference_logprobs(self, prompt_inputs, completion_ids, completion_mask, temperature: float = 1.0):
        """Log-probs ``[N, L]`` under the reference policy."""
        with self.reference():
            return self.sequence_logprobs(prompt_inputs, completion_ids, completion_mask, temperature)

    # --------------------------------------------------------------------------------------------------- export
    def export(self, output_dir: str | Path) -> Path:
        """Write the policy as a Hugging Face folder (LoRA merged) plus, with LoRA, the adapter in PEFT format."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        if self.uses_lora:
            self.model.save_pretrained(output_dir / "adapter")
            merged = copy.deepcopy(self.model).merge_and_unload()
        else:
            merged = self.hf_model
        merged.save_pretrained(output_dir)
        self.processor.save_pretrained(output_dir)
        return output_dir

    # ---------------------------------------------------------------------------------------------------- utils
    @property
    def hf_model(self) -> nn.Module:
        """The transformers model (:attr:`base_network`)."""
        return self.base_network

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def parameter_groups(self, learning_rate: float) -> list[dict]:
        """The trainable parameters as torch optimizer param groups: one at ``learning_rate``, or, with
        ``vision_learning_rate``, the vision tower's (named ``vision``) at that rate after the rest (``policy``). An
        empty group is left out (a warning says when ``vision_learning_rate`` then applies to nothing)."""
        trainable = self.trainable_parameters()
        if self.vision_learning_rate is None:
            return [{"params": trainable, "lr": learning_rate}]
        vision = {id(p) for p in self.vision_parameters()}
        groups = [
            {"params": [p for p in trainable if id(p) not in vision], "lr": learning_rate, "name": "policy"},
            {"params": [p for p in trainable if id(p) in vision], "lr": self.vision_learning_rate, "name": "vision"},
        ]
        if not groups[1]["params"]:
            log.warning(
                "vision_learning_rate is set but nothing in the vision tower trains (set LoRA targets in it, or "
                "freeze_vision=False for full fine-tuning)"
            )
        return [group for group in groups if group["params"]]

    def vision_parameters(self) -> list[nn.Parameter]:
        return list(_vision_tower(self.hf_model).parameters())

    def sharding_plan(self) -> ShardingPlan:
        """FSDP units: each decoder layer and the vision tower (``generate`` calls it outside the language model's
        forward) of the policy and of its frozen reference; the root is the policy, whose forward computes the
        log-probs and which ``generate`` runs under (the embeddings and the tied output head stay in the root)."""
        networks = [self.hf_model] + ([self.frozen_reference] if self.frozen_reference is not None else [])
        units = []
        for network in networks:
            units += repeated_blocks(network, ("DecoderLayer",))
            units.append(_vision_tower(network))
        return ShardingPlan(units=units, roots=[self])


def _video_kwargs(videos: Sequence[Video]) -> dict:
    """The processor's video arguments for ``videos`` (in row order): their frames as they are, metadata saying frame
    ``i`` is at ``i / fps`` seconds, and ``cap_pixels_per_frame``: each frame's pixels bounded by its share of the
    processor's per-clip token budget (``max_video_tokens``) as ``qwen-vl-utils`` bounds them, the behaviour that
    transformers makes the default in v5.22 (it changes nothing for clips within a few hundred frames)."""
    metadata = [
        VideoMetadata(total_num_frames=v.num_frames, fps=v.fps, frames_indices=list(range(v.num_frames)))
        for v in videos
    ]
    frames = [v.frames for v in videos]
    return {"videos": frames, "video_metadata": metadata, "do_sample_frames": False, "cap_pixels_per_frame": True}


def _not_a_view(tensor: torch.Tensor) -> torch.Tensor:
    """FSDP's hooks need outputs that are not views."""
    return tensor.clone() if tensor._base is not None else tensor


def _vision_tower(hf_model: nn.Module) -> nn.Module:
    inner = getattr(hf_model, "model", hf_model)
    for name in ("visual", "vision_tower", "vision_model"):
        if hasattr(inner, name):
            return getattr(inner, name)
    raise ValueError(f"cannot find the vision tower of {type(hf_model).__name__}")


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
