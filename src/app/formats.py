"""The response formats every layer shares, spelled once: what the prompts ask for, what SFT targets and data generators
write, what the tokenizer keeps as tokens and what the rewards parse.

- Reasoning: ``<think>reasoning</think><answer>answer</answer>`` (Reason-RFT / DeepSeek-R1); :data:`REASONING_TAGS`,
  :data:`REASONING_INSTRUCTION` (appended to a question), :func:`format_response` (an SFT target).
- Summary / caption: Reason-RFT's format variant, ``<summary>..</summary><caption>..</caption>`` before the reasoning
  (:data:`CAPTION_TAGS`).
- Triplet (CoRe / TriSR): three images, one comparison per pair of images, with per-image estimates and per-pair
  judgments in the reasoning (:data:`PAIRS`, :data:`TRIPLET_RESPONSE_INSTRUCTION`, :func:`format_triplet_response`;
  :mod:`app.rewards.triplet_parsing` reads it back)::

      <think>
      Image 1: 4
      Image 2: 7
      Image 3: 2
      Compare 1-2: 2
      Compare 1-3: 1
      Compare 2-3: 2
      </think>
      <answer>1-2: 2; 1-3: 1; 2-3: 2</answer>

Tag names are plain words; :func:`open_tag` and :func:`close_tag` spell the markers.

>>> format_response("2 + 2 = 4", "4")
'<think>2 + 2 = 4</think><answer>4</answer>'
"""

from __future__ import annotations

from collections.abc import Sequence

THINK = "think"
ANSWER = "answer"
SUMMARY = "summary"
CAPTION = "caption"

REASONING_TAGS: tuple[str, str] = (THINK, ANSWER)
"""Reason-RFT / DeepSeek-R1 form: reasoning, then the answer."""

CAPTION_TAGS: tuple[str, str, str, str] = (SUMMARY, CAPTION, THINK, ANSWER)
"""Reason-RFT's format variant with a summary of the question and a caption of the image before the reasoning."""


def open_tag(tag: str) -> str:
    """``<tag>``."""
    return f"<{tag}>"


def close_tag(tag: str) -> str:
    """``</tag>``."""
    return f"</{tag}>"


REASONING_TOKENS: list[str] = [open_tag(THINK), close_tag(THINK), open_tag(ANSWER), close_tag(ANSWER)]
"""The reasoning markers as tokens (the embedded tokenizer adds them, as Qwen's tokenizers have them)."""

REASONING_INSTRUCTION = (
    f" Output the thinking process in {open_tag(THINK)} {close_tag(THINK)} and the final answer in"
    f" {open_tag(ANSWER)} {close_tag(ANSWER)} tags."
)
"""Appended to a question: asks for the :data:`REASONING_TAGS` form."""


def format_response(reasoning: str, answer: str, tags: Sequence[str] = REASONING_TAGS) -> str:
    """A response in the ``tags`` form (an SFT target): ``reasoning`` in the ``think`` block (the first block when there
    is none), ``answer`` in the last block, any other block empty.
    """
    tags = tuple(tags)
    if len(tags) < 2:
        raise ValueError(f"tags must name a reasoning block and an answer block, got {tags}")
    contents = dict.fromkeys(tags, "")
    contents[THINK if THINK in tags[:-1] else tags[0]] = reasoning
    contents[tags[-1]] = answer
    return "".join(f"{open_tag(tag)}{contents[tag]}{close_tag(tag)}" for tag in tags)


# ------------------------------------------------------------------------------------------------- triplet responses
PAIRS: tuple[str, str, str] = ("1-2", "1-3", "2-3")
"""The three image pairs of a triplet, as the keys of judgments, answers and ``meta["pair_answers"]``."""

TRIPLET_RESPONSE_INSTRUCTION = (
    f" Think step by step inside {open_tag(THINK)} {close_tag(THINK)}. In your thinking, first write one line per image"
    " with your estimate of the quantity, as 'Image 1: <number>', 'Image 2: <number>' and 'Image 3: <number>', then"
    " one line per pair with your judgment, as 'Compare 1-2: <answer>', 'Compare 1-3: <answer>' and"
    f" 'Compare 2-3: <answer>'. Then give the final answers inside {open_tag(ANSWER)} {close_tag(ANSWER)} as"
    " '1-2: <answer>; 1-3: <answer>; 2-3: <answer>'."
)
"""Appended to a triplet question (after the question says what an ``<answer>`` is); asks for the triplet format."""


def format_triplet_response(
    attributes: tuple[float, float, float] | list[float], judgments: dict[str, str], answers: dict[str, str]
) -> tuple[str, str]:
    """``(reasoning, answer)`` texts in the triplet format: the ``<think>`` content and the ``<answer>`` content.

    Used by data generators for SFT targets and ``sample.answer``;
    :func:`app.rewards.triplet_parsing.parse_triplet_response` reads them back.

    >>> reasoning, answer = format_triplet_response([4, 7, 2], {"1-2": "2", "1-3": "1", "2-3": "2"},
    ...                                             {"1-2": "2", "1-3": "1", "2-3": "2"})
    >>> answer
    '1-2: 2; 1-3: 1; 2-3: 2'
    >>> reasoning.splitlines()[1:3], reasoning.splitlines()[-1]
    (['Image 1: 4', 'Image 2: 7'], 'Compare 2-3: 2')
    """
    lines = [f"Image {k}: {_number_text(v)}" for k, v in enumerate(attributes, start=1)]
    lines += [f"Compare {pair}: {judgments[pair]}" for pair in PAIRS]
    reasoning = "\n" + "\n".join(lines) + "\n"
    return reasoning, "; ".join(f"{pair}: {answers[pair]}" for pair in PAIRS)


def _number_text(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)
