"""Validation of a scorer: the solver's rendering scores 1, perturbed renderings score clearly lower, blur, noise and
JPEG compression of a correct rendering keep a high score, and degenerate renderings (:func:`degenerate_renderings`:
constant colours, uniform noise, checkerboards, the problem flooded with one colour) score no more than the unsolved
problem. ``python -m app.tasks.vbvr.validation`` prints the report table over every registered task."""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass, field

import cv2
import numpy as np
from PIL import Image

from app.cv import BACKGROUND, PALETTE
from app.tasks.vbvr.core import VisualTask
from app.tasks.vbvr.puzzles._regions import foreground
from app.tasks.vbvr.registry import TASKS, get_task

PERTURBED_MAX = 0.6  # a wrong rendering must score at most this
DEGRADED_MIN = 0.8  # a blurred / noisy / compressed correct rendering must score at least this


def gaussian_blur(image: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    return cv2.GaussianBlur(image, (0, 0), sigma)


def gaussian_noise(image: np.ndarray, std: float = 8.0, seed: int = 0) -> np.ndarray:
    noise = np.random.default_rng(seed).normal(0.0, std, image.shape)
    return np.clip(image.astype(np.float64) + noise, 0, 255).astype(np.uint8)


def jpeg(image: np.ndarray, quality: int = 75) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"), dtype=np.uint8)


DEGRADATIONS = {"blur": gaussian_blur, "noise": gaussian_noise, "jpeg": jpeg}

CHECKER_CELLS = (1, 4, 16)  # pixels per checkerboard square: single pixels, small and object-sized squares


def _checkerboard(size: int, cell: int, colours: np.ndarray) -> np.ndarray:
    """``[size, size, 3]``: squares of ``cell`` pixels cycling through ``colours`` (``[K, 3]`` uint8), row by row
    shifted by 7 squares, so that with two colours it is a checkerboard and with more no two neighbours match."""
    ys, xs = np.mgrid[0:size, 0:size] // cell
    return colours[(ys * 7 + xs) % len(colours)]


def degenerate_renderings(problem: np.ndarray) -> dict[str, np.ndarray]:
    """Renderings that answer nothing, at the size of ``problem`` (the unsolved problem, ``[H, W, 3]`` uint8): the
    canvas filled with each palette colour, black or white; uniform noise; checkerboards of each palette colour on the
    background and of all palette colours (:data:`CHECKER_CELLS`); ``problem`` with its background flooded by each
    palette colour (its objects kept, its faint grid lines painted over). A scorer must give none of them more than it
    gives ``problem``."""
    height, width = problem.shape[:2]
    size = max(height, width)
    background = np.array(BACKGROUND, dtype=np.uint8)
    out = {}
    for name, rgb in {**PALETTE, "black": (0, 0, 0), "white": (255, 255, 255)}.items():
        out[f"constant {name}"] = np.full((height, width, 3), rgb, dtype=np.uint8)
    out["uniform noise"] = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    palette = np.array(list(PALETTE.values()), dtype=np.uint8)
    for cell in CHECKER_CELLS:
        for name, rgb in PALETTE.items():
            colours = np.stack([np.array(rgb, dtype=np.uint8), background])
            out[f"checkerboard {cell} {name}"] = _checkerboard(size, cell, colours)[:height, :width]
        out[f"checkerboard {cell} all colours"] = _checkerboard(size, cell, palette)[:height, :width]
    empty = ~foreground(problem)  # the background and the faint grid lines
    for name, rgb in PALETTE.items():
        out[f"flood {name}"] = np.where(empty[..., None], np.array(rgb, dtype=np.uint8), problem)
    return out


@dataclass
class ValidationRow:
    """Scores of one task over several seeds: the solver's rendering, each perturbation, each degradation, the
    unsolved problem (``blank``) and each degenerate rendering (minimum over seeds for the solver, degradations and
    the blank, maximum for perturbations and degenerate renderings: the worst case)."""

    task: str
    solver: float
    perturbed: dict[str, float]
    degraded: dict[str, float]
    blank: float = 0.0
    degenerate: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.solver >= 0.999
            and all(v <= PERTURBED_MAX for v in self.perturbed.values())
            and all(v >= DEGRADED_MIN for v in self.degraded.values())
            and all(v <= self.blank for v in self.degenerate.values())
        )


def validate(task: VisualTask, seeds: range) -> ValidationRow:
    solver, perturbed, degraded, blank, degenerate = 1.0, {}, {}, 1.0, {}
    for seed in seeds:
        instance = task.generate(seed)
        solver = min(solver, task.score(instance.frames, instance.config).score)
        blank = min(blank, task.score(instance.first_frame, instance.config).score)
        for name, image in degenerate_renderings(instance.first_frame).items():
            degenerate[name] = max(degenerate.get(name, 0.0), task.score(image, instance.config).score)
        for name, image in task.perturbations(instance.config, instance.solution).items():
            perturbed[name] = max(perturbed.get(name, 0.0), task.score(image, instance.config).score)
        for name, degrade in DEGRADATIONS.items():
            value = task.score(degrade(instance.last_frame), instance.config).score
            degraded[name] = min(degraded.get(name, 1.0), value)
    return ValidationRow(task.name, solver, perturbed, degraded, blank, degenerate)


def report(rows: list[ValidationRow]) -> str:
    lines = [
        "| task | solver | worst perturbed (max) | worst degraded (min) | blank | worst degenerate (max) | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        perturbed = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.perturbed.items()))
        degraded = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.degraded.items()))
        worst = max(sorted(row.degenerate.items()), key=lambda kv: kv[1], default=("none", 0.0))
        lines.append(
            f"| {row.task} | {row.solver:.2f} | {perturbed} | {degraded} | {row.blank:.2f} | {worst[0]} {worst[1]:.2f} "
            f"| {'yes' if row.ok else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="instances per task")
    args = parser.parse_args()
    rows = [validate(get_task(name), range(args.seeds)) for name in sorted(TASKS)]
    print(report(rows))


if __name__ == "__main__":
    main()
