"""A small byte-level BPE tokenizer in the Qwen layout, trained offline on synthetic text.

It has Qwen's special tokens (``<|im_start|>``, ``<|image_pad|>``, ...) and the reasoning tags ``<think>``,
``</think>``, ``<answer>``, ``</answer>`` as non-special added tokens, so they survive ``skip_special_tokens=True``
exactly as in the released Qwen-VL tokenizers. Byte-level BPE covers every string, so any model output can be encoded
and decoded.
"""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from app.formats import REASONING_TOKENS

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2-VL's chat layout without the default system prompt: images become <|vision_start|><|image_pad|><|vision_end|>,
# which the processor expands to one pad token per merged vision patch.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = (
    "the a an is are of in on to left right above below front behind near far larger smaller bigger closer "
    "red blue green yellow purple gray brown cyan orange white black dot dots circle square cube sphere cylinder "
    "object objects image images first second third how many what which where count total number distance meters "
    "yes no true false answer think question because so then than and or not there x y z color shape size "
    "material rubber metal position change step add subtract remove move rotate scale value option compare "
    "depth height width area angle triangle line point length relation same different more less equal"
).split()


def _synthetic_corpus(num_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        numbers = [str(rng.randint(0, 256)) for _ in range(rng.randint(0, 3))]
        tokens = words + numbers
        rng.shuffle(tokens)
        sentence = " ".join(tokens)
        lines.append(sentence.capitalize() + rng.choice(["?", ".", "!", ",", ":"]))
    return lines


def build_tokenizer(vocab_size: int = 1024, seed: int = 0) -> PreTrainedTokenizerFast:
    """Train the tokenizer; deterministic for a seed."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(REASONING_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_synthetic_corpus(4000, seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
        model_max_length=32768,
        padding_side="left",
    )
    tokenizer.add_tokens(REASONING_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
