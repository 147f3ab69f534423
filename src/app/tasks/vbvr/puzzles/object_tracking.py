"""Object tracking (spatial, video): continue a ball's constant-velocity motion and show where it is after N steps.

Problem: the first ``shown + 1`` frames show a coloured ball moving in a straight line with constant velocity (it never
reaches a wall). Solution: the ball at ``start + steps * velocity``; the video shows every step of the motion.

Scorer (classical CV on the RGB frames):

* ``single_ball`` (hard): exactly one saturated blob (of any hue) in the last frame, and it is ball-sized: its bounding
  box at most twice the ball's diameter on each side (a canvas filled with the ball's colour is no ball).
* ``ball_at_expected_position`` (soft, weight 4): the centroid of the ball-coloured blob in the last frame is within
  ``radius / 2`` of the expected position; the value falls off linearly to 0 at ``1.5 * radius``.
* ``moves_along_direction`` (soft, weight 1, videos only): the fraction of consecutive frames whose centroid
  displacement, projected on the velocity direction, is non-negative (0 when the net motion goes the wrong way).
* ``stays_on_line`` (soft, weight 1, videos only): the fraction of frames whose centroid lies within ``radius / 2`` of
  the line through the start along the velocity.

On a single image (Last-Frame regime) the two trajectory checks are not applicable and pass; their detail is empty
whenever they pass, so a correct video and its last frame give the same :class:`ScoreResult`.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from app.cv import PALETTE, Blob, blobs, color_mask, saturated_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, draw_shape, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

_MARGIN = 4  # pixels between the ball and the image border at every step


class ObjectTrackingTask(VisualTask):
    name = "object_tracking"
    faculty = "spatial"

    def __init__(
        self, image_size: int = 128, min_steps: int = 8, max_steps: int = 12, min_radius: int = 6, max_radius: int = 8
    ) -> None:
        super().__init__(
            image_size, min_steps=min_steps, max_steps=max_steps, min_radius=min_radius, max_radius=max_radius
        )
        self.min_steps, self.max_steps = min_steps, max_steps
        self.min_radius, self.max_radius = min_radius, max_radius

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"min_steps": self.max_steps + 2, "max_steps": self.max_steps + 6, "min_radius": 5, "max_radius": 6}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        radius = rng.randint(self.min_radius, self.max_radius)
        steps = rng.randint(self.min_steps, self.max_steps)
        shown = steps // 2
        room = self.image_size - 2 * (radius + _MARGIN)  # the path's extent along x and along y must fit in this
        # Fast enough that the last shown position is >= 2 radii from the answer, slow enough that the path fits.
        low, high = (2 * radius + 2) / (steps - shown), min(7.0, room / steps)
        speed, angle = rng.uniform(low, high), rng.uniform(0.0, 2 * math.pi)
        velocity = [round(speed * math.cos(angle), 2), round(speed * math.sin(angle), 2)]
        start = []
        for v in velocity:
            lo = radius + _MARGIN - min(0.0, v * steps)
            hi = self.image_size - radius - _MARGIN - max(0.0, v * steps)
            start.append(round(rng.uniform(lo, hi), 2))
        color = rng.choice(sorted(PALETTE))
        return {"color": color, "radius": radius, "start": start, "velocity": velocity, "steps": steps, "shown": shown}

    @staticmethod
    def position(config: dict[str, Any], step: float) -> tuple[float, float]:
        (x, y), (vx, vy) = config["start"], config["velocity"]
        return (x + step * vx, y + step * vy)

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        x, y = self.position(config, config["steps"])
        return {"final_position": [round(x, 2), round(y, 2)]}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            f"The first {config['shown'] + 1} frames show a {config['color']} ball moving in a straight line at "
            f"constant speed. Continue the motion and show the ball where it is after {config['steps']} steps."
        )

    def _draw(self, config: dict[str, Any], balls: list[tuple[tuple[float, float], str]]) -> np.ndarray:
        image, draw = canvas(self.image_size)
        for center, color in balls:
            draw_shape(draw, "circle", center, config["radius"], color)
        return to_array(image)

    def render(self, config, solution):
        frames = [self._draw(config, [(self.position(config, t), config["color"])]) for t in range(config["steps"] + 1)]
        return np.stack(frames), [config["shown"]]

    def perturbations(self, config, solution):
        final = tuple(solution["final_position"])
        # The extra ball sits in the image corner farthest from the answer, well clear of the real ball.
        lo, hi = config["radius"] + _MARGIN, self.image_size - config["radius"] - _MARGIN
        extra = max(((x, y) for x in (lo, hi) for y in (lo, hi)), key=lambda c: math.dist(c, final))
        return {
            "wrong_position": self._draw(config, [(self.position(config, config["shown"]), config["color"])]),
            "two_balls": self._draw(config, [(final, config["color"]), (extra, config["color"])]),
        }

    @staticmethod
    def _ball_sized(blob: Blob, radius: int) -> bool:
        """Whether the blob's bounding box is at most twice the ball's diameter on each side."""
        return max(blob.bbox[2], blob.bbox[3]) <= 2 * (2 * radius + 1)

    def _ball_centroid(self, frame: np.ndarray, config: dict[str, Any]) -> tuple[float, float] | None:
        found = blobs(color_mask(frame, config["color"]), min_area=max(6, config["radius"] ** 2 // 2))
        balls = [b for b in found if self._ball_sized(b, config["radius"])]
        return balls[0].centroid if balls else None

    def score(self, frames, config) -> ScoreResult:
        video = as_frames(frames)
        last, radius = video[-1], config["radius"]
        coloured = blobs(saturated_mask(last), min_area=max(6, radius**2 // 2))
        one_ball = len(coloured) == 1 and self._ball_sized(coloured[0], radius)
        expected = self.position(config, config["steps"])
        centroid = self._ball_centroid(last, config)
        if centroid is None:
            position, where = 0.0, "no ball found"
        else:
            distance = math.dist(centroid, expected)
            position = 1.0 - (distance - radius / 2) / radius
            where = f"ball at ({centroid[0]:.1f}, {centroid[1]:.1f}), expected ({expected[0]:.1f}, {expected[1]:.1f})"
        checks = [
            Check(
                "single_ball",
                float(one_ball),
                hard=True,
                detail=f"{len(coloured)} coloured blobs"
                + ("" if len(coloured) != 1 or one_ball else ", not ball-sized"),
            ),
            Check("ball_at_expected_position", position, weight=4.0, detail=where if position < 1.0 else ""),
        ]
        return combine(checks + self._trajectory_checks(video, config))

    def _trajectory_checks(self, video: np.ndarray, config: dict[str, Any]) -> list[Check]:
        """Soft checks on the centroids across a video's frames (pass trivially for a single frame)."""
        centroids = [c for c in (self._ball_centroid(frame, config) for frame in video) if c is not None]
        vx, vy = config["velocity"]
        norm = math.hypot(vx, vy)
        ux, uy = vx / norm, vy / norm
        monotone, straight, detail_m, detail_s = 1.0, 1.0, "", ""
        if len(video) > 1:
            along = [(b[0] - a[0]) * ux + (b[1] - a[1]) * uy for a, b in zip(centroids, centroids[1:], strict=False)]
            if not along or sum(along) <= 0:
                monotone, detail_m = 0.0, "the ball does not move along the expected direction"
            else:
                monotone = sum(d >= -0.5 for d in along) / len(along)
                detail_m = (
                    f"{sum(d < -0.5 for d in along)}/{len(along)} steps against the direction" if monotone < 1 else ""
                )
            sx, sy = config["start"]
            off = [abs((x - sx) * uy - (y - sy) * ux) for x, y in centroids]
            straight = sum(d <= config["radius"] / 2 for d in off) / len(video)
            detail_s = (
                f"{sum(d <= config['radius'] / 2 for d in off)}/{len(video)} frames on the line" if straight < 1 else ""
            )
        return [
            Check("moves_along_direction", monotone, detail=detail_m),
            Check("stays_on_line", straight, detail=detail_s),
        ]
