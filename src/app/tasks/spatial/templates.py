"""Question templates of the spatial tasks and :func:`render_question` (OT-GRPO, Appendix D.2, "Linguistic
Variation"; docs/algorithms.md#papers).

Each boolean task has five paraphrased templates and two opposite relation phrases; ``{A}`` and ``{B}`` stand for the
first and second object of the question (``meta["refs"]`` order), ``{C}`` for the anchor of relative distance and
``{REL}`` for the phrase. Objects are named by category and marker (``"the chair with the red dot"``). Phrase 0 holds
when the first object has the smaller value of the task's metric (x of the 2D centre, nearest depth, distance to the
anchor), except for size, whose phrase 0 is "bigger than". The numeric tasks have five templates and no relation
phrase (the paper's Table 6 is not in the text at hand, so these wordings are this package's own).

Every field the question depends on is in ``meta``, so a transformed sample's question is re-rendered from its meta.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PHRASES: dict[str, tuple[str, ...]] = {
    "orientation": ("to the left of", "to the right of"),
    "depth": ("closer to the camera than", "farther from the camera than"),
    "size": ("bigger than", "smaller than"),
    "relative_distance": ("closer to", "farther from"),
    "counting": ("",),
    "distance": ("",),
}
"""Relation phrases per task; phrase 1 is the opposite of phrase 0 (numeric tasks have none)."""

TEMPLATES: dict[str, tuple[str, ...]] = {
    "orientation": (
        "Is {A} {REL} {B}?",
        "In the image, is {A} {REL} {B}?",
        "Is {A} located {REL} {B} in the picture?",
        "From the camera's point of view, is {A} {REL} {B}?",
        "Looking at the image, would you say that {A} appears {REL} {B}?",
    ),
    "depth": (
        "Is {A} {REL} {B}?",
        "In this scene, is {A} {REL} {B}?",
        "Is {A} positioned {REL} {B}?",
        "Judging by depth, is {A} {REL} {B}?",
        "Looking at the picture, would you say that {A} is {REL} {B}?",
    ),
    "size": (
        "Is {A} {REL} {B}?",
        "In terms of real-world 3D size, is {A} {REL} {B}?",
        "Is {A} physically {REL} {B}?",
        "Comparing actual volumes, is {A} {REL} {B}?",
        "In real life, would {A} be {REL} {B}?",
    ),
    "relative_distance": (
        "Is {A} {REL} {C} than {B} is?",
        "Measured in 3D, is {A} {REL} {C} than {B} is?",
        "Compared with {B}, is {A} {REL} {C}?",
        "In the scene, does {A} stand {REL} {C} than {B} does?",
        "In real-world distance, is {A} {REL} {C} than {B} is?",
    ),
    "counting": (
        "How many {PLURAL} are in the image?",
        "Count the {PLURAL} in this image. How many are there?",
        "How many {PLURAL} can you see?",
        "What is the number of {PLURAL} in the picture?",
        "How many {PLURAL} does this scene contain?",
    ),
    "distance": (
        "What is the distance between {A} and {B} in meters?",
        "How far apart are {A} and {B}, in meters?",
        "Estimate the 3D distance in meters between {A} and {B}.",
        "In meters, how far is {A} from {B}?",
        "What is the real-world distance from {A} to {B}, in meters?",
    ),
}
"""Five question templates per task."""

_IRREGULAR_PLURALS = {"person": "people", "shelves": "shelves", "glass": "glasses", "bus": "buses", "box": "boxes"}


def plural(category: str) -> str:
    """The plural of a category name (``"chair"`` -> ``"chairs"``, ``"person"`` -> ``"people"``)."""
    if category in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[category]
    if category.endswith(("s", "x", "ch", "sh")):
        return category + "es"
    if category.endswith("y") and category[-2:-1] not in "aeiou":
        return category[:-1] + "ies"
    return category + "s"


def describe(meta: Mapping[str, Any], obj: int) -> str:
    """How the question names object ``obj`` (an index into ``meta["objects"]``): category and marker."""
    category = meta["objects"][obj]["category"]
    marker = next((m for m in meta.get("markers", []) if m["object"] == obj), None)
    if marker is None:
        return f"the {category}"
    if marker["kind"] == "dot":
        return f"the {category} with the {marker['color']} dot"
    return f"the {category} in the {marker['color']} box"


def render_question(meta: Mapping[str, Any]) -> str:
    """The question of a spatial sample from its meta: ``spatial_task``, ``template_id``, ``phrase_id``, ``refs``,
    ``objects`` and ``markers``."""
    task = meta["spatial_task"]
    if task not in TEMPLATES:
        raise ValueError(f"unknown spatial task {task!r}; expected one of {tuple(TEMPLATES)}")
    template = TEMPLATES[task][meta["template_id"]]
    refs = meta["refs"]
    fields = {"REL": PHRASES[task][meta["phrase_id"]]}
    if task == "counting":
        fields["PLURAL"] = plural(meta["objects"][refs[0]]["category"])
    else:
        fields.update(A=describe(meta, refs[0]), B=describe(meta, refs[1]))
        if task == "relative_distance":
            fields["C"] = describe(meta, refs[2])
    question = template.format(**fields)
    return question[0].upper() + question[1:]
