"""VLM-as-a-judge: a frozen Qwen-VL model's probability of answering "Yes" to a question about each completion.

For each completion the judge sees one user turn, built with the checkpoint's chat template with the generation
prompt opened (``add_generation_prompt=True``): the image(s), then ``question`` filled in. One forward pass, no
sampling: the reward is ``p(yes) = softmax([logit(yes_token), logit(no_token)])[0]`` of the next-token logits at the
last position, in [0, 1]. The question follows VQAScore (Lin et al., 2024: 'Does this figure show "{text}"? Please
answer yes or no.'), which takes p(Yes) over the whole vocabulary; here the two answers are renormalised to each other,
so probability the judge puts on other tokens (punctuation, a lower-case "yes") counts for neither.

What is judged:

- an image or video rendering (a flow model's generation, read by :func:`app.cv.to_uint8_frames`): the image itself,
  or a video's last frame, against the generation prompt ``sample.question``;
- a text completion (a VLM policy's answer): the prompt's own images (``sample.images``, possibly none) with the
  question and the completion's head: its first ``max_completion_tokens`` tokens (of its first
  :data:`~app.rewards.parsing.MAX_PARSE_CHARS` characters), cut before the batch is padded, so one long completion
  does not lengthen every row of its batch.

The prompt and the completion are text, whatever they spell: a special token's string in them (``<|im_end|>``,
``<|image_pad|>``) is read as the characters it is (transformers' ``sanitize_control_tokens``), so it can neither end
the judge's turn nor claim an image. Rows go through the model in batches, left-padded. A completion that is neither
text nor a readable rendering (a 0 x 0 image, a wrong shape or dtype) scores 0, is counted in ``num_malformed`` and is
logged as a warning.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from app.rewards.learned._frozen import FrozenModelReward, read_frames, to_pil
from app.rewards.parsing import MAX_PARSE_CHARS
from app.types import VisualSample

IMAGE_QUESTION = 'Does this image show "{prompt}"? Answer {yes} or {no}.'
"""Default question for image and video completions."""
TEXT_QUESTION = "Question: {prompt}\nAnswer: {completion}\nIs the answer correct? Answer {yes} or {no}."
"""Default question for text completions."""
_FIELDS = frozenset({"prompt", "completion", "yes", "no"})
MAX_COMPLETION_TOKENS = 1024
"""Default tokens of a text completion the judge reads (its head)."""


@dataclass(frozen=True)
class JudgedRow:
    """One completion as the judge sees it: the question's template and its prompt, the text completion (None for a
    rendering) and the images shown before the question."""

    template: str
    prompt: str
    completion: str | None
    images: list


def head(tokenizer, text: str, max_tokens: int) -> str:
    """The prefix of ``text`` that ``tokenizer`` reads as its first ``max_tokens`` tokens (all of it when shorter),
    special tokens' strings read as text."""
    encoding = tokenizer(
        text,
        add_special_tokens=False,
        split_special_tokens=True,
        truncation=True,
        max_length=max_tokens,
        return_offsets_mapping=True,
    )
    offsets = encoding["offset_mapping"]
    return text if len(offsets) < max_tokens else text[: offsets[-1][1]]


def _fields(template: str) -> set[str]:
    """The placeholders of a ``str.format`` template; ``ValueError`` for a malformed one or an unknown field."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise ValueError(f"VLMJudgeReward: question {template!r} is not a format template: {error}") from error
    unknown = fields - _FIELDS
    if unknown:
        raise ValueError(
            f"VLMJudgeReward: question {template!r} has unknown placeholders {sorted(unknown)}; "
            f"allowed: {sorted(_FIELDS)}"
        )
    return fields


def _single_token(tokenizer, role: str, token: str) -> int:
    """The id of ``token``, which must encode to exactly one token; else a ``ValueError`` naming what it encodes to."""
    if not isinstance(token, str) or not token:
        raise ValueError(f"VLMJudgeReward: {role} must be a non-empty string, got {token!r}")
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise ValueError(
            f"VLMJudgeReward: {role} {token!r} encodes to {len(ids)} tokens {pieces}, not one; pick a word the "
            "judge's tokenizer holds as one token (Qwen's hold 'Yes' and 'No')"
        )
    return ids[0]


class VLMJudgeReward(FrozenModelReward):
    """A frozen Qwen-VL judge's ``p(yes)`` for each completion, in [0, 1] (see the module docstring); name
    ``"vlm_judge"``.

    ``yes_token`` and ``no_token`` are checked when the reward is built (only the tokenizer is loaded then; the model
    on the first score).

    Attributes:
        num_malformed: completions scored 0 because they were neither text nor a readable rendering (cumulative; each
            is logged as a warning).

    Args:
        model: the judge, loaded with :func:`app.tiny.models.load_vlm`: an embedded name (``"tiny-qwen2.5-vl"``,
            random weights: for tests), a Qwen-VL hub id such as ``"Qwen/Qwen2.5-VL-7B-Instruct"``, or a local folder.
        question: the question template, with ``{prompt}`` (the sample's question), ``{completion}`` (a text
            completion; required for text, refused for renderings), ``{yes}`` and ``{no}`` (the answer tokens); default:
            :data:`IMAGE_QUESTION` for renderings and :data:`TEXT_QUESTION` for text.
        yes_token: the answer whose probability is the reward; must be one token of the judge's tokenizer.
        no_token: the answer it is weighed against; must be one token of the judge's tokenizer.
        batch_size: most completions per forward pass of the judge.
        max_completion_tokens: tokens of a text completion the judge reads, its first ones (counted on their own);
            the rest is not judged and does not lengthen the batch.
        device: where the judge runs; default: the device of the first tensor completion, else the CPU.
        weight: weight in a :class:`~app.rewards.WeightedReward` total.
        name: log name; default ``"vlm_judge"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    value_range = (0.0, 1.0)

    def __init__(
        self,
        model: str = "tiny-qwen2.5-vl",
        question: str | None = None,
        yes_token: str = "Yes",
        no_token: str = "No",
        batch_size: int = 8,
        max_completion_tokens: int = MAX_COMPLETION_TOKENS,
        device: str | None = None,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(model, batch_size=batch_size, device=device, weight=weight, name=name, **kwargs)
        if isinstance(max_completion_tokens, bool) or not isinstance(max_completion_tokens, int):
            raise ValueError(f"VLMJudgeReward: max_completion_tokens must be an integer, got {max_completion_tokens!r}")
        if max_completion_tokens < 1:
            raise ValueError(f"VLMJudgeReward: max_completion_tokens must be >= 1, got {max_completion_tokens}")
        self.max_completion_tokens = max_completion_tokens
        if question is not None and not isinstance(question, str):
            raise ValueError(f"VLMJudgeReward: question must be a template string, got {type(question).__name__}")
        self.question_fields = _fields(question) if question is not None else None
        self.question = question
        if yes_token == no_token:
            raise ValueError(f"VLMJudgeReward: yes_token and no_token must differ, both are {yes_token!r}")
        self.yes_token, self.no_token = yes_token, no_token
        tokenizer = self._tokenizer()
        self.yes_id = _single_token(tokenizer, "yes_token", yes_token)
        self.no_id = _single_token(tokenizer, "no_token", no_token)

    def _tokenizer(self):
        from transformers import AutoTokenizer

        from app.tiny.models import resolve_pretrained

        return AutoTokenizer.from_pretrained(resolve_pretrained(self.model_name))

    def load(self):
        from app.tiny.models import load_vlm

        model, processor = load_vlm(self.model_name)
        processor.tokenizer.padding_side = "left"  # the last position is every row's next token
        return model, processor

    def _template(self, index: int, text: bool) -> str:
        """The question template of completion ``index``; ``ValueError`` when it cannot show that kind."""
        template = self.question or (TEXT_QUESTION if text else IMAGE_QUESTION)
        fields = self.question_fields if self.question is not None else _fields(template)
        if ("completion" in fields) != text:
            raise ValueError(
                f"VLMJudgeReward: completion {index} is a {'text' if text else 'rendering'}, and question "
                f"{template!r} must {'hold' if text else 'not hold'} a {{completion}} placeholder for one"
            )
        return template

    def _row(self, index: int, completion: Any, sample: VisualSample) -> JudgedRow | None:
        """What the judge sees of one completion, or None when it cannot be read (counted)."""
        if isinstance(completion, str):
            template = self._template(index, text=True)
            return JudgedRow(template, sample.question, completion[:MAX_PARSE_CHARS], list(sample.images))
        try:
            frame = read_frames(completion)[-1]  # a video is judged by its last frame
        except ValueError as error:
            self.malformed(index, str(error))
            return None
        return JudgedRow(self._template(index, text=False), sample.question, None, [to_pil(frame)])

    def _conversation(self, tokenizer, row: JudgedRow) -> list[dict]:
        """The one user turn of a row: its images, then its question holding the completion's head."""
        values = dict(prompt=row.prompt, yes=self.yes_token, no=self.no_token)
        if row.completion is not None:
            values["completion"] = head(tokenizer, row.completion, self.max_completion_tokens)
        question = row.template.format(**values)
        content = [{"type": "image", "image": image} for image in row.images] + [{"type": "text", "text": question}]
        return [{"role": "user", "content": content}]

    @torch.no_grad()
    def score(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> Tensor:
        rows = [self._row(i, c, s) for i, (c, s) in enumerate(zip(completions, samples, strict=True))]
        values = torch.full((len(rows),), self.value_range[0], dtype=torch.float32)
        readable = [i for i, row in enumerate(rows) if row is not None]
        if not readable:
            return values
        model, processor, device = self.frozen(completions)
        for start in range(0, len(readable), self.batch_size):
            chunk = readable[start : start + self.batch_size]
            values[chunk] = self._p_yes(model, processor, device, [rows[i] for i in chunk])
        return values

    def _p_yes(self, model, processor, device: torch.device, rows: list[JudgedRow]) -> Tensor:
        inputs = processor.apply_chat_template(
            [self._conversation(processor.tokenizer, row) for row in rows],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            sanitize_control_tokens=True,  # only the template writes special tokens; the prompt and completion are text
            processor_kwargs={"padding": True},
        )
        inputs = {key: value.to(device) for key, value in inputs.items()}
        logits = model(**inputs, logits_to_keep=1).logits[:, -1]  # [B, vocab]
        pair = logits[:, [self.yes_id, self.no_id]].float()
        return pair.softmax(dim=-1)[:, 0].cpu()
