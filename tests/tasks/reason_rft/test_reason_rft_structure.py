"""Reason-RFT structure perception suite: answers, figures drawn to the stated measures, options, splits, rewards."""

import json
import math
import re
from collections import Counter

import pytest

from app.data.datamodule import VisualTaskDataModule
from app.rewards import AccuracyReward, NumericToleranceReward
from app.tasks.reason_rft.structure import (
    DOMAIN_SHIFT_FAMILIES,
    FAMILIES,
    IN_DOMAIN_FAMILIES,
    SPLITS,
    StructurePerceptionDataset,
    build_problem,
    make_samples,
    render_problem,
)

SIZE = 128
PER_FAMILY = 4


@pytest.fixture(scope="module")
def samples():
    """PER_FAMILY rendered samples of every family: in-domain ones from test_in_domain, all from test_domain_shift."""
    out, seen = [], Counter()
    for split, families in (("test_in_domain", IN_DOMAIN_FAMILIES), ("test_domain_shift", tuple(FAMILIES))):
        index = 0
        while any(seen[split, f] < PER_FAMILY for f in families):
            problem = build_problem(3, split, index)
            index += 1
            if seen[split, problem.family] < PER_FAMILY:
                seen[split, problem.family] += 1
                out.append(render_problem(problem, SIZE))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Independent recomputation of the asked quantity from the givens.

_UP_RIGHT_DOWN_LEFT = {"EGB", "BGE", "AGH", "HGA", "GHD", "DHG", "CHF", "FHC"}


def recompute(family: str, g: dict, asked: str) -> float:
    if family == "triangle_angle_sum":
        return 180 - g["angle_BAC"] - g["angle_ABC"]
    if family == "isosceles_triangle":
        return (180 - g["angle_BAC"]) / 2 if asked == "angle_ABC" else 180 - 2 * g["angle_ABC"]
    if family == "right_triangle":
        return math.hypot(g["AC"], g["BC"]) if asked == "AB" else math.sqrt(g["AB"] ** 2 - g["AC"] ** 2)
    if family == "parallel_lines":  # angles up-right / down-left of a crossing equal theta, the others 180 - theta
        ((name, value),) = g.items()
        same = (name[6:] in _UP_RIGHT_DOWN_LEFT) == (asked[6:] in _UP_RIGHT_DOWN_LEFT)
        return value if same else 180 - value
    if family == "inscribed_angle":
        return 2 * g["angle_ACB"] if asked == "angle_AOB" else g["angle_AOB"] / 2
    if family == "rectangle":
        return 2 * (g["AB"] + g["BC"]) if asked.startswith("perimeter") else g["AB"] * g["BC"]
    if family == "similar_triangles":
        ab = g["AD"] + g["DB"]
        return g["DE"] * ab / g["AD"] if asked == "BC" else g["BC"] * g["AD"] / ab
    if family == "tangent_radius":
        return math.hypot(g["OT"], g["PT"]) if asked == "OP" else 90 - g["angle_OPT"]
    if family == "parallelogram":
        return g["AB"] * g["DE"] if asked.startswith("area") else 2 * (g["AB"] + g["AD"])
    raise AssertionError(f"no recomputation for family {family}")


def test_every_family_has_a_recomputation_and_answers_match_it_over_many_problems():
    checked = Counter()
    for split in ("train", "test_domain_shift"):
        for index in range(600):
            problem = build_problem(0, split, index)
            program = problem.program
            expected = recompute(problem.family, program.givens, program.asked)
            assert float(program.answer) == pytest.approx(expected, abs=1e-9), (problem.family, program.givens)
            checked[problem.family] += 1
    assert set(checked) == set(FAMILIES)


def test_stored_answer_and_value_match_the_recomputation_from_meta(samples):
    for s in samples:
        m = s.meta
        expected = recompute(m["family"], m["givens"], m["asked"])
        assert float(m["solution"]) == pytest.approx(expected, abs=1e-9)
        assert re.fullmatch(r"\d+(\.\d{1,2})?", m["solution"]), m["solution"]  # an integer or a simple decimal
        if m["answer_type"] == "numeric":
            assert s.answer == m["solution"] and m["options"] == []
        else:
            assert m["options"]["ABCD".index(s.answer)] == m["solution"]


# ---------------------------------------------------------------------------------------------------------------------
# The figure: drawn to scale, givens written on it, inside the image and visible.


def angle_at(points: dict, name: str) -> float:
    """``angle_XYZ`` measured at Y from the pixel positions."""
    x, y, z = (points[c] for c in name[6:])
    a1 = math.atan2(x[1] - y[1], x[0] - y[0])
    a2 = math.atan2(z[1] - y[1], z[0] - y[0])
    d = abs(math.degrees(a1 - a2)) % 360
    return min(d, 360 - d)


def length(points: dict, name: str) -> float:
    return math.dist(points[name[0]], points[name[1]])


def measured(m: dict, name: str, scale: float) -> float:
    """The quantity ``name`` measured on the figure (lengths in problem units with ``scale`` pixels per unit)."""
    p = m["points"]
    if name.startswith("angle_"):
        return angle_at(p, name)
    if name == "perimeter_ABCD":
        return 2 * (length(p, "AB") + length(p, "BC")) / scale
    if name == "area_ABCD":
        height = length(p, "BC") if m["family"] == "rectangle" else length(p, "DE")
        return length(p, "AB") * height / scale**2
    return length(p, name) / scale


def test_figures_are_drawn_to_the_stated_measures(samples):
    for s in samples:
        m, p = s.meta, s.meta["points"]
        lengths = {k: v for k, v in m["givens"].items() if not k.startswith("angle_")}
        scales = [length(p, k) / v for k, v in lengths.items()]
        scale = scales[0] if scales else None
        assert all(x == pytest.approx(scale, rel=0.01) for x in scales), (m["family"], scales)
        for name, value in m["givens"].items():
            got = measured(m, name, scale)
            assert got == pytest.approx(value, abs=0.3 if name.startswith("angle_") else 0.02 * value), (m, name)
        if m["asked"].startswith("angle_") or scale is not None:
            assert measured(m, m["asked"], scale) == pytest.approx(float(m["solution"]), rel=0.02), m


def direction(p: dict, a: str, b: str) -> float:
    return math.degrees(math.atan2(p[b][1] - p[a][1], p[b][0] - p[a][0])) % 180


def test_figures_show_the_stated_relations(samples):
    for s in samples:
        family, p = s.meta["family"], s.meta["points"]
        if family == "right_triangle":
            assert angle_at(p, "angle_ACB") == pytest.approx(90, abs=0.2)
        if family == "tangent_radius":
            assert angle_at(p, "angle_OTP") == pytest.approx(90, abs=0.2)
        if family == "parallel_lines":
            assert direction(p, "A", "B") == pytest.approx(direction(p, "C", "D"), abs=0.2)
        if family == "similar_triangles":
            assert direction(p, "D", "E") == pytest.approx(direction(p, "B", "C"), abs=0.2)
        if family == "isosceles_triangle":
            assert length(p, "AB") == pytest.approx(length(p, "AC"), rel=0.005)
        if family == "inscribed_angle":
            radii = [math.dist(p["O"], p[c]) for c in "ABC"]
            assert max(radii) == pytest.approx(min(radii), rel=0.005)
        if family in ("rectangle", "parallelogram"):
            assert direction(p, "A", "B") == pytest.approx(direction(p, "D", "C"), abs=0.2)
            assert direction(p, "A", "D") == pytest.approx(direction(p, "B", "C"), abs=0.2)


def assert_visible(sample, box: list[float]) -> None:
    x0, y0, x1, y1 = box
    assert 0 <= x0 < x1 <= SIZE and 0 <= y0 < y1 <= SIZE, box
    crop = sample.images[0].crop((math.floor(x0), math.floor(y0), math.ceil(x1), math.ceil(y1)))
    background = sample.images[0].getpixel((0, 0))
    ink = max(sum(abs(a - b) for a, b in zip(px, background, strict=True)) for px in crop.get_flattened_data())
    assert ink > 150, f"no ink in text box {box}"


def test_givens_and_point_letters_are_written_inside_the_image(samples):
    for s in samples:
        m = s.meta
        texts = {t["ref"]: t for t in m["texts"] if t["kind"] != "point"}
        for name, value in m["givens"].items():
            written = f"{value:g}°" if name.startswith("angle_") else f"{value:g}"
            assert texts[name]["text"] == written, (m["family"], name)
            assert_visible(s, texts[name]["box"])
        marked = m["split"] == "test_domain_shift" and not m["asked"].startswith(("area", "perimeter"))
        assert (m["asked"] in texts) == marked
        if marked:
            assert texts[m["asked"]]["text"] in ("x", "x°") and s.question.startswith("Find x.")
        letters = {t["ref"]: t for t in m["texts"] if t["kind"] == "point"}
        assert set(letters) == set(m["points"])
        for letter in letters.values():
            assert_visible(s, letter["box"])


def test_styles_textbook_blue_in_domain_monochrome_antialiased_domain_shift(samples):
    for s in samples:
        pixels = list(s.images[0].get_flattened_data())
        coloured = sum(1 for r, g, b in pixels if b - r > 60)
        if s.meta["split"] == "test_domain_shift":
            assert s.meta["style"] == "monochrome" and coloured == 0
        else:
            assert s.meta["style"] == "textbook" and coloured > 20
        assert len({sum(px) for px in pixels}) > 20  # supersampled: many intermediate grey levels on the edges


# ---------------------------------------------------------------------------------------------------------------------
# Options, splits, rewards, determinism, errors.


def test_choice_options_distinct_plausible_and_correct_position_and_rank_uniform():
    positions, ranks = Counter(), Counter()
    for split in ("train", "test_domain_shift"):
        for index in range(1000):
            problem = build_problem(7, split, index)
            if problem.answer_type != "choice":
                continue
            values = [float(o) for o in problem.options]
            assert len(set(problem.options)) == 4 and all(v > 0 for v in values), problem.options
            if problem.program.unit == "degrees":
                assert max(values) < 180
            correct = "ABCD".index(problem.answer)
            assert values[correct] == float(problem.program.answer)
            assert f"{problem.answer}. {problem.options[correct]}" in problem.question
            positions[correct] += 1
            ranks[sorted(values).index(values[correct])] += 1
    total = sum(positions.values())
    assert 800 < total < 1200  # half the problems are multiple choice
    for counts in (positions, ranks):
        assert all(abs(counts[k] / total - 0.25) < 0.05 for k in range(4)), counts


def test_splits_use_the_documented_families_and_presentation():
    for split in SPLITS:
        problems = [build_problem(1, split, i) for i in range(300)]
        families = {p.family for p in problems}
        shifted = split == "test_domain_shift"
        assert families == (set(FAMILIES) if shifted else set(IN_DOMAIN_FAMILIES)), split
        assert not shifted or set(DOMAIN_SHIFT_FAMILIES) <= families
        assert {p.style for p in problems} == {"monochrome" if shifted else "textbook"}
        assert all(p.question.startswith("Find" if shifted else "As shown in the figure") for p in problems)
        assert {p.givens_in_text for p in problems} == ({False} if shifted else {False, True})
        assert all((p.reasoning is not None) == (split == "cot_sft") for p in problems)


def test_cot_reasoning_derives_the_answer():
    problems = [build_problem(2, "cot_sft", i) for i in range(60)]
    for p in problems:
        value = p.program.answer
        assert p.reasoning.rstrip(".").endswith(f"This is choice {p.answer}") or p.answer_type == "numeric"
        assert re.search(rf"= {re.escape(str(float(value)).removesuffix('.0'))}(°|\.|$)", p.reasoning), p.reasoning
    triangle = next(p for p in problems if p.family == "triangle_angle_sum")
    assert "sum to 180°" in triangle.reasoning


def test_rewards_score_the_target_answer_one(samples):
    accuracy, numeric = AccuracyReward(), NumericToleranceReward()
    for s in samples:
        target = f"<think>{s.reasoning or ''}</think><answer>{s.answer}</answer>"
        if s.meta["answer_type"] == "choice":
            wrong = next(letter for letter in "ABCD" if letter != s.answer)
            scores = accuracy.score([target, f"<answer>{wrong}</answer>"], [s, s])
            assert scores.tolist() == [1.0, 0.0]
        else:
            far = f"<answer>{float(s.answer) * 1.5 + 1}</answer>"
            assert numeric.score([target, far], [s, s]).tolist() == [1.0, 0.0]
            assert accuracy.score([target], [s]).tolist() == [1.0]


def test_samples_are_deterministic_and_independent_of_count_and_split():
    def key(sample):
        return sample.images[0].tobytes(), sample.question, sample.answer, json.dumps(sample.meta)

    first = [key(s) for s in make_samples(3, seed=5, split="train", image_size=96)]
    again = [key(s) for s in make_samples(5, seed=5, split="train", image_size=96)]
    assert first == again[:3]
    dataset = StructurePerceptionDataset(3, seed=5, image_size=96, split="train")
    assert [key(dataset[i]) for i in range(3)] == first
    other_seed = [key(s) for s in make_samples(3, seed=6, split="train", image_size=96)]
    other_split = [key(s) for s in make_samples(3, seed=5, split="test_in_domain", image_size=96)]
    assert all(a != b for a, b in zip(first, other_seed, strict=True))
    assert all(a != b for a, b in zip(first, other_split, strict=True))


def test_meta_is_json_serialisable_with_plain_types(samples):
    for s in samples:
        assert json.loads(json.dumps(s.meta)) == s.meta  # tuples or numpy scalars would not survive the round trip
        assert {"family", "answer_type", "options", "givens", "unit"} <= set(s.meta)
        assert s.meta["unit"] in ("degrees", "cm", "cm^2")


def test_unlabeled_dataset_hides_answer_and_reasoning_and_datamodule_serves_the_task():
    sample = StructurePerceptionDataset(1, seed=0, image_size=96, split="cot_sft", labeled=False)[0]
    assert sample.answer is None and sample.reasoning is None and sample.meta["family"] in IN_DOMAIN_FAMILIES
    dm = VisualTaskDataModule(
        dataset=StructurePerceptionDataset, train_size=4, val_size=2, test_size=2, batch_size=2, image_size=96
    )
    batch = next(iter(dm.train_dataloader()))
    assert [s.task for s in batch] == ["rrft_structure"] * 2 and batch[0].images[0].size == (96, 96)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="unknown split 'val'.*test_domain_shift"):
        next(make_samples(1, seed=0, split="val"))
    with pytest.raises(ValueError, match="image_size must be at least 64"):
        StructurePerceptionDataset(1, seed=0, image_size=32)
    with pytest.raises(ValueError, match="num must be >= 0"):
        next(make_samples(-1, seed=0, split="train"))
    with pytest.raises(IndexError, match="index 1 out of range for 1 samples"):
        StructurePerceptionDataset(1, seed=0)[1]
