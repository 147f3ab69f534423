"""Procedural scenes: deterministic, drawn where the camera projects them, with an honest Omni3D-style record."""

import random

import numpy as np
import pytest

from app.tasks.spatial.geometry import bounds, box_corners, project
from app.tasks.spatial.omni3d import parse_omni3d, to_omni3d
from app.tasks.spatial.render import render_scene
from app.tasks.spatial.scenes import CATEGORIES, Camera, Scene, SceneObject, sample_scene, to_camera


def hand_scene(objects):
    """A 128 x 128 indoor scene, level camera 1.4 m above the floor, objects given as (category, x, z, yaw)."""
    camera = Camera(np.array([[100.0, 0, 64], [0, 100.0, 64], [0, 0, 1]]), 128, 128, 1.4, 0.0)
    specs = {spec.name: spec for spec in CATEGORIES["indoor"]}
    scene = Scene("indoor", camera, [], {"room_width": 8.0, "room_depth": 9.0, "room_height": 2.8})
    scene.palette = {"floor": (150, 120, 92), "wall": (200, 206, 210), "ceiling": (236, 234, 228)}
    for name, x, z, yaw in objects:
        spec = specs[name]
        center = np.array([x, 1.4 - spec.dimensions[1] / 2, z])
        scene.objects.append(SceneObject(name, center, spec.dimensions, yaw, spec.color))
    return scene


@pytest.mark.parametrize("domain", ["indoor", "outdoor"])
def test_rendering_is_deterministic(domain):
    images = [render_scene(sample_scene(random.Random(f"s:{domain}"), domain, 96))[0] for _ in range(2)]
    assert np.array_equal(np.asarray(images[0]), np.asarray(images[1]))
    other = render_scene(sample_scene(random.Random("other"), domain, 96))[0]
    assert not np.array_equal(np.asarray(images[0]), np.asarray(other))


@pytest.mark.parametrize("domain", ["indoor", "outdoor"])
def test_record_matches_the_projection_of_the_boxes(domain):
    scene = sample_scene(random.Random(f"record:{domain}"), domain, 128)
    image, record = render_scene(scene, "scene-0")
    assert image.size == (128, 128) and record.domain == domain and len(record.objects) == len(scene.objects) >= 2
    for obj, scene_obj in zip(record.objects, scene.objects, strict=True):
        center, rotation = to_camera(scene, scene_obj)
        np.testing.assert_allclose(obj.center, center)
        corners = box_corners(obj.center, obj.dimensions, obj.rotation)
        assert corners[:, 2].min() > 0  # in front of the camera
        np.testing.assert_allclose(obj.bbox2d_proj, bounds(project(corners, record.K)))
        trunc = obj.bbox2d_trunc
        assert 0 <= trunc[0] <= trunc[2] <= 128 and 0 <= trunc[1] <= trunc[3] <= 128
        if obj.bbox2d_tight is not None:  # visible pixels lie inside the clipped projected box (1 px of outline)
            assert all(t >= p - 1 for t, p in zip(obj.bbox2d_tight[:2], trunc[:2], strict=True))
            assert all(t <= p + 1 for t, p in zip(obj.bbox2d_tight[2:], trunc[2:], strict=True))
        assert 0.0 <= obj.visibility <= 1.0 and 0.0 <= obj.truncation <= 1.0


def test_a_lone_object_is_fully_visible_and_drawn_in_its_colour():
    scene = hand_scene([("sofa", 0.0, 4.0, 0.3)])
    image, record = render_scene(scene)
    (sofa,) = record.objects
    assert sofa.visibility == pytest.approx(1.0) and sofa.truncation == pytest.approx(0.0)
    x0, y0, x1, y1 = sofa.bbox2d_tight
    pixel = np.asarray(image)[int((y0 + y1) / 2), int((x0 + x1) / 2)].astype(float)
    base = np.array(CATEGORIES["indoor"][2].color, float)  # sofa: a shaded version of its colour
    shade = pixel / base
    assert np.all(shade > 0.45) and np.all(shade < 1.05) and np.ptp(shade) < 0.05


def test_an_object_behind_another_is_partly_occluded():
    scene = hand_scene([("sofa", 0.0, 3.0, 0.0), ("chair", 0.1, 6.0, 0.0), ("lamp", 2.6, 5.0, 0.0)])
    _, record = render_scene(scene)
    sofa, chair, lamp = record.objects
    assert sofa.visibility == pytest.approx(1.0) and lamp.visibility == pytest.approx(1.0)
    assert chair.visibility < 0.6  # mostly hidden behind the sofa


def test_the_record_says_whether_a_box_centre_shows_its_object():
    scene = hand_scene([("sofa", 0.0, 5.0, 0.0), ("lamp", 0.0, 3.0, 0.0), ("chair", -2.0, 4.0, 0.0)])
    _, record = render_scene(scene)
    sofa, lamp, chair = record.objects
    assert sofa.visibility > 0.6 and sofa.center_visible is False  # the lamp stands in front of its middle
    assert lamp.center_visible is True and chair.center_visible is True


def test_records_round_trip_through_omni3d_json():
    _, record = render_scene(sample_scene(random.Random("json"), "outdoor", 96), "scene-7")
    (loaded,) = parse_omni3d(to_omni3d([record]))
    assert (loaded.width, loaded.height) == (96, 96)
    np.testing.assert_allclose(loaded.K, record.K)
    for a, b in zip(loaded.objects, record.objects, strict=True):
        assert a.category == b.category and a.visibility == pytest.approx(b.visibility)
        np.testing.assert_allclose(a.rotation, b.rotation)
        assert a.bbox2d_tight == b.bbox2d_tight


def test_counting_scenes_hold_the_required_objects():
    scene = sample_scene(random.Random("count"), "indoor", 128, num_objects=(1, 1), required=("chair", 4))
    assert sum(obj.category == "chair" for obj in scene.objects) == 4
    with pytest.raises(ValueError, match="'car' is not in the indoor domain"):
        sample_scene(random.Random(0), "indoor", required=("car", 2))
    with pytest.raises(ValueError, match="unknown domain 'moon'"):
        sample_scene(random.Random(0), "moon")
