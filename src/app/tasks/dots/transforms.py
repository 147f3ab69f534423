"""A rendered spatial-transformation task for the function-sequence reward (Reason-RFT's visual transformation, cut down
to a CPU recipe).

Each sample has two images: an initial scene of ``num_objects`` shapes on a 3x3 grid of cells (one object per cell) and
the final scene after 1 to ``max_steps`` changes, each to a different object. An object has a shape (circle, square,
triangle), a colour (red, blue, green, yellow), a size (small, large) and a cell
(``"top left"`` ... ``"bottom right"``). Objects are named ``obj_1`` ... ``obj_n`` left to right in the initial image
(top to bottom within a column); the question says so. The answer lists the changes, ordered by object, in the syntax of
:func:`~app.rewards.parsing.parse_steps`, e.g. ``change_color(obj_1, red), change_position(obj_3, top left)``; a moved
object goes to a cell that no object holds in either scene, so every changed object differs in pixels.

Departure from the paper: its scenes (TRANCE) are 3D renders, which also change an object's material
(``change_material``); a flat 2D render cannot show material, so this task never uses that function.

>>> sample = TransformDataset(num_samples=2, seed=0)[0]
>>> sample.task, len(sample.images), sample.images[1].size
('dots_transform', 2, (64, 64))
"""

from __future__ import annotations

import dataclasses
import random

from PIL import Image, ImageDraw

from app.tasks.base import SeededDataset
from app.types import VisualSample

TASK = "dots_transform"
BACKGROUND = (230, 230, 230)
COLORS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (40, 170, 60), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square", "triangle")
SIZES = ("small", "large")
GRID = 3
CELLS = tuple(f"{row} {col}" for row in ("top", "middle", "bottom") for col in ("left", "center", "right"))
"""Cell names, row-major: cell ``r * GRID + c`` is row ``r``, column ``c``."""
FUNCTIONS = ("change_color", "change_size", "change_shape", "change_position")
"""The functions used here: Reason-RFT's list without ``change_material`` (invisible in 2D)."""
QUESTION = (
    "The first image is the initial scene, the second the final scene. Objects are numbered obj_1, obj_2, ... from left"
    " to right in the first image (top to bottom within a column). Which changes turn the first scene into the second?"
    " Answer as steps like change_color(obj_1, red), using change_color (red, blue, green, yellow), change_size (small,"
    " large), change_shape (circle, square, triangle) or change_position (a cell such as top left or middle center)."
)


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One object of a scene; ``cell`` indexes :data:`CELLS`."""

    shape: str
    color: str
    size: str
    cell: int

    def value(self, function: str) -> str:
        """The attribute a function changes, as it is written in a step."""
        return CELLS[self.cell] if function == "change_position" else getattr(self, function.removeprefix("change_"))


def render_scene(objects: list[SceneObject], image_size: int) -> Image.Image:
    """Draw each object centred in its cell; a large shape spans 80% of the cell, a small one 44%."""
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cell = image_size / GRID
    for obj in objects:
        row, col = divmod(obj.cell, GRID)
        cx, cy = round((col + 0.5) * cell), round((row + 0.5) * cell)
        h = round(cell * (0.4 if obj.size == "large" else 0.22))
        box, fill = (cx - h, cy - h, cx + h, cy + h), COLORS[obj.color]
        if obj.shape == "circle":
            draw.ellipse(box, fill=fill)
        elif obj.shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(cx, cy - h), (cx - h, cy + h), (cx + h, cy + h)], fill=fill)
    return image


def _change(rng: random.Random, obj: SceneObject, taken: set[int]) -> tuple[str, SceneObject]:
    """A random function and the object with that attribute set to a new value (a new cell avoids ``taken``)."""
    function = rng.choice(FUNCTIONS)
    if function == "change_position":
        cell = rng.choice([c for c in range(len(CELLS)) if c not in taken])
        taken.add(cell)
        return function, dataclasses.replace(obj, cell=cell)
    field = function.removeprefix("change_")
    choices = {"color": tuple(COLORS), "size": SIZES, "shape": SHAPES}[field]
    new = rng.choice([v for v in choices if v != getattr(obj, field)])
    return function, dataclasses.replace(obj, **{field: new})


class TransformDataset(SeededDataset):
    """``num_samples`` two-image transformation prompts; sample i depends only on ``(seed, i)``.

    Args:
        num_samples: number of samples.
        seed: seed of the data set.
        image_size: side of the square images in pixels (at least 30, so small and large differ).
        num_objects: objects per scene.
        max_steps: most changes per sample (at least 1, at most ``num_objects``); the count is drawn uniformly.
        labeled: when False, ``answer`` and ``reasoning`` are None; images and ``meta`` are unchanged.
    """

    stream = "transform"

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 64,
        num_objects: int = 3,
        max_steps: int = 2,
        labeled: bool = True,
    ) -> None:
        if not 1 <= max_steps <= num_objects or num_objects + max_steps > len(CELLS):
            raise ValueError(
                f"need 1 <= max_steps <= num_objects and num_objects + max_steps <= {len(CELLS)}, "
                f"got num_objects={num_objects}, max_steps={max_steps}"
            )
        if image_size < 30:
            raise ValueError(f"image_size must be >= 30, got {image_size}")
        super().__init__(num_samples, seed, image_size)
        self.num_objects, self.max_steps, self.labeled = num_objects, max_steps, labeled

    def sample(self, index: int) -> VisualSample:
        rng = self.rng(index)
        cells = sorted(rng.sample(range(len(CELLS)), self.num_objects), key=lambda c: (c % GRID, c // GRID))
        before = [SceneObject(rng.choice(SHAPES), rng.choice(tuple(COLORS)), rng.choice(SIZES), c) for c in cells]
        after, taken, steps = list(before), set(cells), []
        for i in sorted(rng.sample(range(self.num_objects), rng.randint(1, self.max_steps))):
            function, after[i] = _change(rng, before[i], taken)
            steps.append((i, function))
        answer = ", ".join(f"{f}(obj_{i + 1}, {after[i].value(f)})" for i, f in steps)
        reasoning = "; ".join(
            f"obj_{i + 1} {f.removeprefix('change_')} {before[i].value(f)} -> {after[i].value(f)}" for i, f in steps
        )
        meta = {
            "before": [dataclasses.asdict(o) for o in before],
            "after": [dataclasses.asdict(o) for o in after],
            "changed": [i for i, _ in steps],
            "image_size": self.image_size,
        }
        images = [render_scene(before, self.image_size), render_scene(after, self.image_size)]
        if not self.labeled:
            answer = reasoning = None
        return VisualSample(images, QUESTION, TASK, answer, reasoning, meta)
