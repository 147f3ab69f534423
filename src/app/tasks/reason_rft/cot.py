"""Chains of thought for Reason-RFT stage 1 (CoT-SFT, Reason-RFT Section 3.1 and Appendix D, docs/algorithms.md#papers),
written from the scene program instead of by GPT-4o, so they are correct by construction.

The paper drafts its CoT with a model and filters it by length and consistency (counting about 70 tokens,
transformation about 400). Here the text walks the same steps a careful solver would: list what the image shows,
apply each operation with its arithmetic (counting), or compare each numbered object between the two images and
name the function that explains a difference (transformation), then state the answer. Every number it mentions comes
from the executed program, so the "inconsistency" filter of Appendix D has nothing to remove.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.tasks.reason_rft.programs import CountingProgram, ProgramResult, Step
from app.tasks.reason_rft.render import Camera
from app.tasks.reason_rft.scene import SceneObject


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _listing(phrases: Sequence[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _is_are(n: int) -> str:
    return "is" if n == 1 else "are"


def left_to_right(objects: Sequence[SceneObject], view: str = "front") -> list[int]:
    """Indices of ``objects`` ordered by where their centres appear in the image, left to right."""
    camera = Camera.view(view)
    return sorted(range(len(objects)), key=lambda i: camera.project((objects[i].x, objects[i].y, 0.0), 1)[0])


def counting_reasoning(objects: Sequence[SceneObject], program: CountingProgram, result: ProgramResult) -> str:
    """The chain of thought of a counting sample, e.g. "There are 7 objects: ... Subtracting the 2 large cubes
    leaves 7 - 2 = 5 objects. ... The answer is 5."."""
    order = left_to_right(objects)
    parts = [
        f"There {_is_are(len(objects))} {len(objects)} object{'s' if len(objects) != 1 else ''} in the image, from "
        f"left to right: {_listing([_article(objects[i].describe()) for i in order])}."
    ]
    before = result.initial
    for step in result.steps:
        op, n = step.operation, step.affected
        if op.kind == "subtract":
            what = op.target.phrase()
            if n == 0:
                parts.append(f"There are no {what} among them, so subtracting them leaves all {before}.")
            else:
                among = "the" if before == result.initial else "the remaining"
                what = _article(op.target.words(False)) if n == 1 else op.target.words()
                parts.append(
                    f"{n} of {among} {before} objects {_is_are(n)} {what}; "
                    f"subtracting {'it' if n == 1 else 'them'} leaves {before} - {n} = {step.total}."
                )
        else:
            parts.append(f"Adding {op.target.phrase(n)} gives {before} + {n} = {step.total} objects.")
        before = step.total
    if not program.query.items():
        where = "left" if program.operations[-1].kind == "subtract" else "in all"
        parts.append(f"So {result.answer} object{'s' if result.answer != 1 else ''} {_is_are(result.answer)} {where}.")
    else:
        what = program.query.phrase()
        scene, added = result.query_from_scene, result.query_from_added
        source = f"{scene} from the scene and {added} added" if added else f"{scene} from the scene"
        if program.operations[-1].kind == "subtract" and not added:
            source = f"{scene} of the {before} objects left"
        parts.append(f"The question asks about {what}: {source}, so there {_is_are(result.answer)} {result.answer}.")
    parts.append(f"The answer is {result.answer}.")
    return " ".join(parts)


_FUNCTION_WORDS = {
    "change_size": "size",
    "change_color": "color",
    "change_material": "material",
    "change_shape": "shape",
}


def transformation_reasoning(objects: Sequence[SceneObject], steps: Sequence[Step], final_view: str) -> str:
    """The chain of thought of a transformation sample: the initial objects (numbered left to right), a comparison of
    each with the final image, and the resulting steps. ``objects`` are the initial objects in their numbered order."""
    parts = [
        f"The first image shows the initial scene from the front with {len(objects)} objects, numbered from left to "
        f"right: " + "; ".join(f"obj_{i + 1} is {_article(o.describe())}" for i, o in enumerate(objects)) + "."
    ]
    if final_view == "front":
        parts.append("The second image shows the final scene from the same front view.")
    else:
        parts.append(
            f"The second image shows the final scene from the {final_view} side, so I match each object by its "
            "attributes and its place among the others, and read any movement in the first image's directions."
        )
    by_object = {step.index: step for step in steps}
    for i, obj in enumerate(objects):
        step = by_object.get(i)
        name = f"obj_{i + 1}"
        if step is None:
            parts.append(f"{name} ({obj.describe()}) looks the same and stays in place.")
        elif step.function == "change_position":
            direction = step.value.replace("_", " ")
            parts.append(f"{name} ({obj.describe()}) keeps its look but has moved to the {direction}: {step.text()}.")
        else:
            attribute = _FUNCTION_WORDS[step.function]
            old = getattr(obj, attribute)
            parts.append(
                f"{name} stays in place but its {attribute} changed from {old} to {step.value}: {step.text()}."
            )
    count = len(steps)
    parts.append(
        f"So {count} transformation{'s' if count != 1 else ''} turn{'s' if count == 1 else ''} the initial scene into "
        f"the final one: {', '.join(step.text() for step in steps)}."
    )
    return " ".join(parts)
