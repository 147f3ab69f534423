"""Save what a flow-GRPO policy draws: one PNG grid per logged step, and a short video per step for video models.

A row of the grid is one prompt: its text (with its condition image, for image-to-image / image-to-video tasks) and
then its K samples, each captioned with its reward. The training module returns ``outputs["images"]`` (the first
``records_per_step`` decoded samples, ``[n, 3, H, W]`` or ``[n, F, 3, H, W]`` in [0, 1], group-major) and
``outputs["records"]`` (their rewards); the prompts come from the batch. Videos are encoded as GIF by Pillow or as MP4
by OpenCV's FFmpeg writer; every frame of the video is the whole grid at that frame. The loggers get the grid of the
last frame as an image (``samples/grid``) and, for videos, the whole clip as an animated GIF (``samples/video``,
:func:`callbacks.media.log_video`) whatever ``video_format`` the file on disk has.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import cv2
import lightning as L
import numpy as np
import torch
from PIL import Image

from callbacks.media import captioned, log_image, log_video, save_gif, text_cell, tile, to_pil
from callbacks.step_outputs import rows_per_prompt


def grid_frames(
    images: torch.Tensor,
    rewards: list[float],
    prompts: list[str],
    rows_per_prompt: int,
    conditions: list[Image.Image | None] | None = None,
    cell_size: int = 96,
) -> list[Image.Image]:
    """The grid of ``images`` (``[n, 3, H, W]``: one frame, or ``[n, F, 3, H, W]``: F frames), one row per prompt.

    Row ``b`` holds ``prompts[b]`` (above ``conditions[b]`` when given) and samples ``b*k .. b*k+k-1`` captioned with
    their reward; a last partial group is drawn as far as it goes.
    """
    if images.ndim not in (4, 5):
        raise ValueError(f"expected images [n, 3, H, W] or [n, F, 3, H, W], got shape {tuple(images.shape)}")
    n = min(len(images), len(rewards))
    if n == 0:
        raise ValueError("no images to draw")
    video = images[:n] if images.ndim == 5 else images[:n, None]  # [n, F, 3, H, W]
    rows_count = -(-n // rows_per_prompt)
    heads = []
    for b in range(rows_count):
        text = text_cell(prompts[b] if b < len(prompts) else "", cell_size, cell_size // 2 + 16)
        condition = conditions[b] if conditions and b < len(conditions) else None
        if condition is not None:
            cell = Image.new("RGB", (cell_size, text.height + cell_size // 2), (255, 255, 255))
            cell.paste(text, (0, 0))
            cell.paste(condition.convert("RGB").resize((cell_size // 2, cell_size // 2)), (cell_size // 4, text.height))
            text = cell
        heads.append(text)
    frames = []
    for f in range(video.shape[1]):
        rows = []
        for b in range(rows_count):
            samples = range(b * rows_per_prompt, min(n, (b + 1) * rows_per_prompt))
            cells = [captioned(to_pil(video[i, f]), f"r={rewards[i]:.3f}", cell_size) for i in samples]
            rows.append([heads[b], *cells])
        frames.append(tile(rows))
    return frames


def write_video(frames: list[Image.Image], path: str, fps: int) -> None:
    """Encode ``frames`` as an animated GIF (Pillow) or an MP4 (OpenCV, ``mp4v``), chosen by the file extension."""
    if path.endswith(".gif"):
        save_gif(frames, path, fps)
        return
    width, height = frames[0].size
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write MP4 to {path} (no FFmpeg backend?); use video_format: gif")
    try:
        for frame in frames:
            writer.write(cv2.cvtColor(np.asarray(frame), cv2.COLOR_RGB2BGR))
    finally:
        writer.release()


class SampleGridLogger(L.Callback):
    """Every ``every_n_steps`` optimizer steps, draw the step's samples as a grid (prompt | K samples with rewards),
    save it as ``<log_dir>/<dirname>/step_<step>.png`` (video models: also ``step_<step>.gif`` or ``.mp4``) and send the
    PNG to the loggers (TensorBoard, W&B, MLflow) as ``samples/grid``, and a video's whole clip as ``samples/video``.

    Args:
        every_n_steps: draw when ``trainer.global_step`` is a multiple of this (at most once per global step).
        max_prompts: rows of the grid (groups of K samples), taken from the first samples the module hands over
            (``records_per_step`` of the module bounds them).
        cell_size: side of each sample's square in pixels.
        video_format: ``gif`` or ``mp4``, for samples that are videos.
        fps: frames per second of the videos.
        dirname: folder under the trainer's log directory.
    """

    def __init__(
        self,
        every_n_steps: int = 10,
        max_prompts: int = 4,
        cell_size: int = 96,
        video_format: Literal["gif", "mp4"] = "gif",
        fps: int = 4,
        dirname: str = "samples",
    ) -> None:
        if every_n_steps < 1 or max_prompts < 1 or cell_size < 16 or fps < 1:
            raise ValueError(
                "SampleGridLogger needs every_n_steps >= 1, max_prompts >= 1, cell_size >= 16 and fps >= 1, got "
                f"{every_n_steps}, {max_prompts}, {cell_size}, {fps}"
            )
        if video_format not in ("gif", "mp4"):
            raise ValueError(f"video_format must be 'gif' or 'mp4', got {video_format!r}")
        self.every_n_steps, self.max_prompts, self.cell_size = every_n_steps, max_prompts, cell_size
        self.video_format, self.fps, self.dirname = video_format, fps, dirname
        self._dirpath: str | None = None
        self._last_logged_step: int | None = None
        self.written: list[str] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._dirpath = os.path.join(
            trainer.log_dir or trainer.default_root_dir, self.dirname
        )  # every rank: collective

    artefact_name = "sample grids"
    """How the end-of-run summary of ``python -m app`` names :attr:`path`."""

    @property
    def path(self) -> str | None:
        """The folder of the grids, once the trainer has set the callback up."""
        return self._dirpath

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero or not isinstance(outputs, dict):
            return
        images, records = outputs.get("images"), outputs.get("records")
        step = trainer.global_step
        if images is None or not records or step % self.every_n_steps or step == self._last_logged_step:
            return
        self._last_logged_step = step
        k = rows_per_prompt(outputs)
        n = min(len(images), len(records), self.max_prompts * k)
        samples = list(batch)[: -(-n // k)] if isinstance(batch, (list, tuple)) else []
        conditions = [s.images[0] if getattr(s, "images", None) else None for s in samples]
        frames = grid_frames(
            images[:n],
            [r.reward for r in records[:n]],
            [records[b * k].question for b in range(-(-n // k))],
            k,
            conditions,
            self.cell_size,
        )
        os.makedirs(self._dirpath, exist_ok=True)
        png = os.path.join(self._dirpath, f"step_{step:06d}.png")
        frames[-1].save(png)
        self.written.append(png)
        if len(frames) > 1:
            video = os.path.join(self._dirpath, f"step_{step:06d}.{self.video_format}")
            write_video(frames, video, self.fps)
            self.written.append(video)
            log_video(trainer, "samples/video", frames, step, self.fps)
        log_image(trainer, "samples/grid", frames[-1], step)
