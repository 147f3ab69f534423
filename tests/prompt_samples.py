"""Prompts for the tests, as a data module's batches hold them: a plain helper module, not a test file (pytest collects
nothing here). Test files import it as ``from prompt_samples import ...``: ``tests/`` is on ``sys.path`` (pytest puts
the folder of ``tests/conftest.py`` there, as for ``tolerances.py``)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader

from app.types import VisualSample


def prompts(
    n: int = 2,
    question: str = "a red square, number {i}",
    tasks: Sequence[str] = ("red",),
    answers: Sequence[str | None] = (None,),
    image_size: int | None = None,
    meta: dict[str, Any] | None = None,
) -> list[VisualSample]:
    """``n`` prompts; prompt ``i`` has ``question`` with ``{i}`` filled in and takes its task and answer from ``tasks``
    and ``answers`` in turn. Without ``image_size`` a prompt has no image (a text-to-image prompt); with it, one square
    image of that size and colour (40 i, 200, 30), so that each prompt's image is told apart. ``meta``: copied into
    every prompt."""
    return [
        VisualSample(
            images=[] if image_size is None else [Image.new("RGB", (image_size, image_size), (40 * i, 200, 30))],
            question=question.format(i=i),
            task=tasks[i % len(tasks)],
            answer=answers[i % len(answers)],
            meta=copy.deepcopy(meta or {}),
        )
        for i in range(n)
    ]


def prompt_loader(n: int = 4, batch_size: int = 2, **kwargs: Any) -> DataLoader:
    """:func:`prompts` (``n`` and ``kwargs``) in batches of ``batch_size`` lists, in order. The loader has its own
    generator, as the app's data modules do: iterating it draws nothing from the global one."""
    return DataLoader(
        prompts(n, **kwargs), batch_size=batch_size, collate_fn=list, generator=torch.Generator().manual_seed(0)
    )
