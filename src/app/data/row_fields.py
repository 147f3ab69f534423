"""Where a data file's rows keep each part of a sample (:class:`RowFields`), and the named layouts (:data:`PRESETS`):
the four anchors' (TRL, verl, EasyR1, ms-swift), flow prompt files, and the four papers' (Reason-RFT, CoRe, OT-GRPO,
VBVR).

A paper layout also names what its rewards read from a row, checked when the row is read so that a row the reward
could not score is a bad row at load time: CoRe's triplets need three images and TriSR's ``pair_answers`` in ``meta``
(whose values TriSR checks when it scores); OT-GRPO's pairs need the twin and its relation (read by
:class:`~app.data.rows.RowReader`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RowFields:
    """Where a row keeps each part of a sample: column names, or dotted paths into nested columns.

    Attributes:
        question: the prompt: a string or chat messages.
        images: candidate image columns; the first one the row has is read.
        videos: candidate video columns (video file paths); the first one the row has is read. Empty: rows have no
            videos (a ``videos`` column then passes to ``meta``).
        answer: the label rewards compare with.
        reasoning: the chain of thought supervised fine-tuning learns.
        task: the task name (rewards and logs group by it).
        key: a unique id per row; a repeated one is a bad row. None: rows have no id.
        twin: a column holding the row's augmented twin (``question``, ``images``, ``relation``, optional
            ``answer``): the row becomes a pair ``(x, x')`` for consistency rewards. None: rows are single prompts.
        keep_placeholders: keep ``<image>`` placeholders in the question, where the VLM policy puts each image
            (False for generation prompts, whose images condition the generator and are not in the text).
        image_count: the number of images every row must hold; None: any (up to the reader's ``max_images``).
        required_meta: ``meta`` keys every row must hold (what the layout's rewards read).
    """

    question: str = "question"
    images: tuple[str, ...] = ("images", "image")
    videos: tuple[str, ...] = ()
    answer: str = "answer"
    reasoning: str = "reasoning"
    task: str = "task"
    key: str | None = None
    twin: str | None = None
    keep_placeholders: bool = True
    image_count: int | None = None
    required_meta: tuple[str, ...] = ()


PRESETS: dict[str, RowFields] = {
    "default": RowFields(videos=("videos",)),
    "trl": RowFields(question="prompt", answer="solution"),
    "verl": RowFields(
        question="prompt",
        images=("images",),
        videos=("videos",),
        answer="reward_model.ground_truth",
        task="data_source",
    ),
    "easyr1": RowFields(question="problem", images=("images",), videos=("videos",)),
    "swift": RowFields(question="messages", images=("images",), videos=("videos",), answer="solution"),
    "flow": RowFields(question="prompt", keep_placeholders=False),
    "reason_rft": RowFields(question="problem", images=("image",), answer="solution"),
    "core": RowFields(task="dimension", image_count=3, required_meta=("pair_answers",)),
    "ot_grpo": RowFields(twin="twin"),
    "vbvr": RowFields(question="prompt", images=("first_frame_path",), keep_placeholders=False),
}
"""Field layouts by name.

- ``trl``: a ``prompt`` (text or chat messages), ``image`` / ``images``, ``solution``.
- ``verl``: ``prompt`` chat messages with ``<image>`` / ``<video>``, ``images``, ``videos``,
  ``reward_model.ground_truth``, ``data_source`` as the task.
- ``easyr1``: ``problem``, ``answer``, ``images``, ``videos``.
- ``swift``: ``messages``, ``images``, ``videos``, ``solution``.
- ``flow``: a generation ``prompt`` with optional conditioning ``image`` / ``images`` (``negative_prompt`` and
  ``video`` pass to ``meta``).
- ``reason_rft``: Reason-RFT's released JSON (``problem``, ``image`` as a path, a list of paths or of
  ``{"path": ...}``, ``solution``).
- ``core``: a CoRe comparison triplet: ``question``, three ``images``, ``answer`` (the target response),
  ``dimension`` as the task, and TriSR's ground truth ``pair_answers`` / ``attributes`` / ``answer_type`` (to
  ``meta``; TriSR's reward reads them, :mod:`app.rewards.trisr_scores`).
- ``ot_grpo``: an OT-GRPO prompt pair: ``question``, ``images``, optional ``answer`` and ``answer_type``, and
  ``twin``: the augmented prompt (``question``, ``images``, ``relation`` ``identity`` / ``negation``, optional
  ``answer``).
- ``vbvr``: VBVR-Dataset's ``metadata.parquet`` (``prompt``, ``first_frame_path`` as the conditioning image, ``task``;
  ``final_frame_path``, ``ground_truth_video_path`` and ``metadata_json`` pass to ``meta``).
- ``default``: the package's own names (``question``, ``images``, ``videos``, ``answer``, ``reasoning``, ``task``).
"""
