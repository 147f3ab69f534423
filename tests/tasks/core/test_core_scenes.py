"""CoRe procedural annotation source: the render's geometry, and annotations that agree with the picture."""

import random

import numpy as np
import pytest

from app.tasks.core.metrics import count_instances, median_depth, spatial_relation
from app.tasks.core.render import Camera, Primitive, instance_box, render
from app.tasks.core.scenes import _SKIN, MARKER, PERSON, SceneConfig, crowd_scene, object_scene, relation_scene


def test_render_geometry():
    camera = Camera(image_size=96, height=1.5, pitch_deg=10.0)
    center = np.array([1.0, 1.0, 6.0])  # world: 1 m right, ball touching the ground (Y = 1.5), 6 m ahead
    view = render(camera, [(0, Primitive("sphere", tuple(center), (1.0, 1.0, 1.0), (200, 30, 30)))])
    assert view.depth.shape == (96, 96) and view.depth.dtype == np.float32
    box = instance_box(view.instances, 0)
    u, v = camera.project(center)
    assert abs((box[0] + box[2]) / 2 - u) < 1.0 and abs((box[1] + box[3]) / 2 - v) < 1.0
    # the nearest point of the sphere lies about one radius in front of its camera-frame centre
    z = camera.to_camera(center)[2]
    assert view.depth[int(v), int(u)] == pytest.approx(z - 0.5, abs=0.05)
    # ground pixels: depth of the plane Y = height along each ray; sky: the far cap
    rays = camera.rays()
    assert view.depth[95, 5] == pytest.approx(1.5 / rays[95, 5, 1], rel=1e-5)
    assert view.depth[0, 0] == 100.0 and (view.instances[:, :20] == -1).all()
    pixel = np.asarray(view.image)[int(v), int(u)]
    assert pixel[0] > 2 * pixel[1]  # the red ball is where the camera projects it


def test_crowd_points_sit_on_visible_heads():
    scene = crowd_scene(random.Random(0), 128, 9)
    assert count_instances(scene.points) == 9
    people = [k for k, box in enumerate(scene.boxes) if box.category == PERSON]
    assert len(people) == 9 and len(scene.objects) == len(scene.boxes) > 9  # plus cubes / balls that are not people
    for x, y in scene.points:  # every head point is visible, on a head: a shaded skin colour (colour x one factor)
        pixel = np.asarray(scene.image)[int(y), int(x)].astype(float)
        assert any(np.ptp(pixel / np.array(skin)) < 0.03 for skin in _SKIN), pixel


def test_object_scene_depth_and_3d_annotations_agree():
    for seed in range(5):
        scene = object_scene(random.Random(seed), 128, query=True)
        categories = [o.category for o in scene.objects]
        assert len(set(categories)) == len(categories)
        queried = [
            k for k, o in enumerate(scene.boxes) if scene.region[int(sum(o.box[1::2]) / 2), int(sum(o.box[::2]) / 2)]
        ]
        assert len(queried) == 1
        obj = scene.objects[queried[0]]
        depth = median_depth(scene.depth, scene.region)
        assert obj.center[2] - obj.size[0] <= depth <= obj.center[2]  # the visible front of the object
        x0, y0, x1, y1 = scene.boxes[queried[0]].box
        marker = np.asarray(scene.image)[y0 - 2, x0 + 1 : x1 - 1]
        assert (marker == MARKER).all()  # the red box outlines the queried region


@pytest.mark.parametrize("relation", ["left", "right", "above", "below"])
def test_relation_scene_realises_the_relation(relation):
    scene = relation_scene(random.Random(7), 128, "yellow cube", "blue ball", relation)
    assert spatial_relation(scene.boxes, "yellow cube", "blue ball") == relation


def test_scenes_are_deterministic_and_configurable():
    a, b = crowd_scene(random.Random(4), 96, 3), crowd_scene(random.Random(4), 96, 3)
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image)) and np.array_equal(a.depth, b.depth)
    assert a.summary() == b.summary() and len(a.summary()["points"]) == 3
    with pytest.raises(ValueError, match="count_range"):
        SceneConfig(count_range=(5, 2))
    with pytest.raises(ValueError, match="cannot place 60 people"):
        crowd_scene(random.Random(0), 64, 60)
