"""Reason-RFT structure perception (Reason-RFT Sec. 4 and Appendix A.2, docs/algorithms.md#papers): procedural geometry
problems with a textbook figure and a numeric or multiple-choice answer.

The paper trains on GeoMath (Geo170K / GeoQA and Math360K problems) and tests domain shift on Geometry3K; both mix
numeric and multiple-choice answers (Geometry3K: 400 of each). Here every problem comes from a program
(:mod:`app.tasks.reason_rft.structure_families`): its givens are written on the figure, the asked quantity is computed
exactly, and the figure is drawn to scale (:mod:`app.tasks.reason_rft.geometry`). Answers are integers or decimals with
at most two places; half the problems (drawn per sample) are multiple choice with options A-D, the correct one at a
uniformly drawn position and three distinct plausible distractors (the family's common mistakes, then near misses).
Multiple-choice answers are the letter, scored by :class:`~app.rewards.AccuracyReward`; numeric answers the number,
scored by :class:`~app.rewards.NumericToleranceReward` (or exact match).

Splits, following the paper's in-domain / domain-shift idea (different source data set, so new problem types and a new
figure and question style at once):

- ``train``, ``test_in_domain``, ``cot_sft``: the GeoQA-like presentation. Families :data:`IN_DOMAIN_FAMILIES`; the
  ``textbook`` figure style (bold lines, marks and values in blue); the question names the asked quantity ("Find
  ∠ACB.") and, in half of the samples, also states the givens in words.
- ``test_domain_shift``: the Geometry3K-like presentation. Families: all of :data:`FAMILIES`, so a third of it
  (:data:`DOMAIN_SHIFT_FAMILIES`: similar triangles, tangent and radius, parallelogram) is never seen in training and
  the rest is seen in a new form; ``meta["family"]`` allows the breakdown. The ``monochrome`` style (thin grey lines,
  black marks); givens only on the figure; the asked angle or length is marked ``x`` on it and the question is "Find x."
- ``cot_sft`` samples carry ``reasoning``, the program's derivation ("The angles of a triangle sum to 180°, so ...");
  the paper's CoT activation set is a separate in-domain subset, so the other splits have none.

Sample ``i`` of a split depends only on ``(seed, split, i)``; splits draw from separate streams.

>>> sample = next(make_samples(1, seed=0, split="cot_sft", image_size=128))
>>> sample.task, sample.images[0].size, sample.meta["answer_type"] in ("numeric", "choice"), bool(sample.reasoning)
('rrft_structure', (128, 128), True, True)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from app.tasks.reason_rft.geometry import STYLES, render_figure
from app.tasks.reason_rft.split_dataset import SplitDataset
from app.tasks.reason_rft.structure_families import FAMILIES, Program
from app.tasks.reason_rft.structure_families import num as number_text
from app.types import VisualSample

TASK = "rrft_structure"
SPLITS = ("train", "test_in_domain", "test_domain_shift", "cot_sft")
IN_DOMAIN_FAMILIES = (
    "triangle_angle_sum",
    "isosceles_triangle",
    "right_triangle",
    "parallel_lines",
    "inscribed_angle",
    "rectangle",
)
DOMAIN_SHIFT_FAMILIES = ("similar_triangles", "tangent_radius", "parallelogram")
"""Families that only the domain-shift split uses."""
CHOICE_PROBABILITY = 0.5
"""Fraction of multiple-choice problems in every split (Geometry3K's DS set: 400 of 800)."""
LETTERS = "ABCD"
UNIT_WORDS = {"degrees": "in degrees", "cm": "in cm", "cm^2": "in cm²"}
MIN_IMAGE_SIZE = 64


@dataclass(frozen=True)
class StructureProblem:
    """A presented problem, everything but the image: the program, its split's presentation, and the target."""

    program: Program
    family: str
    split: str
    style: str
    answer_type: str
    question: str
    answer: str
    options: list[str]
    givens_in_text: bool
    reasoning: str | None


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for {TASK}; known splits: {', '.join(SPLITS)}")


def split_families(split: str) -> tuple[str, ...]:
    """The families a split draws from (uniformly)."""
    _check_split(split)
    return tuple(FAMILIES) if split == "test_domain_shift" else IN_DOMAIN_FAMILIES


def _near_misses(answer: float, unit: str) -> list[float]:
    step = 5 if unit == "degrees" else max(1, round(0.15 * answer))
    return [answer + k * step for k in (1, -1, 2, -2, 3, -3, 4, -4)]


def choose_options(rng: random.Random, program: Program) -> tuple[list[str], int]:
    """Four distinct options (written as in the problem) and the index of the correct one (uniform over 0-3).

    Distractors are the program's common mistakes in random order, then near misses (answer +- a multiple of a step),
    those that are integers exactly when the answer is one first, so that a lone decimal gives nothing away. The number
    of distractors below the answer is drawn uniformly from 0-3 too (mistakes such as 180 - x and x / 2 fall on both
    sides, which would otherwise make the middle value a good guess). Skipped: values that are not positive, angles of
    180° or more, values not written like an answer (an integer or at most two decimals: a rounded irrational would be
    an obvious wrong option) and repeats.
    """
    answer, correct = float(program.answer), number_text(program.answer)
    mistakes = list(program.distractors)
    rng.shuffle(mistakes)
    candidates = mistakes + _near_misses(answer, program.unit)
    candidates.sort(key=lambda v: float(v).is_integer() != answer.is_integer())  # stable: keeps the order within
    pool: list[tuple[float, str]] = []
    for value in candidates:
        text = number_text(value)
        plausible = value > 0 and not (program.unit == "degrees" and value >= 180)
        if plausible and abs(value * 100 - round(value * 100)) < 1e-6 and text not in (correct, *(t for _, t in pool)):
            pool.append((value, text))
    below = rng.randrange(4)
    chosen = [t for v, t in pool if v < answer][:below] + [t for v, t in pool if v > answer][: 3 - below]
    chosen += [t for _, t in pool if t not in chosen][: 3 - len(chosen)]
    rng.shuffle(chosen)
    position = rng.randrange(4)
    return chosen[:position] + [correct] + chosen[position:], position


def _question(program: Program, shifted: bool, givens_in_text: bool) -> str:
    if shifted:
        asked = "x" if program.asked_on_figure else program.asked_text
        return " ".join(part for part in (f"Find {asked}.", program.note) if part)
    setting = program.setting + (f", {program.given_text}" if givens_in_text else "")
    return f"As shown in the figure, {setting}. Find {program.asked_text}."


def build_problem(seed: int, split: str, index: int) -> StructureProblem:
    """Problem ``index`` of ``split`` for ``seed``, without its image (cheap: used for statistics and tests)."""
    families = split_families(split)
    rng = random.Random(f"{TASK}:{seed}:{split}:{index}")
    family = rng.choice(families)
    shifted = split == "test_domain_shift"
    program = FAMILIES[family](rng, shifted)
    givens_in_text = not shifted and rng.random() < 0.5
    question = _question(program, shifted, givens_in_text)
    answer = number_text(program.answer)
    reasoning = program.reasoning
    if rng.random() < CHOICE_PROBABILITY:
        answer_type = "choice"
        options, position = choose_options(rng, program)
        listed = " ".join(f"{letter}. {option}" for letter, option in zip(LETTERS, options, strict=True))
        question += f" Choices: {listed}. Answer with the letter of the correct choice."
        answer = LETTERS[position]
        reasoning += f" This is choice {answer}."
    else:
        answer_type, options = "numeric", []
        question += f" Answer with a number {UNIT_WORDS[program.unit]}."
    style = "monochrome" if shifted else "textbook"
    return StructureProblem(
        program=program,
        family=family,
        split=split,
        style=style,
        answer_type=answer_type,
        question=question,
        answer=answer,
        options=options,
        givens_in_text=givens_in_text,
        reasoning=reasoning if split == "cot_sft" else None,
    )


def render_problem(problem: StructureProblem, image_size: int = 256, labeled: bool = True) -> VisualSample:
    """Draw a problem's figure and package it as a sample (``answer`` and ``reasoning`` None when not ``labeled``).

    ``meta``: family, split, style, answer_type, options (``[]`` for numeric), givens, asked (quantity name), solution
    (the asked quantity as a number string, also for choices; labeled samples only), unit, relations, givens_in_text,
    points (labelled points in pixels, x right and y down) and texts (every text drawn: text, kind, ref, box in
    pixels).
    """
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be at least {MIN_IMAGE_SIZE} for readable figure text, got {image_size}")
    program = problem.program
    drawn = render_figure(program.figure, STYLES[problem.style], image_size)
    labeled_points = program.figure.labeled if program.figure.labeled is not None else list(program.figure.points)
    meta = {
        "family": problem.family,
        "split": problem.split,
        "style": problem.style,
        "answer_type": problem.answer_type,
        "options": list(problem.options),
        "givens": {k: int(v) if float(v).is_integer() else float(v) for k, v in program.givens.items()},
        "asked": program.asked,
        "unit": program.unit,
        "relations": list(program.relations),
        "givens_in_text": problem.givens_in_text,
        "points": {name: [float(drawn.points[name][0]), float(drawn.points[name][1])] for name in labeled_points},
        "texts": [
            {"text": t.text, "kind": t.kind, "ref": t.ref, "box": [float(v) for v in t.box]} for t in drawn.texts
        ],
    }
    answer, reasoning = (problem.answer, problem.reasoning) if labeled else (None, None)
    if labeled:  # the asked quantity, under a key label-free shards drop (app.data.shards.LABEL_META_KEYS)
        meta["solution"] = number_text(program.answer)
    return VisualSample([drawn.image], problem.question, TASK, answer, reasoning, meta)


def make_samples(num: int, seed: int, split: str, image_size: int = 256) -> Iterator[VisualSample]:
    """``num`` labelled samples of ``split`` (see the module docstring), in index order."""
    _check_split(split)
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    for index in range(num):
        yield render_problem(build_problem(seed, split, index), image_size)


class StructurePerceptionDataset(SplitDataset):
    """``num_samples`` structure perception samples of one split, rendered lazily; task ``"rrft_structure"``.

    Args:
        num_samples: number of samples.
        seed: seed of the data set.
        image_size: side of the square images in pixels (at least 64).
        split: one of :data:`SPLITS`; only ``cot_sft`` samples carry ``reasoning``.
        labeled: when False, ``answer`` and ``reasoning`` are None; images and ``meta`` are unchanged.
    """

    def __init__(
        self, num_samples: int, seed: int, image_size: int = 256, split: str = "train", labeled: bool = True
    ) -> None:
        _check_split(split)
        if image_size < MIN_IMAGE_SIZE:
            raise ValueError(f"image_size must be at least {MIN_IMAGE_SIZE} for readable figure text, got {image_size}")
        super().__init__(num_samples, seed, image_size, split, labeled)

    splits = SPLITS

    def sample(self, index: int) -> VisualSample:
        return render_problem(build_problem(self.seed, self.split, index), self.image_size, self.labeled)
