"""Textbook geometry figures drawn with PIL, for Reason-RFT's structure perception suite (Reason-RFT Appendix A.2,
docs/algorithms.md#papers).

A :class:`Figure` describes a diagram in model units (the problem's own lengths, y up): named points, segments, circles
and the marks of a textbook drawing (angle arcs with their value, right-angle squares, equal-length ticks, parallel
arrows, length values). :func:`render_figure` fits it into the image with one uniform scale, so angles and length ratios
are drawn exactly as stated, draws it :data:`SUPERSAMPLE` times larger and downsamples for antialiasing, and reports
where every point and text landed in pixels (tests and verifiers read them).

Text placement, as a draughtsman would do it: a point's letter in the widest angular gap at the point, an angle's value
on the bisector outside its arc, a length's value beside its segment's midpoint away from the figure's centre; each
moves (turns, steps out, slides) only when a line, arc, mark or earlier text is in the way, and stays inside the image.

>>> figure = Figure({"A": (0, 0), "B": (4, 0), "C": (0, 3)}, [Segment("A", "B"), Segment("B", "C"), Segment("C", "A")],
...                 lengths=[LengthMark("A", "B", "4")], angles=[AngleMark("A", "B", "C", right=True)])
>>> drawn = render_figure(figure, STYLES["textbook"], 96)
>>> drawn.image.size, sorted(drawn.points), [(t.text, t.ref) for t in drawn.texts if t.kind == "length"]
((96, 96), ['A', 'B', 'C'], [('4', 'AB')])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageFont

SUPERSAMPLE = 4
"""Figures are drawn this many times larger, then downsampled (antialiased lines, arcs and text)."""

Point = tuple[float, float]
RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Segment:
    """A drawn segment; ``ticks`` equal-length marks and ``arrows`` parallel chevrons (pointing start -> end)."""

    start: str
    end: str
    dashed: bool = False
    ticks: int = 0
    arrows: int = 0


@dataclass(frozen=True)
class Circle:
    centre: str
    radius: float


@dataclass(frozen=True)
class AngleMark:
    """The angle ``start``-``vertex``-``end`` (the smaller of the two sweeps), an arc with ``text`` or a right-angle
    square; its reference name is ``angle_<start><vertex><end>``."""

    vertex: str
    start: str
    end: str
    text: str | None = None
    right: bool = False

    @property
    def ref(self) -> str:
        return f"angle_{self.start}{self.vertex}{self.end}"


@dataclass(frozen=True)
class LengthMark:
    """``text`` written beside segment ``start``-``end`` on the side away from ``away_from`` (the figure's centre when
    None); its reference name is ``<start><end>``."""

    start: str
    end: str
    text: str
    away_from: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.start}{self.end}"


@dataclass
class Figure:
    """A diagram in model units. ``labeled`` names the points whose letter is written (all when None); ``dots`` the
    points drawn as a dot (circle centres)."""

    points: dict[str, Point]
    segments: list[Segment]
    circles: list[Circle] = field(default_factory=list)
    angles: list[AngleMark] = field(default_factory=list)
    lengths: list[LengthMark] = field(default_factory=list)
    labeled: list[str] | None = None
    dots: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FigureStyle:
    """Colours, and line width and font size as fractions of the image side."""

    name: str
    background: RGB
    ink: RGB
    accent: RGB
    line_width: float
    font_size: float


STYLES = {
    "textbook": FigureStyle("textbook", (255, 255, 255), (20, 20, 20), (25, 70, 200), 0.009, 0.062),
    "monochrome": FigureStyle("monochrome", (250, 250, 247), (45, 45, 45), (0, 0, 0), 0.006, 0.056),
}
"""``textbook`` (GeoQA-like, used in training): bold black lines, marks and values in blue. ``monochrome``
(Geometry3K-like, domain shift): thin grey lines, everything in black, a slightly smaller font."""


@dataclass(frozen=True)
class Text:
    """A text on the rendered figure: its kind (``point`` / ``angle`` / ``length``), the name it refers to (a point,
    ``angle_ABC`` or ``AB``), its centre and its box ``(x0, y0, x1, y1)`` in output pixels."""

    text: str
    kind: str
    ref: str
    centre: Point
    box: tuple[float, float, float, float]


@dataclass(frozen=True)
class RenderedFigure:
    """The image, every point's position in output pixels (x right, y down) and every text drawn."""

    image: Image.Image
    points: dict[str, Point]
    texts: list[Text]


def polar(radius: float, degrees: float, origin: Point = (0.0, 0.0)) -> Point:
    """The point at ``radius`` and angle ``degrees`` (counter-clockwise from +x) from ``origin``."""
    t = math.radians(degrees)
    return origin[0] + radius * math.cos(t), origin[1] + radius * math.sin(t)


def orient(points: dict[str, Point], degrees: float, mirror: bool) -> dict[str, Point]:
    """Rotate every point about the origin by ``degrees`` after an optional mirror in the y axis (angles and lengths
    keep their measures)."""
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    out = {}
    for name, (x, y) in points.items():
        x = -x if mirror else x
        out[name] = (c * x - s * y, s * x + c * y)
    return out


def _unit(dx: float, dy: float) -> Point:
    n = math.hypot(dx, dy)
    return dx / n, dy / n


def _to_segment(p: Point, a: Point, b: Point) -> float:
    """Distance from ``p`` to segment ``ab``."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    t = max(0.0, min(1.0, ((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / (dx * dx + dy * dy)))
    return math.dist(p, (a[0] + t * dx, a[1] + t * dy))


def _direction(a: Point, b: Point) -> float:
    """Angle of b - a in degrees in [0, 360), in pixel coordinates (y down, so increasing angles turn clockwise)."""
    return math.degrees(math.atan2(b[1] - a[1], b[0] - a[0])) % 360.0


def _widest_gap_bisector(directions: list[float]) -> float | None:
    """The direction halfway across the widest empty sector between ``directions`` (None when there are none)."""
    if not directions:
        return None
    ds = sorted(d % 360.0 for d in directions)
    gaps = [((ds[(i + 1) % len(ds)] - d) % 360.0 or 360.0, d) for i, d in enumerate(ds)]
    width, start = max(gaps)
    return start + width / 2


class _Canvas:
    """The supersampled drawing surface: model -> pixel transform, primitives and text placement."""

    def __init__(self, figure: Figure, style: FigureStyle, image_size: int) -> None:
        self.figure, self.style, self.size = figure, style, image_size * SUPERSAMPLE
        self.line = max(1, round(style.line_width * self.size))
        self.font = ImageFont.load_default(size=max(8, round(style.font_size * self.size)))
        self.font_px = self.font.size
        self.image = Image.new("RGB", (self.size, self.size), style.background)
        self.draw = ImageDraw.Draw(self.image)
        self.texts: list[Text] = []
        self.px = self._fit(figure)
        self.arcs: list[tuple[Point, float, float, float]] = []  # vertex, radius, start, sweep
        self.taken: list[tuple[Point, float]] = []  # centre and radius of every text placed so far
        self.marks: list[tuple[Point, Point]] = []  # strokes of ticks, arrows and right-angle squares

    def _fit(self, figure: Figure) -> dict[str, Point]:
        xs = [p[0] for p in figure.points.values()]
        ys = [p[1] for p in figure.points.values()]
        for circle in figure.circles:
            cx, cy = figure.points[circle.centre]
            xs += [cx - circle.radius, cx + circle.radius]
            ys += [cy - circle.radius, cy + circle.radius]
        margin = 1.9 * self.font_px + self.line
        span = max(max(xs) - min(xs), max(ys) - min(ys))
        self.scale = (self.size - 2 * margin) / span
        ox = (self.size - self.scale * (max(xs) - min(xs))) / 2 - self.scale * min(xs)
        oy = (self.size + self.scale * (max(ys) - min(ys))) / 2 + self.scale * min(ys)
        return {name: (ox + self.scale * x, oy - self.scale * y) for name, (x, y) in figure.points.items()}

    def mark(self, a: Point, b: Point, width: int) -> None:
        """A short accent stroke (tick, arrow wing, right-angle side), which later texts keep clear of."""
        self.marks.append((a, b))
        self.line_between(a, b, self.style.accent, width)

    def line_between(self, a: Point, b: Point, colour: RGB, width: int, dashed: bool = False) -> None:
        if not dashed:
            self.draw.line([a, b], fill=colour, width=width)
            for p in (a, b):  # round caps, so polygon corners have no notches
                self.draw.ellipse([p[0] - width / 2, p[1] - width / 2, p[0] + width / 2, p[1] + width / 2], fill=colour)
            return
        length, dash = math.dist(a, b), 0.022 * self.size
        ux, uy = _unit(b[0] - a[0], b[1] - a[1])
        t = 0.0
        while t < length:
            e = min(t + dash, length)
            self.draw.line([(a[0] + ux * t, a[1] + uy * t), (a[0] + ux * e, a[1] + uy * e)], fill=colour, width=width)
            t += 2 * dash

    def clamp(self, text: str, centre: Point) -> Point:
        """The nearest centre that keeps the text inside the image."""
        x0, y0, x1, y1 = self.draw.textbbox((0, 0), text, font=self.font, anchor="mm")
        pad = 0.15 * self.font_px
        return min(max(centre[0], pad - x0), self.size - pad - x1), min(max(centre[1], pad - y0), self.size - pad - y1)

    def clearance(self, text: str, centre: Point, along: tuple[Point, Point] | None = None) -> float:
        """Free space between the text (as its enclosing circle) at ``centre`` and the nearest line, circle, arc or
        text already placed; negative when they overlap. Segments holding ``along`` (a length value's own) don't
        count."""
        centre, eps = self.clamp(text, centre), 1e-6 * self.size
        lines = [(self.px[s.start], self.px[s.end]) for s in self.figure.segments]
        lines = [(a, b) for a, b in lines if not along or max(_to_segment(p, a, b) for p in along) > eps] + self.marks
        free = [_to_segment(centre, a, b) for a, b in lines]
        free += [abs(math.dist(centre, self.px[c.centre]) - c.radius * self.scale) for c in self.figure.circles]
        free += [math.dist(centre, polar(r, a0 + sweep * k / 8, v)) for v, r, a0, sweep in self.arcs for k in range(9)]
        free += [math.dist(centre, other) - other_radius for other, other_radius in self.taken]
        return min(free, default=math.inf) - self.text_radius(text)

    def text_at(self, text: str, kind: str, ref: str, centre: Point, colour: RGB) -> None:
        x0, y0, x1, y1 = self.draw.textbbox((0, 0), text, font=self.font, anchor="mm")
        x, y = self.clamp(text, centre)
        self.taken.append(((x, y), self.text_radius(text)))
        self.draw.text((x, y), text, font=self.font, fill=colour, anchor="mm")
        s = SUPERSAMPLE
        box = (round((x + x0) / s, 2), round((y + y0) / s, 2), round((x + x1) / s, 2), round((y + y1) / s, 2))
        self.texts.append(Text(text, kind, ref, (round(x / s, 2), round(y / s, 2)), box))

    def text_radius(self, text: str) -> float:
        """Half the diagonal of the text's box: the clearance a text needs around its centre."""
        x0, y0, x1, y1 = self.draw.textbbox((0, 0), text, font=self.font, anchor="mm")
        return 0.5 * math.hypot(x1 - x0, y1 - y0)


def _draw_segment(canvas: _Canvas, segment: Segment) -> None:
    a, b = canvas.px[segment.start], canvas.px[segment.end]
    canvas.line_between(a, b, canvas.style.ink, canvas.line, segment.dashed)
    ux, uy = _unit(b[0] - a[0], b[1] - a[1])
    nx, ny = -uy, ux
    mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    half, gap, width = 0.022 * canvas.size, 0.016 * canvas.size, max(1, round(0.8 * canvas.line))
    for k in range(segment.ticks):
        t = (k - (segment.ticks - 1) / 2) * gap
        cx, cy = mx + ux * t, my + uy * t
        canvas.mark((cx - nx * half, cy - ny * half), (cx + nx * half, cy + ny * half), width)
    for k in range(segment.arrows):
        t = (k - (segment.arrows - 1) / 2) * gap + 0.32 * math.dist(a, b)  # near the end: clear of values, crossings
        tip = (mx + ux * (t + half / 2), my + uy * (t + half / 2))
        for side in (-1, 1):
            wing = (tip[0] - ux * half + side * nx * half * 0.8, tip[1] - uy * half + side * ny * half * 0.8)
            canvas.mark(wing, tip, width)


def _angle_sweep(canvas: _Canvas, mark: AngleMark) -> tuple[float, float]:
    """``(start, sweep)`` of the mark's smaller sweep, in pixel-space degrees, clockwise on screen."""
    v = canvas.px[mark.vertex]
    a1, a2 = _direction(v, canvas.px[mark.start]), _direction(v, canvas.px[mark.end])
    sweep = (a2 - a1) % 360.0
    return (a1, sweep) if sweep <= 180.0 else (a2, 360.0 - sweep)


def _draw_angle(canvas: _Canvas, mark: AngleMark) -> None:
    v = canvas.px[mark.vertex]
    shortest = min(math.dist(v, canvas.px[mark.start]), math.dist(v, canvas.px[mark.end]))
    start, sweep = _angle_sweep(canvas, mark)
    width = max(1, round(0.8 * canvas.line))
    if mark.right:
        q = min(0.045 * canvas.size, 0.3 * shortest)
        u1, u2 = polar(q, start), polar(q, start + sweep)
        corner = [
            (v[0] + u1[0], v[1] + u1[1]),
            (v[0] + u1[0] + u2[0], v[1] + u1[1] + u2[1]),
            (v[0] + u2[0], v[1] + u2[1]),
        ]
        canvas.mark(corner[0], corner[1], width)
        canvas.mark(corner[1], corner[2], width)
        return
    r = min(0.07 * canvas.size, 0.3 * shortest)
    canvas.draw.arc(
        [v[0] - r, v[1] - r, v[0] + r, v[1] + r], start, start + sweep, fill=canvas.style.accent, width=width
    )
    canvas.arcs.append((v, r, start, sweep))
    if mark.text:
        clearance = canvas.text_radius(mark.text) + 0.1 * canvas.font_px
        distance = max(r + clearance, clearance / math.sin(math.radians(sweep / 2)))
        candidates = []  # on the bisector, stepping out only when another line or text is in the way
        for step, factor in enumerate((1.0, 1.2, 1.45, 1.75)):
            centre = polar(distance * factor, start + sweep / 2, v)
            candidates.append((min(canvas.clearance(mark.text, centre), 0.2 * canvas.font_px), -step, centre))
        canvas.text_at(mark.text, "angle", mark.ref, max(candidates)[2], canvas.style.accent)


def _draw_length(canvas: _Canvas, mark: LengthMark, centre: Point) -> None:
    a, b = canvas.px[mark.start], canvas.px[mark.end]
    ux, uy = _unit(b[0] - a[0], b[1] - a[1])
    nx, ny = -uy, ux
    mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    ref = canvas.px[mark.away_from] if mark.away_from else centre
    if (ref[0] - mx) * nx + (ref[1] - my) * ny > 0:
        nx, ny = -nx, -ny
    x0, y0, x1, y1 = canvas.draw.textbbox((0, 0), mark.text, font=canvas.font, anchor="mm")
    offset = abs(nx) * (x1 - x0) / 2 + abs(ny) * (y1 - y0) / 2 + 0.3 * canvas.font_px
    enough = 0.3 * canvas.font_px
    candidates = []  # slide from the midpoint toward the ends until the value is clear of other marks
    for t in (0.5, 0.4, 0.6, 0.3, 0.7, 0.22, 0.78):
        centre = (a[0] + t * (b[0] - a[0]) + nx * offset, a[1] + t * (b[1] - a[1]) + ny * offset)
        candidates.append((min(canvas.clearance(mark.text, centre, (a, b)), enough), -abs(t - 0.5), centre))
    canvas.text_at(mark.text, "length", mark.ref, max(candidates)[2], canvas.style.accent)


def _occupied_directions(canvas: _Canvas, name: str) -> list[float]:
    """Directions (pixel degrees) at point ``name`` already taken by segments, angle values and circles through it."""
    p, eps = canvas.px[name], 1e-6 * canvas.size
    directions = []
    for seg in canvas.figure.segments:
        a, b = canvas.px[seg.start], canvas.px[seg.end]
        length = math.dist(a, b)
        on_segment = abs(math.dist(a, p) + math.dist(p, b) - length) < eps
        if on_segment and math.dist(a, p) > eps:
            directions.append(_direction(p, a))
        if on_segment and math.dist(b, p) > eps:
            directions.append(_direction(p, b))
    for mark in canvas.figure.angles:
        if mark.vertex == name:
            start, sweep = _angle_sweep(canvas, mark)
            directions += [start + sweep / 2] if mark.text or mark.right else []
    for circle in canvas.figure.circles:
        c = canvas.px[circle.centre]
        if abs(math.dist(c, p) - circle.radius * canvas.scale) < 1e-3 * canvas.size:
            inward = _direction(p, c)  # keep the letter outside the circle: tangents and the inside are taken
            directions += [inward - 90.0, inward, inward + 90.0]
    return directions


def _draw_point_label(canvas: _Canvas, name: str, centre: Point) -> None:
    p = canvas.px[name]
    preferred = _widest_gap_bisector(_occupied_directions(canvas, name))
    if preferred is None:
        preferred = _direction(centre, p) if math.dist(centre, p) > 1e-6 else 270.0
    distance, enough = canvas.text_radius(name) + 0.6 * canvas.line, 0.25 * canvas.font_px
    candidates = []  # the widest gap first; turn (then step out) only when something else is in the way
    for step, factor in enumerate((1.0, 1.3, 1.7)):
        for turn in range(-180, 180, 10):
            position = polar(distance * factor, preferred + turn, p)
            clear = min(canvas.clearance(name, position), enough)
            candidates.append((clear, -step, -abs(turn), position))
    canvas.text_at(name, "point", name, max(candidates)[3], canvas.style.ink)


def render_figure(figure: Figure, style: FigureStyle, image_size: int) -> RenderedFigure:
    """Draw ``figure`` in ``style`` on a square image of ``image_size`` pixels; see the module docstring."""
    canvas = _Canvas(figure, style, image_size)
    for circle in figure.circles:
        (cx, cy), r = canvas.px[circle.centre], circle.radius * canvas.scale
        canvas.draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=style.ink, width=canvas.line)
    for segment in figure.segments:
        _draw_segment(canvas, segment)
    for name in figure.dots:
        (x, y), r = canvas.px[name], 1.6 * canvas.line
        canvas.draw.ellipse([x - r, y - r, x + r, y + r], fill=style.ink)
    xs, ys = zip(*canvas.px.values(), strict=True)
    centre = (sum(xs) / len(xs), sum(ys) / len(ys))
    for mark in figure.angles:
        _draw_angle(canvas, mark)
    for mark in figure.lengths:
        _draw_length(canvas, mark, centre)
    for name in figure.labeled if figure.labeled is not None else figure.points:
        _draw_point_label(canvas, name, centre)
    image = canvas.image.resize((image_size, image_size), Image.Resampling.LANCZOS)
    points = {name: (round(x / SUPERSAMPLE, 2), round(y / SUPERSAMPLE, 2)) for name, (x, y) in canvas.px.items()}
    return RenderedFigure(image, points, canvas.texts)
