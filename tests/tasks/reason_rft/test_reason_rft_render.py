"""The CLEVR-like renderer and scene sampler of the Reason-RFT suites: geometry, occlusion, framing, materials,
viewpoints, shadows, determinism."""

import math
import random

import numpy as np
import pytest

from app.tasks.reason_rft.render import VIEWS, Camera, in_frame, render, visible_fractions
from app.tasks.reason_rft.scene import (
    NEW_SHAPES,
    REGION_RADIUS,
    SHAPES,
    SIZES,
    SceneObject,
    fits,
    place,
    random_object,
    sample_scene,
)


def pixels(objects, view="front", size=64):
    return np.asarray(render(objects, view, size).image).astype(float)


def test_render_is_deterministic_and_sized():
    scene = [
        SceneObject("cube", "red", "large", "metal", -1.0, 0.5, 30.0),
        SceneObject("cone", "cyan", "small", "rubber"),
    ]
    a, b = render(scene, "left", 48), render(scene, "left", 48)
    assert a.image.size == (48, 48) and a.image.mode == "RGB"
    assert a.image.tobytes() == b.image.tobytes() and a.boxes == b.boxes


@pytest.mark.parametrize("shape", SHAPES + NEW_SHAPES)
def test_a_lone_object_is_fully_visible_and_boxed_around_its_centre(shape):
    obj = SceneObject(shape, "blue", "large", "rubber", 0.5, -0.5, 10.0)
    out = render([obj], "front", 64)
    assert out.visible_fraction == [pytest.approx(1.0)]
    x0, y0, x1, y1 = out.boxes[0]
    u, v = Camera.view("front").project((obj.x, obj.y, obj.height / 2), 64)
    assert x0 < u < x1 and y0 < v < y1
    # the box holds the object's colour: blue dominates red inside it
    crop = pixels([obj])[y0:y1, x0:x1]
    assert (crop[..., 2] - crop[..., 0]).max() > 80


def test_sizes_and_shapes_have_the_expected_footprints():
    small, large = (
        render([SceneObject("sphere", "red", s, "rubber")], "front", 64).boxes[0] for s in ("small", "large")
    )
    assert (large[2] - large[0]) > 1.6 * (small[2] - small[0])
    assert SceneObject("cube", "red", "large", "rubber").radius > SIZES["large"]  # a cube's corners reach further
    assert SceneObject("sphere", "red", "large", "rubber").radius == SIZES["large"]


def test_occluded_object_reports_a_small_visible_fraction():
    front = SceneObject("cube", "gray", "large", "rubber", 0.0, -1.0)
    hidden = SceneObject("sphere", "red", "small", "rubber", 0.0, -0.1)
    fractions = render([front, hidden], "front", 64).visible_fraction
    assert fractions[0] == pytest.approx(1.0) and fractions[1] < 0.4
    assert visible_fractions([front, hidden], "front", 48)[1] < 0.4


def test_occlusion_depends_on_the_viewpoint():
    # the cube stands between the sphere and the right camera, not between the sphere and the others
    cube = SceneObject("cube", "gray", "large", "rubber", 0.8, -0.8, 45.0)
    sphere = SceneObject("sphere", "red", "small", "rubber")
    seen = {view: visible_fractions([cube, sphere], view, 48)[1] for view in VIEWS}
    assert seen["right"] < 0.3 and seen["front"] > 0.5 and seen["left"] == pytest.approx(1.0)


def test_objects_outside_the_picture_count_as_invisible():
    edge = SceneObject("cylinder", "green", "large", "rubber", REGION_RADIUS + 2.0, 0.0)
    assert not in_frame(edge, Camera.view("front"))
    assert visible_fractions([edge], "front") == [0.0]
    assert render([edge], "front", 32).visible_fraction == [0.0]


def test_metal_is_shinier_and_more_contrasted_than_rubber():
    def stats(material):
        obj = SceneObject("sphere", "red", "large", "rubber" if material == "rubber" else "metal")
        image = pixels([obj], size=96)
        x0, y0, x1, y1 = render([obj], "front", 96).boxes[0]
        crop = image[y0:y1, x0:x1]
        red = crop[(crop[..., 0] > crop[..., 2] + 20) | (crop.min(axis=-1) > 200)]  # the sphere and its highlight
        return red.min(axis=-1).max(), red[:, 0].std()

    rubber_white, rubber_std = stats("rubber")
    metal_white, metal_std = stats("metal")
    assert metal_white > 200 > rubber_white  # a white specular highlight only on metal
    assert metal_std > 1.3 * rubber_std


def test_objects_cast_shadows_on_the_ground():
    obj = SceneObject("cube", "yellow", "large", "rubber")
    empty, scene = pixels([]), pixels([obj])
    x0, y0, x1, y1 = render([obj], "front", 64).boxes[0]
    outside = np.ones(empty.shape[:2], dtype=bool)
    outside[y0:y1, x0:x1] = False
    darker = (scene.sum(axis=-1) < empty.sum(axis=-1) - 30) & outside
    assert darker.sum() > 10  # a shadow beside the object
    assert (scene.sum(axis=-1) > empty.sum(axis=-1) + 30)[outside].sum() == 0  # nothing else changes


def test_the_ground_shows_perspective():
    ground = pixels([], size=64).mean(axis=(1, 2))  # mean brightness per row
    assert ground[-1] > ground[0] + 5  # near ground is lit, far ground fades


def test_viewpoints_turn_the_camera_about_the_vertical_axis():
    assert set(VIEWS) == {"front", "left", "right"}
    left, front, right = (Camera.view(v).frame()[0] for v in ("left", "front", "right"))
    assert left[0] < 0 < right[0] and front[0] == pytest.approx(0.0)
    assert np.linalg.norm(left) == pytest.approx(np.linalg.norm(front)) == pytest.approx(np.linalg.norm(right))
    behind = (0.0, 2.0, 0.0)
    u = {v: Camera.view(v).project(behind, 100)[0] for v in VIEWS}
    assert u["left"] < 45 and u["front"] == pytest.approx(50, abs=1) and u["right"] > 55
    obj = [SceneObject("cube", "red", "large", "rubber", 1.5, 1.0, 15.0)]
    images = {v: render(obj, v, 48).image.tobytes() for v in VIEWS}
    assert len(set(images.values())) == 3


def test_scene_objects_reject_unknown_attributes_by_name():
    with pytest.raises(ValueError, match="unknown color 'pink'"):
        SceneObject("cube", "pink", "large", "rubber")
    with pytest.raises(ValueError, match="unknown material 'glass'"):
        SceneObject("cube", "red", "large", "glass")
    with pytest.raises(ValueError, match="unknown view 'top'"):
        Camera.view("top")


def test_sampled_scenes_fit_without_overlap():
    rng = random.Random(0)
    for _ in range(5):
        scene = sample_scene(
            rng, lambda r: [random_object(r, SHAPES, ("small", "large")) for _ in range(8)], lambda s: True
        )
        assert len(scene) == 8
        for i, obj in enumerate(scene):
            assert fits(obj, scene[:i] + scene[i + 1 :])
            assert math.hypot(obj.x, obj.y) <= REGION_RADIUS


def test_placement_gives_up_when_the_region_is_full():
    big = SceneObject("cube", "red", "large", "rubber")
    crowd = [SceneObject("cube", "red", "large", "rubber", x, y) for x in (-2.0, 0.0, 2.0) for y in (-2.0, 0.0, 2.0)]
    assert place(random.Random(0), big, crowd, tries=50) is None
    with pytest.raises(RuntimeError, match="no acceptable scene in 3 tries"):
        sample_scene(random.Random(0), lambda r: [big], lambda s: False, tries=3)
