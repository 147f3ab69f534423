"""Pictures for logging callbacks: tensors to PIL images, captioned cells, and sending an image, a video or a table to
whichever loggers the trainer has (TensorBoard, Weights & Biases, MLflow; the last two are optional dependencies, the
``wandb`` and ``mlflow`` extras, and are only touched when the user configured their logger: docs/trackers.md).

Videos travel as animated GIFs that Pillow encodes, to every logger: no moviepy, no FFmpeg (TensorBoard's
``add_video`` and ``wandb.Video`` of an array both need moviepy)."""

from __future__ import annotations

import io
import os
import tempfile
import textwrap
from collections.abc import Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from PIL import Image, ImageDraw, ImageFont

BACKGROUND = (255, 255, 255)
INK = (20, 20, 20)


def to_pil(image: torch.Tensor | np.ndarray | Image.Image) -> Image.Image:
    """An RGB image from a PIL image, a float tensor in [0, 1] shaped ``[3, H, W]`` or a uint8 array ``[H, W, 3]``."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.shape[0] not in (1, 3):
            raise ValueError(f"expected an image tensor [3, H, W], got shape {tuple(image.shape)}")
        array = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        return Image.fromarray(array if array.shape[2] == 3 else array[..., 0]).convert("RGB")
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image array [H, W, 3], got {array.dtype} {array.shape}")
    return Image.fromarray(array)


def _font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def text_cell(text: str, width: int, height: int, font_size: int = 11) -> Image.Image:
    """``text`` wrapped into a white ``width x height`` cell (cut with an ellipsis when it does not fit)."""
    cell = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(cell)
    chars = max(4, int(width / (0.55 * font_size)))
    lines = textwrap.wrap(" ".join(str(text).split()), chars) or [""]
    max_lines = max(1, (height - 4) // (font_size + 2))
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: chars - 3] + "..."
    draw.multiline_text((3, 2), "\n".join(lines), fill=INK, font=_font(font_size), spacing=2)
    return cell


def captioned(image: Image.Image, caption: str, size: int, caption_height: int = 16) -> Image.Image:
    """``image`` resized into a ``size x size`` square with ``caption`` underneath."""
    cell = Image.new("RGB", (size, size + caption_height), BACKGROUND)
    cell.paste(image.convert("RGB").resize((size, size), Image.Resampling.NEAREST), (0, 0))
    cell.paste(text_cell(caption, size, caption_height, font_size=10), (0, size))
    return cell


def tile(rows: Sequence[Sequence[Image.Image]], pad: int = 2) -> Image.Image:
    """Cells laid out row by row (rows may differ in length; every cell of a row has the row's height)."""
    widths = [sum(c.width for c in row) + pad * (len(row) + 1) for row in rows]
    heights = [max(c.height for c in row) for row in rows]
    grid = Image.new("RGB", (max(widths), sum(heights) + pad * (len(rows) + 1)), (200, 200, 200))
    y = pad
    for row, height in zip(rows, heights, strict=True):
        x = pad
        for cell in row:
            grid.paste(cell, (x, y))
            x += cell.width + pad
        y += height + pad
    return grid


def log_image(trainer: L.Trainer, key: str, image: Image.Image, step: int) -> None:
    """Send ``image`` to every logger of ``trainer`` that takes images (MLflow stores it as an artifact file)."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, np.asarray(image), step, dataformats="HWC")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key, [image], step=step)
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_image(logger.run_id, image, f"{key}/step_{step:06d}.png")


def save_gif(frames: Sequence[Image.Image], target: str | io.BytesIO, fps: int) -> None:
    """Write ``frames`` (PIL images of one size) as an animated GIF that loops, ``fps`` frames per second."""
    duration = max(1, round(1000 / fps))
    frames[0].save(target, format="GIF", save_all=True, append_images=list(frames[1:]), duration=duration, loop=0)


def gif_bytes(frames: Sequence[Image.Image], fps: int) -> bytes:
    """The animated GIF of ``frames`` (:func:`save_gif`), in memory."""
    buffer = io.BytesIO()
    save_gif(frames, buffer, fps)
    return buffer.getvalue()


def log_video(trainer: L.Trainer, key: str, frames: Sequence[Image.Image], step: int, fps: int) -> None:
    """Send the clip ``frames`` (PIL images of one size, in order) as an animated GIF to every logger of ``trainer``:
    TensorBoard as an image summary holding the GIF (what ``add_video`` writes; the Images tab plays it), Weights &
    Biases as a ``wandb.Video``, MLflow as the artifact file ``<key>/step_<step>.gif``."""
    if not frames:
        raise ValueError(f"no frames to log as {key!r}")
    data = gif_bytes(frames, fps)
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            _tensorboard_gif(logger, key, data, frames[0].size, step)
        elif isinstance(logger, WandbLogger):
            logger.log_video(key, [io.BytesIO(data)], step=step, format=["gif"])
        elif isinstance(logger, MLFlowLogger):
            _mlflow_file(logger, key, f"step_{step:06d}.gif", data)


def _tensorboard_gif(logger: TensorBoardLogger, key: str, gif: bytes, size: tuple[int, int], step: int) -> None:
    from tensorboard.compat.proto.summary_pb2 import Summary

    image = Summary.Image(width=size[0], height=size[1], colorspace=3, encoded_image_string=gif)
    logger.experiment._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=key, image=image)]), step)


def _mlflow_file(logger: MLFlowLogger, folder: str, name: str, data: bytes) -> None:
    """``data`` as the run's artifact ``<folder>/<name>``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        logger.experiment.log_artifact(logger.run_id, path, artifact_path=folder)


def log_table(
    trainer: L.Trainer, key: str, columns: list[str], rows: list[list[Any]], step: int, image_column: str | None = None
) -> None:
    """Send a table to the loggers that have tables: Weights & Biases (the ``image_column`` cells, PIL images, become
    ``wandb.Image``) and MLflow (``log_table``; images are stored as files beside it and the cell holds the file name).
    TensorBoard has no table type: callbacks render one themselves."""
    index = columns.index(image_column) if image_column in columns else None
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            data = [[wandb.Image(v) if i == index and v is not None else v for i, v in enumerate(r)] for r in rows]
            logger.log_table(key, columns=columns, data=data, step=step)
        elif isinstance(logger, MLFlowLogger):
            data: dict[str, list[Any]] = {c: [] for c in columns}
            for j, row in enumerate(rows):
                for i, (column, value) in enumerate(zip(columns, row, strict=True)):
                    if i == index and value is not None:
                        name = f"{key}/images/step_{step:06d}_{j:03d}.png"
                        logger.experiment.log_image(logger.run_id, value, name)
                        value = os.path.basename(name)
                    data[column].append(value)
            logger.experiment.log_table(logger.run_id, data=data, artifact_file=f"{key}/step_{step:06d}.json")
