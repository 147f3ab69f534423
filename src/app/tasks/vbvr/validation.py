"""Validation of a scorer: the solver's rendering scores 1, perturbed renderings score clearly lower, and blur,
noise and JPEG compression of a correct rendering keep a high score. ``python -m app.tasks.vbvr.validation`` prints the
report table over every registered task."""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image

from app.tasks.vbvr.core import VisualTask
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


@dataclass
class ValidationRow:
    """Scores of one task over several seeds: the solver's rendering, each perturbation, each degradation (minimum
    over seeds for the solver and degradations, maximum for perturbations: the worst case)."""

    task: str
    solver: float
    perturbed: dict[str, float]
    degraded: dict[str, float]

    @property
    def ok(self) -> bool:
        return (
            self.solver >= 0.999
            and all(v <= PERTURBED_MAX for v in self.perturbed.values())
            and all(v >= DEGRADED_MIN for v in self.degraded.values())
        )


def validate(task: VisualTask, seeds: range) -> ValidationRow:
    solver, perturbed, degraded = 1.0, {}, {}
    for seed in seeds:
        instance = task.generate(seed)
        solver = min(solver, task.score(instance.frames, instance.config).score)
        for name, image in task.perturbations(instance.config, instance.solution).items():
            perturbed[name] = max(perturbed.get(name, 0.0), task.score(image, instance.config).score)
        for name, degrade in DEGRADATIONS.items():
            value = task.score(degrade(instance.last_frame), instance.config).score
            degraded[name] = min(degraded.get(name, 1.0), value)
    return ValidationRow(task.name, solver, perturbed, degraded)


def report(rows: list[ValidationRow]) -> str:
    lines = ["| task | solver | worst perturbed (max) | worst degraded (min) | ok |", "|---|---|---|---|---|"]
    for row in rows:
        perturbed = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.perturbed.items()))
        degraded = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.degraded.items()))
        lines.append(f"| {row.task} | {row.solver:.2f} | {perturbed} | {degraded} | {'yes' if row.ok else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="instances per task")
    args = parser.parse_args()
    rows = [validate(get_task(name), range(args.seeds)) for name in sorted(TASKS)]
    print(report(rows))


if __name__ == "__main__":
    main()
