"""Video files read with OpenCV (app.data.video): frames sampled by fps as the Qwen-VL processors expect (an even count,
spread over the clip), scaled down to the pixel budget, and files that are unreadable or over the limits refused by
name. The clips are written by the tests with cv2.VideoWriter."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from app.data.video import VideoError, VideoLimits, probe_video, read_video, sampled_indices

CODECS = {"mp4": "mp4v", "avi": "MJPG"}
STEP = 8  # frame i is a flat grey of value STEP * i


def write_clip(path, frames: int = 30, fps: float = 10.0, size=(64, 48)):
    """A clip whose frame i is a flat grey of value STEP * i (so a frame's mean tells which frame it is)."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*CODECS[path.suffix[1:]]), fps, size)
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), STEP * i, dtype=np.uint8))
    writer.release()
    return path


@pytest.mark.parametrize("suffix", ["mp4", "avi"])
def test_frames_are_sampled_by_fps_evenly_over_the_clip(tmp_path, suffix):
    path = write_clip(tmp_path / f"clip.{suffix}")  # 30 frames at 10 fps: 3 s
    video = read_video(path, VideoLimits(fps=2.0))
    assert video.frames.shape == (6, 48, 64, 3) and video.frames.dtype == np.uint8  # 2 fps x 3 s
    assert video.fps == pytest.approx(2.0)  # 6 of 30 frames at 10 fps
    indices = np.linspace(0, 29, 6).round()  # [0, 6, 12, 17, 23, 29]
    means = video.frames.reshape(6, -1).mean(axis=1)
    # lossy codecs move a flat grey by a few levels, far less than the STEP between frames
    np.testing.assert_allclose(means, STEP * indices, atol=STEP / 2)


@pytest.mark.parametrize(
    ("frames", "fps", "max_frames", "count"),
    [(100, 10.0, 8, 8), (30, 10.0, 7, 6), (3, 30.0, 32, 2), (1, 30.0, 32, 2), (50, 10.0, 32, 10)],
    ids=["capped", "even", "short-clip", "one-frame", "by-fps"],
)
def test_the_frame_count_is_even_at_least_two_and_at_most_max_frames(frames, fps, max_frames, count):
    from app.data.video import VideoHeader

    header = VideoHeader(frames=frames, fps=fps, width=8, height=8)
    indices = sampled_indices(header, VideoLimits(fps=2.0, max_frames=max_frames))
    assert len(indices) == count and indices[0] == 0 and indices[-1] == frames - 1
    assert np.all(np.diff(indices) >= 0)


def test_frames_over_max_pixels_are_scaled_down_keeping_the_aspect(tmp_path):
    path = write_clip(tmp_path / "clip.avi", frames=4, size=(64, 48))
    video = read_video(path, VideoLimits(max_pixels=32 * 24))
    assert video.frames.shape[1:] == (24, 32, 3)


def test_unreadable_missing_and_oversized_videos_are_refused_by_name(tmp_path):
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video at all" * 100)
    with pytest.raises(VideoError, match=r"garbage\.mp4: unreadable video"):
        read_video(garbage)
    with pytest.raises(VideoError, match=r"missing\.avi: unreadable video"):
        probe_video(tmp_path / "missing.avi")
    long = write_clip(tmp_path / "long.avi", frames=30)
    with pytest.raises(VideoError, match=r"long\.avi: 30 frames, over max_source_frames=10"):
        read_video(long, VideoLimits(max_source_frames=10))
    with pytest.raises(VideoError, match=r"long\.avi: frames of 64x48 pixels, over max_source_pixels=1000"):
        probe_video(long, VideoLimits(max_source_pixels=1000))
    header = probe_video(long)
    assert (header.frames, header.fps, header.width, header.height) == (30, 10.0, 64, 48)


def test_limits_refuse_values_that_cannot_sample_a_clip():
    with pytest.raises(ValueError, match="fps must be > 0"):
        VideoLimits(fps=0)
    with pytest.raises(ValueError, match="max_frames must be >= 2"):
        VideoLimits(max_frames=1)
