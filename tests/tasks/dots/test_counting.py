import pytest

from app.tasks.dots import CountingDataset
from app.tasks.dots.triplets import BACKGROUND, DOT


def _colours(image):
    return {colour for _, colour in image.getcolors(maxcolors=1 << 16)}


def test_dots_are_blue_by_default_and_take_the_given_colour():
    blue = CountingDataset(4, seed=0, image_size=64, dot_radius=4)
    red = CountingDataset(4, seed=0, image_size=64, dot_radius=4, dot_color=(220, 30, 30))
    for i in range(4):
        assert _colours(blue[i].images[0]) == {BACKGROUND, DOT}
        assert _colours(red[i].images[0]) == {BACKGROUND, (220, 30, 30)}
        assert red[i].answer == blue[i].answer  # the colour changes the look, not the scene


def test_dot_colour_is_checked():
    with pytest.raises(ValueError, match="dot_color"):
        CountingDataset(1, seed=0, dot_color=(0, 0, 300))
