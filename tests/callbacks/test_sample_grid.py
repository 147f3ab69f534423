import io
import os

import pytest
import torch
from PIL import Image

from callbacks.sample_grid import SampleGridLogger, grid_frames


def test_grid_has_a_row_per_prompt_and_a_cell_per_sample():
    images = torch.zeros(6, 3, 8, 8)
    images[3:, 0] = 1.0  # the second prompt's samples are red
    frames = grid_frames(images, [0.1 * i for i in range(6)], ["a", "b"], rows_per_prompt=3, cell_size=32)
    assert len(frames) == 1
    grid = frames[0]
    # 2 rows of (32 + 16 caption) with 2-pixel padding; 4 cells of 32 (prompt + 3 samples)
    assert grid.size == (4 * 32 + 5 * 2, 2 * 48 + 3 * 2)
    red_cell = grid.getpixel((2 + 2 * 34 + 10, 2 + 48 + 2 + 10))  # row 2, second sample
    black_cell = grid.getpixel((2 + 2 * 34 + 10, 2 + 10))  # row 1, second sample
    assert red_cell == (255, 0, 0) and black_cell == (0, 0, 0)


def test_video_samples_give_one_grid_per_frame_and_conditions_are_drawn():
    video = torch.zeros(2, 3, 3, 8, 8)
    video[:, 2] = 1.0  # the last frame is white
    condition = Image.new("RGB", (8, 8), (0, 0, 255))
    frames = grid_frames(video, [0.5, 0.7], ["p"], rows_per_prompt=2, conditions=[condition], cell_size=32)
    assert len(frames) == 3
    assert frames[0].getpixel((2 + 34 + 5, 7)) == (0, 0, 0) and frames[2].getpixel((2 + 34 + 5, 7)) == (255,) * 3
    colours = {frames[0].getpixel((x, y)) for x in range(2, 34) for y in range(2, frames[0].height - 2)}
    assert (0, 0, 255) in colours  # the condition image sits in the prompt cell


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="shape"):
        grid_frames(torch.zeros(2, 8, 8), [0.0, 0.0], ["p"], 2)
    with pytest.raises(ValueError, match="video_format"):
        SampleGridLogger(video_format="avi")


def test_fit_writes_png_grids_and_sends_them_to_tensorboard(tmp_path, stand_in, make_trainer, tensorboard):
    callback = SampleGridLogger(every_n_steps=2, max_prompts=1, cell_size=32)
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(stand_in())
    files = sorted(os.listdir(callback.path))
    assert files == ["step_000002.png", "step_000004.png"]
    with Image.open(os.path.join(callback.path, files[0])) as grid:
        assert grid.size == (3 * 32 + 4 * 2, 48 + 2 * 2)  # one prompt, K = 2 samples
    _, events = tensorboard(trainer.logger.log_dir)
    assert [e.step for e in events.Images("samples/grid")] == [2, 4]


def test_tensorboard_gets_the_whole_clip_of_a_video_model(tmp_path, stand_in, make_trainer, tensorboard):
    callback = SampleGridLogger(every_n_steps=2, max_prompts=1, cell_size=32, video_format="mp4")
    trainer = make_trainer(tmp_path, [callback], max_steps=2)
    trainer.fit(stand_in(frames=3))
    _, events = tensorboard(trainer.logger.log_dir)
    (video,) = events.Images("samples/video")
    (grid,) = events.Images("samples/grid")  # the last frame, as before
    size = (3 * 32 + 4 * 2, 48 + 2 * 2)
    assert video.step == grid.step == 2 and (video.width, video.height) == (grid.width, grid.height) == size
    with Image.open(io.BytesIO(video.encoded_image_string)) as gif:  # a GIF whatever the file on disk is
        assert (gif.format, gif.n_frames, gif.size) == ("GIF", 3, size)
        gif.seek(2)
        last = gif.convert("RGB")
    with Image.open(io.BytesIO(grid.encoded_image_string)) as png:
        assert png.convert("RGB").getpixel((40, 10)) == last.getpixel((40, 10))  # a sample's pixel, same frame


@pytest.mark.parametrize("video_format", ["gif", "mp4"])
def test_video_models_get_an_encoded_video(tmp_path, stand_in, make_trainer, video_format):
    import cv2

    callback = SampleGridLogger(every_n_steps=1, max_prompts=2, cell_size=32, video_format=video_format)
    make_trainer(tmp_path, [callback], max_steps=1, logger=False).fit(stand_in(frames=4))
    path = os.path.join(callback.path, f"step_000001.{video_format}")
    if video_format == "gif":
        with Image.open(path) as gif:
            assert gif.n_frames == 4 and gif.size == (3 * 32 + 4 * 2, 2 * 48 + 3 * 2)
    else:
        capture = cv2.VideoCapture(path)
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        ok, frame = capture.read()
        capture.release()
        assert ok and count == 4 and frame.shape[:2] == (2 * 48 + 3 * 2, 3 * 32 + 4 * 2)
