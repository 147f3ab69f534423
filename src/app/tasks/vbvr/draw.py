"""Rendering helpers shared by the tasks: a canvas, shapes in palette colours, grids."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from app.cv import BACKGROUND, PALETTE


def canvas(size: int) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (size, size), BACKGROUND)
    return image, ImageDraw.Draw(image)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, center: tuple[float, float], radius: float, color: str) -> None:
    """A filled circle, square or triangle of the named palette colour."""
    x, y = center
    fill = PALETTE[color]
    if shape == "circle":
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=fill)
    elif shape == "square":
        draw.rectangle((x - radius, y - radius, x + radius, y + radius), fill=fill)
    elif shape == "triangle":
        draw.polygon([(x, y - radius), (x - radius, y + radius), (x + radius, y + radius)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def cell_center(row: int, col: int, grid: int, size: int) -> tuple[float, float]:
    """Pixel centre of grid cell (row, col) on a ``grid`` x ``grid`` board filling a ``size`` image."""
    step = size / grid
    return ((col + 0.5) * step, (row + 0.5) * step)


def to_array(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.uint8).copy()
