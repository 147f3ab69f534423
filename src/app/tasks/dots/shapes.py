"""Coloured shapes at named positions: text-to-image prompts with their target image, for the tiny flow models.

Each sample is one prompt "a <colour> <shape> on the <position>" (colours red / green / blue / yellow, shapes circle /
square, positions left / right / top / bottom) and, as ``images[0]``, the target picture rendered with PIL: the shape
in the palette colour of :mod:`app.cv` on a light grey background, centred in the named half with a small jitter.
Flow-matching pretraining (:class:`app.modules.FlowMatchingModule`) learns from the pictures; flow-GRPO only reads the
prompts and :class:`app.rewards.color_region.ColorRegionReward` scores what the model draws against ``meta``.

>>> sample = ShapePromptDataset(num_samples=4, seed=0)[0]
>>> sample.task, sample.images[0].size, sorted(sample.meta)
('shape_prompts', (64, 64), ['color', 'position', 'shape'])
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw

from app.cv import BACKGROUND, PALETTE
from app.tasks.base import SeededDataset
from app.types import VisualSample

TASK = "shape_prompts"
COLORS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square")
POSITIONS = ("left", "right", "top", "bottom")


def shape_prompt(color: str, shape: str, position: str) -> str:
    return f"a {color} {shape} on the {position}"


def render_shape(color: str, shape: str, position: str, image_size: int = 64, rng: random.Random | None = None):
    """The target picture: the shape (radius ``image_size / 7``) centred in the named half, jittered by ``rng``."""
    if color not in COLORS or shape not in SHAPES or position not in POSITIONS:
        raise ValueError(f"unknown prompt parts {(color, shape, position)}; known {COLORS}, {SHAPES}, {POSITIONS}")
    radius = max(2, round(image_size / 7))
    jitter = max(0, image_size // 10)
    rng = rng or random.Random(0)
    along, across = image_size / 4, image_size / 2  # centre of the named half, on the split axis and across it
    a = along + rng.randint(-jitter, jitter) if jitter else along
    b = across + rng.randint(-2 * jitter, 2 * jitter) if jitter else across
    if position in ("right", "bottom"):
        a = image_size - a
    x, y = (a, b) if position in ("left", "right") else (b, a)
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    box = (x - radius, y - radius, x + radius, y + radius)
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=PALETTE[color])
    return image


class ShapePromptDataset(SeededDataset):
    """``num_samples`` prompts (each of the 32 combinations equally often, in an order drawn from ``seed``).

    Args:
        num_samples: data set size.
        seed: seed of the order and the jitter; sample ``i`` is rebuilt from ``(seed, i)``.
        image_size: side of the square target image.
        labeled: keep the target image in ``images``; False leaves it out (prompt-only, as flow-GRPO needs).
    """

    stream = None  # per-index seeds f"{seed}:{index}", as before the shared base class

    def __init__(self, num_samples: int, seed: int = 0, image_size: int = 64, labeled: bool = True):
        if num_samples < 0 or image_size < 8:
            raise ValueError(f"need num_samples >= 0 and image_size >= 8, got {num_samples}, {image_size}")
        super().__init__(num_samples, seed, image_size)
        self.labeled = labeled
        combos = [(c, s, p) for c in COLORS for s in SHAPES for p in POSITIONS]
        self._combos = combos

    def sample(self, index: int) -> VisualSample:
        block, offset = divmod(index, len(self._combos))
        order = list(range(len(self._combos)))
        random.Random(f"{self.seed}:{block}").shuffle(order)
        color, shape, position = self._combos[order[offset]]
        images = [render_shape(color, shape, position, self.image_size, self.rng(index))] if self.labeled else []
        return VisualSample(
            images=images,
            question=shape_prompt(color, shape, position),
            task=TASK,
            answer=None,
            meta={"color": color, "shape": shape, "position": position},
        )
