"""The problem programs of the structure perception suite (Reason-RFT Appendix A.2, docs/algorithms.md#papers): one
function per family.

A program draws its parameters from ``rng``, builds the figure (exact coordinates, so the drawing shows the stated
angles and lengths to scale), and computes the asked quantity exactly (a ``Fraction``, an integer or a simple decimal).
With ``mark_unknown`` the asked angle or length is labelled ``x`` on the figure (Geometry3K's "Find x." style).
Quantities are named ``angle_ABC`` (the angle at B) and ``AB`` (a length); ``area_ABCD`` / ``perimeter_ABCD`` for
shapes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from app.tasks.reason_rft.geometry import AngleMark, Circle, Figure, LengthMark, Segment, orient, polar


@dataclass
class Program:
    """One generated problem before presentation.

    Attributes:
        figure: the diagram, givens written on it.
        givens: quantity name -> value written on the figure.
        asked: name of the asked quantity; ``answer`` its exact value and ``unit`` its unit.
        asked_text: how the question names it (``"∠ACB"``, ``"the area of rectangle ABCD"``).
        setting: the configuration in words (``"AB ∥ CD ..."``); ``relations``: the same as short facts.
        given_text: the givens in words, for questions that also state them.
        asked_on_figure: whether ``mark_unknown`` put an ``x`` on the figure.
        reasoning: the derivation, one or two sentences ending with the answer.
        distractors: plausible wrong values (common mistakes), for multiple-choice options.
        note: a sentence a figure-only question needs (the tangent assumption of Geometry3K).
    """

    figure: Figure
    givens: dict[str, float]
    asked: str
    answer: Fraction
    unit: str
    asked_text: str
    setting: str
    given_text: str
    asked_on_figure: bool
    reasoning: str
    distractors: list[float]
    relations: list[str] = field(default_factory=list)
    note: str = ""


def num(value: float | Fraction) -> str:
    """``value`` as written in a problem: an integer, or a decimal with at most two places (exact).

    >>> num(Fraction(105, 2)), num(7.0), num(Fraction(1, 3))
    ('52.5', '7', '0.33')
    """
    value = Fraction(value).limit_denominator(10_000)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


def _sq(value: Fraction) -> str:
    return f"{num(value)}²"


def _deg(value: float | Fraction) -> str:
    return f"{num(value)}°"


def _orient(points: dict, rng: random.Random, max_rotation: float) -> dict:
    return orient(points, rng.uniform(-max_rotation, max_rotation), rng.random() < 0.5)


def _angle(vertex: str, start: str, end: str, text: str | None) -> AngleMark:
    return AngleMark(vertex, start, end, text)


def triangle_angle_sum(rng: random.Random, mark_unknown: bool) -> Program:
    """Two angles of a triangle given; the third from the angle sum (180°)."""
    while (c := 180 - (a := rng.randint(35, 100)) - (b := rng.randint(35, 100))) < 35:
        pass
    ac = 10 * math.sin(math.radians(b)) / math.sin(math.radians(c))  # law of sines, AB = 10
    points = _orient({"A": (0, 0), "B": (10, 0), "C": polar(ac, a)}, rng, 20)
    angles = [_angle("A", "B", "C", _deg(a)), _angle("B", "A", "C", _deg(b))]
    angles += [_angle("C", "A", "B", "x°")] if mark_unknown else []
    sides = [Segment("A", "B"), Segment("B", "C"), Segment("C", "A")]
    return Program(
        figure=Figure(points, sides, angles=angles),
        givens={"angle_BAC": a, "angle_ABC": b},
        asked="angle_ACB",
        answer=Fraction(c),
        unit="degrees",
        asked_text="∠ACB",
        setting="ABC is a triangle",
        given_text=f"∠BAC = {a}° and ∠ABC = {b}°",
        asked_on_figure=mark_unknown,
        reasoning=f"The angles of a triangle sum to 180°, so ∠ACB = 180° - {a}° - {b}° = {c}°.",
        distractors=[180 - a, 180 - b, a + b, abs(a - b), (a + b) / 2, 90 - c / 2],
    )


def isosceles_triangle(rng: random.Random, mark_unknown: bool) -> Program:
    """AB = AC (tick marks): the apex angle gives the base angles, or a base angle gives the apex angle."""
    if rng.random() < 0.5:
        apex = Fraction(rng.randint(30, 120))
        base, given, asked = (180 - apex) / 2, {"angle_BAC": int(apex)}, "angle_ABC"
        given_text = f"∠BAC = {apex}°"
        reasoning = f"AB = AC, so the base angles are equal: ∠ABC = ∠ACB = (180° - {apex}°) / 2 = {_deg(base)}."
        answer, distractors = base, [180 - apex, apex, apex / 2, 180 - 2 * apex, 90 - apex]
    else:
        base = Fraction(rng.randint(30, 75))
        apex, given, asked = 180 - 2 * base, {"angle_ABC": int(base)}, "angle_BAC"
        given_text = f"∠ABC = {base}°"
        reasoning = f"AB = AC, so ∠ACB = ∠ABC = {base}°, and ∠BAC = 180° - 2 × {base}° = {apex}°."
        answer, distractors = apex, [base, 180 - base, 90 - base / 2, 2 * base, 180 - 3 * base]
    height = 5 / math.tan(math.radians(apex / 2))
    points = _orient({"A": (0, height), "B": (-5, 0), "C": (5, 0)}, rng, 15)
    marks = {"angle_BAC": ("A", "B", "C"), "angle_ABC": ("B", "A", "C")}
    angles = [_angle(*marks[name], _deg(value)) for name, value in given.items()]
    angles += [_angle(*marks[asked], "x°")] if mark_unknown else []
    sides = [Segment("A", "B", ticks=1), Segment("A", "C", ticks=1), Segment("B", "C")]
    text = "∠ABC" if asked == "angle_ABC" else "∠BAC"
    return Program(
        figure=Figure(points, sides, angles=angles),
        givens=given,
        asked=asked,
        answer=answer,
        unit="degrees",
        asked_text=text,
        setting="in triangle ABC, AB = AC",
        given_text=given_text,
        asked_on_figure=mark_unknown,
        reasoning=reasoning,
        distractors=[float(d) for d in distractors],
        relations=["AB = AC"],
    )


TRIPLES = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29))


def right_triangle(rng: random.Random, mark_unknown: bool) -> Program:
    """∠ACB = 90° (right-angle mark): the hypotenuse from the legs, or a leg from the hypotenuse and the other leg."""
    scale = rng.choice((Fraction(1, 2), Fraction(1), Fraction(2), Fraction(3)))
    a, b, c = (scale * side for side in rng.choice(TRIPLES))
    if rng.random() < 0.5:
        a, b = b, a
    points = _orient({"C": (0, 0), "B": (float(a), 0), "A": (0, float(b))}, rng, 25)
    angles = [AngleMark("C", "A", "B", right=True)]
    if rng.random() < 0.5:
        given, asked, answer = {"AC": b, "BC": a}, "AB", c
        reasoning = f"AB = √(AC² + BC²) = √({_sq(b)} + {_sq(a)}) = √{num(b * b + a * a)} = {num(c)}."
        distractors = [a + b, abs(a - b), a * b / 2, c + 1, 2 * c]
    else:
        given, asked, answer = {"AB": c, "AC": b}, "BC", a
        reasoning = f"BC = √(AB² - AC²) = √({_sq(c)} - {_sq(b)}) = √{num(c * c - b * b)} = {num(a)}."
        distractors = [c - b, c + b, math.sqrt(c * c + b * b), (c + b) / 2, b]
    lengths = [LengthMark(*name, num(value)) for name, value in given.items()]
    lengths += [LengthMark(*asked, "x")] if mark_unknown else []
    sides = [Segment("A", "B"), Segment("B", "C"), Segment("C", "A")]
    return Program(
        figure=Figure(points, sides, angles=angles, lengths=lengths),
        givens={k: float(v) for k, v in given.items()},
        asked=asked,
        answer=answer,
        unit="cm",
        asked_text=f"the length of {asked}",
        setting="in triangle ABC, ∠ACB = 90°",
        given_text=" and ".join(f"{k} = {num(v)} cm" for k, v in given.items()),
        asked_on_figure=mark_unknown,
        reasoning=f"∠ACB = 90°, so by the Pythagorean theorem {reasoning}",
        distractors=[float(d) for d in distractors],
        relations=["∠ACB = 90°"],
    )


# Angles at the two crossings of the transversal E-G-H-F with AB ∥ CD, by quadrant (toward E/G "up", toward A/C
# "left"). The up-right and down-left angles measure theta, the others 180 - theta.
_QUADRANTS = {
    "G": {("up", "right"): "EGB", ("up", "left"): "EGA", ("down", "left"): "AGH", ("down", "right"): "BGH"},
    "H": {("up", "right"): "GHD", ("up", "left"): "GHC", ("down", "left"): "CHF", ("down", "right"): "DHF"},
}
_RELATIONS = {
    "corresponding": "equal",
    "alternate interior": "equal",
    "alternate exterior": "equal",
    "co-interior": "supplementary",
}


def parallel_lines(rng: random.Random, mark_unknown: bool) -> Program:
    """AB ∥ CD (arrows) cut by EF at G and H: corresponding / alternate (equal) or co-interior (supplementary)
    angles."""
    theta = rng.choice([*range(40, 76), *range(105, 141)])
    relation = rng.choice(tuple(_RELATIONS))
    side, other = rng.sample(("left", "right"), 2)
    vertical = rng.choice(("up", "down"))
    g_quadrant, h_quadrant = {
        "corresponding": ((vertical, side), (vertical, side)),
        "alternate interior": (("down", side), ("up", other)),
        "alternate exterior": (("up", side), ("down", other)),
        "co-interior": (("down", side), ("up", side)),
    }[relation]
    given_at, asked_at = ("G", "H") if rng.random() < 0.5 else ("H", "G")
    quadrant = {"G": g_quadrant, "H": h_quadrant}
    name = {v: _QUADRANTS[v][quadrant[v]] for v in "GH"}
    value = {v: theta if quadrant[v] in (("up", "right"), ("down", "left")) else 180 - theta for v in "GH"}
    given, answer = value[given_at], value[asked_at]
    d, ux, uy = 4.0, math.cos(math.radians(theta)), math.sin(math.radians(theta))
    gx = d * ux / uy / 2 + rng.uniform(-1, 1)
    hx = gx - d * ux / uy
    half = max(6.0, abs(gx) + 3, abs(hx) + 3)
    points = {
        "A": (-half, 0),
        "B": (half, 0),
        "C": (-half, -d),
        "D": (half, -d),
        "G": (gx, 0),
        "H": (hx, -d),
        "E": (gx + 2.6 * ux, 2.6 * uy),
        "F": (hx - 2.6 * ux, -d - 2.6 * uy),
    }
    points = _orient(points, rng, 20)
    g, a = name[given_at], name[asked_at]
    angles = [_angle(g[1], g[0], g[2], _deg(given))] + ([_angle(a[1], a[0], a[2], "x°")] if mark_unknown else [])
    lines = [Segment("A", "B", arrows=1), Segment("C", "D", arrows=1), Segment("E", "F")]
    if _RELATIONS[relation] == "equal":
        reasoning = f"AB ∥ CD, so the {relation} angles ∠{g} and ∠{a} are equal: ∠{a} = {given}°."
        distractors = [180 - given, 90 - given if given < 90 else given - 90, given / 2, 2 * given]
    else:
        reasoning = (
            f"AB ∥ CD, so the {relation} angles ∠{g} and ∠{a} are supplementary: ∠{a} = 180° - {given}° = {answer}°."
        )
        distractors = [given, 90 - answer if answer < 90 else answer - 90, 2 * answer, answer / 2]
    return Program(
        figure=Figure(points, lines, angles=angles),
        givens={f"angle_{g}": given},
        asked=f"angle_{a}",
        answer=Fraction(answer),
        unit="degrees",
        asked_text=f"∠{a}",
        setting="AB ∥ CD, and line EF crosses them at G and H",
        given_text=f"∠{g} = {given}°",
        asked_on_figure=mark_unknown,
        reasoning=reasoning,
        distractors=distractors,
        relations=["AB ∥ CD"],
    )


def inscribed_angle(rng: random.Random, mark_unknown: bool) -> Program:
    """A, B, C on circle O: the inscribed angle ∠ACB is half the central angle ∠AOB on the same arc."""
    central = Fraction(rng.randint(30, 80) * 2 if rng.random() < 0.5 else rng.randint(60, 160))
    first = 270 - float(central) / 2 + rng.uniform(-40, 40)
    c_at = first + float(central) + rng.uniform(0.3, 0.7) * (360 - float(central))  # on the major arc
    points = {"O": (0, 0), "A": polar(5, first), "B": polar(5, first + float(central)), "C": polar(5, c_at)}
    if central.numerator % 2 == 0 and rng.random() < 0.5:
        inscribed = central / 2
        given, asked, answer = {"angle_ACB": int(inscribed)}, "angle_AOB", central
        reasoning = f"∠AOB = 2∠ACB = 2 × {inscribed}° = {central}°."
        distractors = [inscribed, 180 - inscribed, 360 - central, 180 - central, 90 + inscribed]
    else:
        given, asked, answer = {"angle_AOB": int(central)}, "angle_ACB", central / 2
        reasoning = f"∠ACB = ∠AOB / 2 = {central}° / 2 = {_deg(central / 2)}."
        distractors = [central, 180 - central, 180 - central / 2, 90 - central / 2, 2 * central]
    marks = {"angle_ACB": ("C", "A", "B"), "angle_AOB": ("O", "A", "B")}
    angles = [_angle(*marks[k], _deg(v)) for k, v in given.items()]
    angles += [_angle(*marks[asked], "x°")] if mark_unknown else []
    segments = [Segment("O", "A"), Segment("O", "B"), Segment("C", "A"), Segment("C", "B")]
    figure = Figure(points, segments, [Circle("O", 5)], angles, dots=["O"])
    return Program(
        figure=figure,
        givens=given,
        asked=asked,
        answer=answer,
        unit="degrees",
        asked_text=f"∠{asked[6:]}",
        setting="points A, B and C lie on circle O",
        given_text=" and ".join(f"∠{k[6:]} = {v}°" for k, v in given.items()),
        asked_on_figure=mark_unknown,
        reasoning=f"The inscribed angle ∠ACB and the central angle ∠AOB stand on the same arc AB, so {reasoning}",
        distractors=[float(d) for d in distractors],
        relations=["A, B, C on circle O"],
    )


def _sides(rng: random.Random) -> tuple[Fraction, Fraction]:
    """Width and height of a rectangle, integers or (one in four) with one half-integer side."""
    while True:
        w, h = Fraction(rng.randint(4, 14)), Fraction(rng.randint(3, 10))
        if rng.random() < 0.25:
            w -= Fraction(1, 2)
        if w != h and 1 / 3 <= w / h <= 3:
            return w, h


def rectangle(rng: random.Random, mark_unknown: bool) -> Program:
    """Rectangle ABCD with AB and BC given: its perimeter or its area."""
    w, h = _sides(rng)
    points = orient(
        {"A": (0, 0), "B": (float(w), 0), "C": (float(w), float(h)), "D": (0, float(h))}, 0, rng.random() < 0.5
    )
    sides = [Segment("A", "B"), Segment("B", "C"), Segment("C", "D"), Segment("D", "A")]
    lengths = [LengthMark("A", "B", num(w)), LengthMark("B", "C", num(h))]
    figure = Figure(points, sides, angles=[AngleMark("A", "B", "D", right=True)], lengths=lengths)
    if rng.random() < 0.5:
        asked, answer, unit = "perimeter_ABCD", 2 * (w + h), "cm"
        reasoning = (
            f"Opposite sides of a rectangle are equal, so its perimeter is 2 × ({num(w)} + {num(h)}) = {num(answer)}."
        )
        distractors = [w + h, w * h, 2 * w + h, w + 2 * h, 4 * w]
    else:
        asked, answer, unit = "area_ABCD", w * h, "cm^2"
        reasoning = f"The area of a rectangle is length × width = {num(w)} × {num(h)} = {num(answer)}."
        distractors = [2 * (w + h), w * h / 2, w + h, w * (h + 1), (w + 1) * h]
    return Program(
        figure=figure,
        givens={"AB": float(w), "BC": float(h)},
        asked=asked,
        answer=answer,
        unit=unit,
        asked_text=f"the {asked[:-5]} of rectangle ABCD",
        setting="ABCD is a rectangle",
        given_text=f"AB = {num(w)} cm and BC = {num(h)} cm",
        asked_on_figure=False,
        reasoning=reasoning,
        distractors=[float(d) for d in distractors],
        relations=["ABCD is a rectangle"],
    )


def similar_triangles(rng: random.Random, mark_unknown: bool) -> Program:
    """D on AB, E on AC, DE ∥ BC (arrows): △ADE ∼ △ABC, so DE / BC = AD / AB."""
    while True:
        ad, db, known = (Fraction(rng.randint(lo, hi)) for lo, hi in ((2, 6), (1, 6), (3, 12)))
        ratio = ad / (ad + db)
        ask_bc = rng.random() < 0.5
        de, bc = (known, known / ratio) if ask_bc else (known * ratio, known)
        beta = rng.uniform(50, 80)
        a = polar(float(ad + db), beta)
        angle_c = math.degrees(math.atan2(a[1], float(bc) - a[0]))
        if (de if not ask_bc else bc).denominator in (1, 2) and 0.3 <= ratio <= 0.75 and 0.6 <= bc / (ad + db) <= 1.6:
            if min(angle_c, 180 - beta - angle_c) >= 30:
                break
    t = float(ratio)
    points = {"A": a, "B": (0, 0), "C": (float(bc), 0)}
    points["D"], points["E"] = ((a[0] + t * (p[0] - a[0]), a[1] + t * (p[1] - a[1])) for p in ((0, 0), (float(bc), 0)))
    points = _orient(points, rng, 15)
    given = {"AD": ad, "DB": db, "DE": de} if ask_bc else {"AD": ad, "DB": db, "BC": bc}
    asked, answer = ("BC", bc) if ask_bc else ("DE", de)
    away = {"AD": "C", "DB": "C", "DE": "B", "BC": "A"}
    lengths = [LengthMark(*k, num(v), away[k]) for k, v in given.items()]
    lengths += [LengthMark(*asked, "x", away[asked])] if mark_unknown else []
    sides = [Segment("A", "B"), Segment("A", "C"), Segment("D", "E", arrows=1), Segment("B", "C", arrows=1)]
    if ask_bc:
        formula = f"BC = DE × AB / AD = {num(de)} × {num(ad + db)} / {num(ad)} = {num(bc)}."
        distractors = [de + db, de * (ad + db) / db, de * ad / (ad + db), de * db / ad, de + ad]
    else:
        formula = f"DE = BC × AD / AB = {num(bc)} × {num(ad)} / {num(ad + db)} = {num(de)}."
        distractors = [bc - db, bc * db / (ad + db), bc * ad / db, bc / 2, bc - ad]
    return Program(
        figure=Figure(points, sides, lengths=lengths),
        givens={k: float(v) for k, v in given.items()},
        asked=asked,
        answer=answer,
        unit="cm",
        asked_text=f"the length of {asked}",
        setting="in triangle ABC, D is on AB, E is on AC and DE ∥ BC",
        given_text=" and ".join(f"{k} = {num(v)} cm" for k, v in given.items()),
        asked_on_figure=mark_unknown,
        reasoning=f"DE ∥ BC, so △ADE ∼ △ABC and DE / BC = AD / AB, with AB = AD + DB = {num(ad)} + {num(db)} = "
        f"{num(ad + db)}. So {formula}",
        distractors=[float(d) for d in distractors],
        relations=["DE ∥ BC"],
    )


def tangent_radius(rng: random.Random, mark_unknown: bool) -> Program:
    """PT tangent to circle O at T: OT ⊥ PT, then Pythagoras (OP) or the angle sum (∠POT)."""
    at = rng.uniform(0, 360)
    side = rng.choice((-1, 1))
    if rng.random() < 0.5:
        scale = rng.choice((Fraction(1), Fraction(2)))
        r, t, op = (scale * s for s in rng.choice(TRIPLES[:3]))
        if rng.random() < 0.5:
            r, t = t, r
        given, asked, answer, unit = {"OT": float(r), "PT": float(t)}, "OP", op, "cm"
        radius, tangent = float(r), float(t)
        reasoning = f"OP = √(OT² + PT²) = √({_sq(r)} + {_sq(t)}) = √{num(op * op)} = {num(op)}."
        distractors = [r + t, abs(t - r), 2 * r, op + 1, (r + t) / 2]
    else:
        a = rng.randint(30, 60)
        given, asked, answer, unit = {"angle_OPT": a}, "angle_POT", Fraction(90 - a), "degrees"
        radius, tangent = 4.0, 4.0 / math.tan(math.radians(a))
        reasoning = f"∠POT = 180° - 90° - {a}° = {90 - a}°."
        distractors = [a, 180 - a, 90 + a, 180 - 2 * a, 2 * a]
    o, tp = (0.0, 0.0), polar(radius, at)
    p = polar(tangent, at + side * 90, tp)
    beyond = polar(0.45 * tangent, at - side * 90, tp)
    points = _orient({"O": o, "T": tp, "P": p, "t": beyond}, rng, 0)
    segments = [Segment("O", "T"), Segment("P", "t"), Segment("O", "P")]
    if asked == "OP":
        lengths = [LengthMark("O", "T", num(r), "P"), LengthMark("P", "T", num(t), "O")]
        lengths += [LengthMark("O", "P", "x", "T")] if mark_unknown else []
        angles = []
    else:
        lengths, angles = [], [_angle("P", "O", "T", _deg(a))] + ([_angle("O", "P", "T", "x°")] if mark_unknown else [])
    figure = Figure(points, segments, [Circle("O", radius)], angles, lengths, ["O", "T", "P"], ["O"])
    text = "the length of OP" if asked == "OP" else "∠POT"
    given_text = f"OT = {num(r)} cm and PT = {num(t)} cm" if asked == "OP" else f"∠OPT = {a}°"
    return Program(
        figure=figure,
        givens=given,
        asked=asked,
        answer=answer,
        unit=unit,
        asked_text=text,
        setting="PT is tangent to circle O at T",
        given_text=given_text,
        asked_on_figure=mark_unknown,
        reasoning=f"A tangent is perpendicular to the radius at the point of tangency, so ∠OTP = 90° and {reasoning}",
        distractors=[float(d) for d in distractors],
        relations=["PT tangent to circle O at T"],
        note="Assume that segments that appear to be tangent are tangent.",
    )


HEIGHTS = ((5, 4), (5, 3), (10, 8), (10, 6), (13, 12), (15, 12), (15, 9), (17, 15))
"""(slanted side, height) pairs whose third side of the right triangle (the foot's offset) is an integer."""


def parallelogram(rng: random.Random, mark_unknown: bool) -> Program:
    """Parallelogram ABCD with height DE to AB (dashed, right-angle mark): area = base × height, or its perimeter."""
    scale = rng.choice((Fraction(1, 2), Fraction(1)))
    s, h = (scale * v for v in rng.choice(HEIGHTS))
    offset = Fraction(math.isqrt(int(4 * (s * s - h * h)))) / 2
    b = offset + scale * rng.randint(2, 12)
    while b > 3.5 * h:  # not too flat to read
        b = offset + scale * rng.randint(2, 12)
    points = {
        "A": (0, 0),
        "B": (float(b), 0),
        "C": (float(b + offset), float(h)),
        "D": (float(offset), float(h)),
        "E": (float(offset), 0),
    }
    points = _orient(points, rng, 0)
    sides = [Segment("A", "B"), Segment("B", "C"), Segment("C", "D"), Segment("D", "A"), Segment("D", "E", dashed=True)]
    lengths = [LengthMark("A", "B", num(b), "D"), LengthMark("A", "D", num(s), "B"), LengthMark("D", "E", num(h), "A")]
    figure = Figure(points, sides, angles=[AngleMark("E", "B", "D", right=True)], lengths=lengths)
    if rng.random() < 0.5:
        asked, answer, unit = "area_ABCD", b * h, "cm^2"
        reasoning = f"The area of a parallelogram is base × height = AB × DE = {num(b)} × {num(h)} = {num(answer)}."
        distractors = [b * s, b * h / 2, 2 * (b + s), (b + s) * h / 2]
    else:
        asked, answer, unit = "perimeter_ABCD", 2 * (b + s), "cm"
        reasoning = (
            f"Opposite sides of a parallelogram are equal, so its perimeter is 2 × ({num(b)} + {num(s)}) = "
            f"{num(answer)}."
        )
        distractors = [b + s, 2 * (b + h), b * h, 2 * b + s]
    return Program(
        figure=figure,
        givens={"AB": float(b), "AD": float(s), "DE": float(h)},
        asked=asked,
        answer=answer,
        unit=unit,
        asked_text=f"the {asked[:-5]} of parallelogram ABCD",
        setting="ABCD is a parallelogram and DE ⊥ AB",
        given_text=f"AB = {num(b)} cm, AD = {num(s)} cm and DE = {num(h)} cm",
        asked_on_figure=False,
        reasoning=reasoning,
        distractors=[float(d) for d in distractors],
        relations=["ABCD is a parallelogram", "DE ⊥ AB"],
    )


FAMILIES: dict[str, Callable[[random.Random, bool], Program]] = {
    f.__name__: f
    for f in (
        triangle_angle_sum,
        isosceles_triangle,
        right_triangle,
        parallel_lines,
        inscribed_angle,
        rectangle,
        similar_triangles,
        tangent_radius,
        parallelogram,
    )
}
"""Family name -> program."""
