"""Short words in a scene: text-to-image prompts with their target picture, for text rendering with tiny flow models.

Each sample is one prompt ``"<word>" on a <scene>`` (the word first: the embedded tiny tokenizer keeps 16 tokens, and
the word must survive that) and, as ``images[0]``, the target picture rendered with PIL's default font: the word in
near-black, centred, ``font_fraction * image_size`` pixels tall, on the scene's light background colour. ``meta``
holds ``text`` (the word, what :class:`app.rewards.ocr.OCRReward` reads for) and ``scene``. Flow-matching pretraining
(:class:`app.modules.FlowMatchingModule`) learns from the pictures; flow-GRPO reads only the prompts.

>>> sample = TextRenderDataset(num_samples=4, seed=0)[0]
>>> sample.task, sample.images[0].size, sorted(sample.meta)
('text_render', (64, 64), ['scene', 'text'])
>>> sample.question == f'"{sample.meta["text"]}" on a {sample.meta["scene"]}'
True
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

from app.tasks.base import SeededDataset
from app.types import VisualSample

TASK = "text_render"
WORDS = ("cat", "dog", "sun", "sky", "map", "box", "pen", "car")
"""Three-letter words: at 64 px a word in PIL's default font at size 22 is about 40 px wide, and OCR reads it."""
SCENES = {"sign": (255, 255, 255), "wall": (232, 224, 208), "shirt": (214, 228, 245), "door": (245, 236, 200)}
"""Scene -> background colour of the target: light, so the near-black word keeps its contrast."""
INK = (20, 20, 20)


@functools.lru_cache(maxsize=8)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def text_prompt(word: str, scene: str) -> str:
    return f'"{word}" on a {scene}'


def render_text(
    word: str,
    scene: str = "sign",
    image_size: int = 64,
    font_fraction: float = 0.34,
    rng: random.Random | None = None,
    jitter: int = 0,
) -> Image.Image:
    """The target picture: ``word`` centred (moved by up to ``jitter`` pixels each way, drawn from ``rng``) on the
    scene's background."""
    if scene not in SCENES:
        raise ValueError(f"unknown scene {scene!r}; known {sorted(SCENES)}")
    image = Image.new("RGB", (image_size, image_size), SCENES[scene])
    draw = ImageDraw.Draw(image)
    font = _font(max(6, round(font_fraction * image_size)))
    left, top, right, bottom = draw.textbbox((0, 0), word, font=font)
    dx, dy = (rng.randint(-jitter, jitter), rng.randint(-jitter, jitter)) if jitter and rng else (0, 0)
    x = (image_size - (right - left)) / 2 - left + dx
    y = (image_size - (bottom - top)) / 2 - top + dy
    draw.text((x, y), word, font=font, fill=INK)
    return image


class TextRenderDataset(SeededDataset):
    """``num_samples`` prompts, each (word, scene) pair equally often, in an order drawn from ``seed``.

    Args:
        num_samples: data set size.
        seed: seed of the order (and the jitter); sample ``i`` is rebuilt from ``(seed, i)``.
        image_size: side of the square target picture.
        labeled: keep the target picture in ``images``; False leaves it out (prompt-only, as flow-GRPO needs).
        words: the words to draw (short: the tiny model has 16 prompt tokens and 64 px).
        scenes: the scenes, a subset of :data:`SCENES`.
        font_fraction: glyph size as a fraction of ``image_size``.
        jitter: the word's largest offset from the centre, in pixels (0: always centred, one picture per prompt).
    """

    stream = "text_render"

    def __init__(
        self,
        num_samples: int,
        seed: int = 0,
        image_size: int = 64,
        labeled: bool = True,
        words: Sequence[str] = WORDS,
        scenes: Sequence[str] = tuple(SCENES),
        font_fraction: float = 0.34,
        jitter: int = 0,
    ):
        if num_samples < 0 or image_size < 16:
            raise ValueError(f"need num_samples >= 0 and image_size >= 16, got {num_samples}, {image_size}")
        words, scenes = list(words), list(scenes)
        if not words or any(not isinstance(w, str) or not w.strip() or '"' in w for w in words):
            raise ValueError(f"words must be non-empty strings without double quotes, got {words!r}")
        unknown = [s for s in scenes if s not in SCENES]
        if not scenes or unknown:
            raise ValueError(f"scenes must be some of {sorted(SCENES)}, got {scenes!r}")
        if not 0.05 <= font_fraction <= 1.0 or jitter < 0:
            raise ValueError(f"need font_fraction in [0.05, 1] and jitter >= 0, got {font_fraction}, {jitter}")
        super().__init__(num_samples, seed, image_size)
        self.labeled, self.font_fraction, self.jitter = labeled, font_fraction, jitter
        self._pairs = [(w, s) for w in words for s in scenes]

    def sample(self, index: int) -> VisualSample:
        block, offset = divmod(index, len(self._pairs))
        order = list(range(len(self._pairs)))
        random.Random(f"{self.stream}:{self.seed}:block:{block}").shuffle(order)
        word, scene = self._pairs[order[offset]]
        images = []
        if self.labeled:
            images = [render_text(word, scene, self.image_size, self.font_fraction, self.rng(index), self.jitter)]
        return VisualSample(
            images=images,
            question=text_prompt(word, scene),
            task=TASK,
            answer=None,
            meta={"text": word, "scene": scene},
        )
