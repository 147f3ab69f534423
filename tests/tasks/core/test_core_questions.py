"""CoRe question generation: templates, the comparator, shuffled options, the structured target response."""

import random

import pytest

from app.formats import PAIRS, TRIPLET_RESPONSE_INSTRUCTION
from app.rewards.triplet_parsing import parse_triplet_response
from app.tasks.core import TASK_TEXTS, build_question
from app.tasks.core.questions import compare

VALUES = {
    "counting": [7, 3, 5],
    "depth": [4.123, 9.87, 6.0],
    "distance": [12.5, 3.25, 7.0],
    "spatial": ["left", "left", "below"],
}
NAMES = {"distance": ("white ball", None), "spatial": ("yellow cube", "blue ball")}


def test_template_library():
    for task, text in TASK_TEXTS.items():
        keys = [t.key for t in text.templates]
        assert len(set(keys)) == len(keys) and all(k.startswith(task + "/") for k in keys)
        directions = [t.direction for t in text.templates]
        if text.answer_type == "ordinal":
            assert directions.count("larger") >= 3 and directions.count("smaller") >= 3
        else:
            assert set(directions) == {None} and len(directions) >= 3


def test_compare():
    assert compare(7, 3, 1, 2, "larger") == "1" and compare(7, 3, 1, 2, "smaller") == "2"
    assert compare(2.0, 9.0, 2, 3, "larger") == "3" and compare(4, 4, 1, 3, "larger") == "same"
    assert compare("left", "left", 1, 2, None) == "same" and compare("left", "above", 1, 2, None) == "different"


@pytest.mark.parametrize("task", list(VALUES))
def test_question_ground_truth_and_target(task):
    subject, reference = NAMES.get(task, (None, None))
    q = build_question(task, VALUES[task], random.Random(3), subject, reference)
    assert q.question.endswith(TRIPLET_RESPONSE_INSTRUCTION)
    assert all(f"\n{pair}: " in q.question for pair in PAIRS)
    if subject:
        assert subject in q.question and (reference is None or reference in q.question)
    for pair in PAIRS:
        i, j = int(pair[0]) - 1, int(pair[2]) - 1
        assert q.options[pair][q.answer_positions[pair]] == q.pair_answers[pair]
        if task == "spatial":
            assert sorted(q.options[pair]) == ["different", "same"]
            assert q.pair_answers[pair] == ("same" if VALUES[task][i] == VALUES[task][j] else "different")
        else:
            assert sorted(q.options[pair]) == sorted([pair[0], pair[2]])
            larger = VALUES[task][i] > VALUES[task][j]
            winner = pair[0] if larger == (q.direction == "larger") else pair[2]
            assert q.pair_answers[pair] == winner
    parsed = parse_triplet_response(f"<think>{q.reasoning}</think><answer>{q.answer}</answer>")
    assert parsed.answers == parsed.judgments == q.pair_answers
    assert list(parsed.attributes) == pytest.approx(q.attributes)
    expected = {"counting": [7, 3, 5], "depth": [4.12, 9.87, 6.0], "distance": [12.5, 3.25, 7.0], "spatial": [1, 1, 4]}
    assert q.attributes == expected[task]


def test_correct_option_positions_are_uniform():
    """Over 300 triplets (900 sub-questions) the correct option sits first about half the time, for every task."""
    rng = random.Random(0)
    for task, values in VALUES.items():
        subject, reference = NAMES.get(task, (None, None))
        first = sum(
            position == 0
            for _ in range(300)
            for position in build_question(task, values, rng, subject, reference).answer_positions.values()
        )
        assert abs(first / 900 - 0.5) < 4 * (0.25 / 900) ** 0.5, (task, first)  # within 4 standard deviations


def test_templates_and_directions_all_used():
    rng = random.Random(1)
    used = {build_question("counting", [1, 4, 6], rng).template for _ in range(200)}
    assert used == {t.key for t in TASK_TEXTS["counting"].templates}


def test_unknown_task_and_tie():
    with pytest.raises(ValueError, match="unknown CoRe task 'size'"):
        build_question("size", [1, 2, 3], random.Random(0))
    with pytest.raises(ValueError, match="no correct option"):
        build_question("counting", [2, 2, 5], random.Random(0))
