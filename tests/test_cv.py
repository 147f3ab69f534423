"""Classical-CV helpers of the VBVR scorers (app.cv) against independent references and hand-built masks."""

import colorsys
import re

import cv2
import numpy as np
import pytest

from app.cv import (
    BACKGROUND,
    PALETTE,
    WALL,
    Blob,
    _shape,
    blobs,
    color_mask,
    frames_at_size,
    palette_hue,
    saturated_mask,
)


def test_palette_hue_is_the_opencv_hue_of_the_rgb_colour():
    for name, rgb in PALETTE.items():
        hue, _, _ = colorsys.rgb_to_hsv(*(c / 255 for c in rgb))
        assert palette_hue(name) == round(hue * 180) % 180, name  # OpenCV hue: degrees / 2


def _rgb_grid() -> np.ndarray:
    """Every RGB triple on a grid that includes the value and saturation thresholds: ``[55 * 55, 55, 3]`` uint8."""
    levels = np.array(sorted({*range(0, 256, 5), 69, 70, 89, 90, 91}), dtype=np.uint8)
    return np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(len(levels) ** 2, len(levels), 3)


def test_color_mask_is_a_circular_hue_window_with_minimum_saturation_and_value():
    image = _rgb_grid()
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV).astype(int)
    hue, saturation, value = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    bright = (saturation >= 90) & (value >= 70)
    for name in PALETTE:
        gap = np.abs(hue - palette_hue(name))
        distance = np.minimum(gap, 180 - gap)  # red (hue 0) owns hues 173..179 too
        expected = (distance <= 7) & bright
        got = color_mask(image, name)
        assert got.dtype == bool and np.array_equal(got, expected), name
        # every threshold is met exactly by some pixel of this colour, on both sides
        for edge in (
            (distance == 7) & bright,
            (distance == 8) & bright,
            (distance <= 7) & (saturation == 90) & (value >= 70),
            (distance <= 7) & (saturation == 89) & (value >= 70),
            (distance <= 7) & (saturation >= 90) & (value == 70),
            (distance <= 7) & (saturation >= 90) & (value == 69),
        ):
            assert edge.any(), name
    assert (color_mask(image, "red") & (hue >= 173)).any()
    assert np.array_equal(color_mask(image.astype(np.int64), "green"), color_mask(image, "green"))  # any int dtype


def _blob_mask() -> np.ndarray:
    mask = np.zeros((30, 40), dtype=bool)
    mask[0, 0:11] = True  # 11 px: below min_area, and the first component in raster order
    mask[3:6, 30:34] = True  # 12 px, exactly min_area, top right
    for k in range(13):
        mask[10 + k, 5 + k] = True  # a diagonal: one component only with 8-connectivity
    mask[10:27, 20:37] = True  # a 17 x 17 square
    mask[27:30, 0:4] = True  # 12 px, bottom left
    return mask


def test_saturated_mask_keeps_every_palette_colour_and_drops_greys_and_dark_pixels():
    image = np.array([[*PALETTE.values(), BACKGROUND, WALL, (255, 255, 255), (60, 20, 20)]], dtype=np.uint8)
    # (60, 20, 20): saturated but darker than value 70
    assert saturated_mask(image).tolist() == [[True] * len(PALETTE) + [False] * 4]
    assert saturated_mask(image, min_value=50)[0, -1]


def test_blobs_are_8_connected_components_of_at_least_min_area_largest_first():
    assert blobs(_blob_mask()) == [
        Blob(289, (28.0, 18.0), (20, 10, 17, 17), "square"),
        Blob(13, (11.0, 16.0), (5, 10, 13, 13), "triangle"),  # a line: no area inside its contour
        Blob(12, (1.5, 28.0), (0, 27, 4, 3), "triangle"),  # equal areas: by centroid x, then y
        Blob(12, (31.5, 4.0), (30, 3, 4, 3), "triangle"),
    ]
    assert [b.area for b in blobs(_blob_mask(), min_area=13)] == [289, 13]
    assert [b.area for b in blobs(_blob_mask(), min_area=1)] == [289, 13, 12, 12, 11]
    assert blobs(np.zeros((5, 5), dtype=bool)) == []


def _shape_of(draw) -> str:
    mask = np.zeros((40, 40), dtype=np.uint8)
    draw(mask)
    (blob,) = blobs(mask.astype(bool))
    return blob.shape


@pytest.mark.parametrize(
    ("draw", "shape"),
    [
        (lambda m: m.__setitem__((slice(10, 27), slice(10, 27)), 1), "square"),  # fill (16 * 16) / 17^2 = 0.886
        (lambda m: cv2.circle(m, (20, 20), 15, 1, -1), "circle"),
        (lambda m: cv2.fillPoly(m, [np.array([[2, 35], [37, 35], [20, 3]], np.int32)], 1), "triangle"),
    ],
)
def test_shape_guess_from_the_fill_of_the_bounding_box(draw, shape):
    assert _shape_of(draw) == shape


def test_shape_thresholds_are_strict():
    mask = np.zeros((10, 10), dtype=bool)
    mask[2:7, 2:7] = True
    mask[2, 2] = False  # a 5 x 5 square less a corner: fill (16 - 0.5) / 25 = 0.62 exactly
    assert _shape(mask) == "circle"
    rectangle = np.zeros((30, 30), dtype=bool)
    rectangle[2:27, 3:15] = True  # a 12 x 25 rectangle: fill (11 * 24) / (12 * 25) = 0.88 exactly
    assert _shape(rectangle) == "circle"
    assert _shape(np.zeros((5, 5), dtype=bool)) == "unknown"


def test_to_uint8_frames_refuses_empty_renderings_naming_the_shape():
    import torch

    from app.cv import to_uint8_frames

    for rendering, shape in [
        (np.zeros((0, 0, 3), dtype=np.uint8), (1, 0, 0, 3)),
        (torch.zeros(3, 0, 0), (1, 0, 0, 3)),
        (torch.zeros(0, 3, 4, 4), (0, 4, 4, 3)),
        (np.zeros((2, 4, 0, 3), dtype=np.uint8), (2, 4, 0, 3)),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"empty rendering of shape {shape} as [T, H, W, 3]")):
            to_uint8_frames(rendering)
    assert to_uint8_frames(torch.ones(3, 1, 1)).tolist() == [[[[255, 255, 255]]]]


def test_frames_at_size_resizes_within_the_aspect_ratio_and_refuses_to_stretch():
    frames = np.zeros((2, 8, 16, 3), np.uint8)
    frames[:, :, 8:] = 200  # right half bright
    assert frames_at_size(frames, 8, 16) is frames
    half = frames_at_size(frames, 4, 8)
    assert half.shape == (2, 4, 8, 3) and (half[:, :, 4:] == 200).all() and (half[:, :, :4] == 0).all()
    with pytest.raises(ValueError, match="rendering of 16x8 pixels does not have the problem's aspect ratio \\(8x8\\)"):
        frames_at_size(frames, 8, 8)


def test_to_uint8_frames_reads_float_images_and_videos_channel_first_clamped_to_0_1():
    import torch

    from app.cv import to_uint8_frames

    image = torch.tensor([-0.5, 0.5, 1.5]).view(3, 1, 1).expand(3, 2, 2)  # [3, H, W]: red below 0, blue above 1
    frames = to_uint8_frames(image)
    assert frames.dtype == np.uint8 and frames.shape == (1, 2, 2, 3)
    assert frames[0, 0, 0].tolist() == [0, 128, 255]  # clamped to [0, 1], then * 255 rounded
    video = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 3, 2, 2) / 2  # [T = 3, 3, H, W]: frame t is grey t / 2
    frames = to_uint8_frames(video)
    assert frames.shape == (3, 2, 2, 3) and frames[:, 0, 0, 0].tolist() == [0, 128, 255]
    with pytest.raises(ValueError, match=re.escape("numpy renderings must be uint8, got float64")):
        to_uint8_frames(np.zeros((2, 2, 3)))


def test_frames_at_size_allows_an_aspect_difference_up_to_the_tolerance_and_says_what_to_do_beyond():
    frames = np.zeros((1, 2, 3, 3), np.uint8)  # 3:2, target 4x4: (3 / 2) / 1 - 1 = 0.5 exactly
    assert frames_at_size(frames, 4, 4, aspect_tolerance=0.5).shape == (1, 4, 4, 3)
    message = (
        "rendering of 3x2 pixels does not have the problem's aspect ratio (4x4): generate at the problem's "
        "aspect ratio (the flow policy's resolution)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        frames_at_size(frames, 4, 4, aspect_tolerance=0.49)


def test_frames_at_size_averages_areas_when_it_shrinks():
    """Each 4x4 block: 200 in its inner 2x2, 0 around it. Area interpolation gives the block mean, 50; bilinear
    interpolation (OpenCV's default) would read only the inner pixels."""
    block = np.zeros((4, 4), np.uint8)
    block[1:3, 1:3] = 200
    frames = np.repeat(np.tile(block, (2, 2))[None, :, :, None], 3, axis=3)  # [1, 8, 8, 3]
    small = frames_at_size(frames, 2, 2)
    assert (small == 50).all()
    assert (cv2.resize(frames[0], (2, 2)) != 50).any()  # the default would not
