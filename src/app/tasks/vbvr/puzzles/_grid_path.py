"""Shared by ``maze_path`` and ``path_around_obstacles``: BFS shortest paths on a ``#``/``.`` grid, and
:class:`GridPathTask`, the renderer, solver, perturbations and scorer of a blue path drawn from a green start cell to a
red goal cell through the cell centres.

Scorer (cell by cell, from the blue mask sampled at cell centres and at the boundaries between 4-neighbours): the blue
pixels form one connected component (hard), the blue cell graph joins start to goal (hard), it is a line, not an area:
no cell of it has more than two blue neighbours, start and goal more than one (hard: a canvas flooded blue joins start
and goal around the walls), no blocked cell is blue (hard), the path length is close to the shortest (soft, weight 2),
the start and goal markers are in place (soft).

>>> shortest_path(["...", ".#.", "..."], (0, 0), (2, 2))
[(0, 0), (0, 1), (0, 2), (1, 2), (2, 2)]
"""

from __future__ import annotations

from collections import Counter, deque

import cv2
import numpy as np

from app.cv import PALETTE, WALL, blobs, color_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

Cell = tuple[int, int]
STEPS = ((0, 1), (1, 0), (0, -1), (-1, 0))


def bfs(grid: list[str], start: Cell, goal: Cell | None = None, blocked: str = "#") -> dict[Cell, Cell | None]:
    """Breadth-first search over 4-neighbours: the parent of every reachable cell (stops early at ``goal``)."""
    parent: dict[Cell, Cell | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for dr, dc in STEPS:
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < len(grid) and 0 <= nxt[1] < len(grid[0]) and nxt not in parent:
                if grid[nxt[0]][nxt[1]] not in blocked:
                    parent[nxt] = cell
                    queue.append(nxt)
    return parent


def shortest_path(grid: list[str], start: Cell, goal: Cell, blocked: str = "#") -> list[Cell] | None:
    """The cells of a shortest 4-connected path from ``start`` to ``goal`` (both included), or ``None``."""
    parent = bfs(grid, start, goal, blocked)
    if goal not in parent:
        return None
    path = [goal]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path[::-1]


def cell_geometry(size: int, n: int) -> tuple[list[int], list[int]]:
    """Integer pixel bounds (n + 1) and centre pixels (n) of an ``n``-cell axis over ``size`` pixels."""
    bounds = [round(i * size / n) for i in range(n + 1)]
    return bounds, [(bounds[i] + bounds[i + 1] - 1) // 2 for i in range(n)]


def line_width(size: int, n: int) -> int:
    return max(3, int(0.4 * size / n) | 1)


class GridPathTask(VisualTask):
    """Shared renderer, solver, scorer and perturbations of the grid path tasks (config: grid rows of ``#``/``.``,
    start and goal cells); subclasses sample the grid."""

    grid_lines = False
    blocked_perturbation, avoid_check = "path_through_wall", "path_avoids_walls"

    def solve(self, config):
        path = shortest_path(config["grid"], tuple(config["start"]), tuple(config["goal"]))
        return {"path": [list(c) for c in path], "length": len(path) - 1}

    def _draw(self, config, polylines: list[list[Cell]]) -> np.ndarray:
        grid, size = config["grid"], self.image_size
        (ys, cy), (xs, cx) = cell_geometry(size, len(grid)), cell_geometry(size, len(grid[0]))
        image, draw = canvas(size)
        for r, row in enumerate(grid):
            for c, ch in enumerate(row):
                if self.grid_lines:
                    draw.rectangle((xs[c], ys[r], xs[c + 1] - 1, ys[r + 1] - 1), outline=(205, 205, 205))
                if ch == "#":
                    draw.rectangle((xs[c], ys[r], xs[c + 1] - 1, ys[r + 1] - 1), fill=WALL)
        width = line_width(size, len(grid[0]))
        for line in polylines:
            points = [(cx[c], cy[r]) for r, c in line]
            if len(points) > 1:
                draw.line(points, fill=PALETTE["blue"], width=width, joint="curve")
        margin = max(2, round(0.2 * size / len(grid[0])))
        for (r, c), colour in ((config["start"], "green"), (config["goal"], "red")):
            draw.rectangle(
                (xs[c] + margin, ys[r] + margin, xs[c + 1] - 1 - margin, ys[r + 1] - 1 - margin), fill=PALETTE[colour]
            )
        return to_array(image)

    def render(self, config, solution):
        path = [tuple(c) for c in solution["path"]]
        stops = sorted({2} | {round(i * len(path) / 12) for i in range(1, 13)} - {0, 1})
        frames = [self._draw(config, [])] + [self._draw(config, [path[:n]]) for n in stops]
        return np.stack(frames), [1, len(frames) - 1]

    def perturbations(self, config, solution):
        grid, path = config["grid"], [tuple(c) for c in solution["path"]]
        start, goal = tuple(config["start"]), tuple(config["goal"])
        mid = len(path) // 2
        through = self._through_blocked(grid, start, goal)
        if through is None:  # no blocked L-shaped route: poke the path into a blocked neighbour
            cell, wall = next(
                (p, (p[0] + dr, p[1] + dc))
                for p in path
                for dr, dc in STEPS
                if self._blocked(grid, (p[0] + dr, p[1] + dc))
            )
            through = [path, [cell, wall]]
        parent = bfs(grid, start)
        ends = [c for c in parent if c != goal and goal not in self._trace(parent, c)]
        wrong = max(ends, key=lambda c: (len(self._trace(parent, c)), c))
        return {
            "broken_path": self._draw(config, [path[:mid], path[mid + 1 :]]),
            self.blocked_perturbation: self._draw(config, through),
            "wrong_goal": self._draw(config, [self._trace(parent, wrong)]),
        }

    @staticmethod
    def _blocked(grid, cell) -> bool:
        return 0 <= cell[0] < len(grid) and 0 <= cell[1] < len(grid[0]) and grid[cell[0]][cell[1]] == "#"

    @staticmethod
    def _trace(parent, cell) -> list[Cell]:
        out = [cell]
        while parent[out[-1]] is not None:
            out.append(parent[out[-1]])
        return out[::-1]

    def _through_blocked(self, grid, start, goal) -> list[list[Cell]] | None:
        """An L-shaped route from start to goal that crosses a blocked cell, if one of the two does."""
        for first_row in (True, False):
            corner = (start[0], goal[1]) if first_row else (goal[0], start[1])
            legs = [start, corner, goal]
            cells = []
            for a, b in zip(legs, legs[1:], strict=False):
                dr, dc = int(np.sign(b[0] - a[0])), int(np.sign(b[1] - a[1]))
                n = abs(b[0] - a[0]) + abs(b[1] - a[1])
                cells += [(a[0] + dr * i, a[1] + dc * i) for i in range(n)]
            cells.append(goal)
            if any(self._blocked(grid, c) for c in cells):
                return [cells]
        return None

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        grid, start, goal = config["grid"], tuple(config["start"]), tuple(config["goal"])
        rows, cols = len(grid), len(grid[0])
        (ys, cy), (xs, cx) = cell_geometry(last.shape[0], rows), cell_geometry(last.shape[1], cols)
        width = line_width(last.shape[1], cols)
        blue = color_mask(last, "blue")
        half = max(1, (width - 1) // 2 - 1)
        shift = max(1, (xs[1] - xs[0]) // 4)

        def is_blue(x: int, y: int) -> bool:
            return bool(blue[max(0, y - half) : y + half + 1, max(0, x - half) : x + half + 1].mean() >= 0.5)

        marked = {
            (r, c) for r in range(rows) for c in range(cols) if (r, c) not in (start, goal) and is_blue(cx[c], cy[r])
        }
        walls_hit = sorted(c for c in marked if grid[c[0]][c[1]] == "#")
        nodes, seen, queue = marked | {start, goal}, {start}, deque([start])
        degree: Counter[Cell] = Counter()  # blue neighbours of each reached cell
        while queue:
            r, c = queue.popleft()
            for dr, dc in STEPS:
                nxt = (r + dr, c + dc)
                if nxt not in nodes:
                    continue
                # probe the boundary between the two cells; next to a marker, probe a little into the other cell,
                # away from the marker's colour bleeding (JPEG chroma subsampling)
                toward = 1 if (r, c) in (start, goal) else -1 if nxt in (start, goal) else 0
                probe_x = (cx[c] + cx[nxt[1]]) // 2 + toward * dc * shift
                probe_y = (cy[r] + cy[nxt[0]]) // 2 + toward * dr * shift
                if is_blue(probe_x, probe_y):
                    degree[(r, c)] += 1
                    if nxt not in seen:
                        seen.add(nxt)
                        queue.append(nxt)
        branches = sorted(cell for cell in seen if degree[cell] > (1 if cell in (start, goal) else 2))
        closed = cv2.morphologyEx(blue.astype(np.uint8), cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8))
        components = blobs(closed.astype(bool), min_area=width * width)
        shortest = len(shortest_path(grid, start, goal)) - 1
        steps = len(marked) + 1
        markers = 0.0
        for (r, c), colour in ((start, "green"), (goal, "red")):
            found = blobs(color_mask(last, colour), min_area=max(4, (xs[1] - xs[0]) ** 2 // 16))
            markers += 0.5 * any(
                xs[c] <= b.centroid[0] < xs[c + 1] and ys[r] <= b.centroid[1] < ys[r + 1] for b in found
            )
        n_parts, reached, fit = len(components), goal in seen, min(steps, shortest) / max(steps, shortest)
        return combine(
            [
                Check("one_blue_component", float(n_parts == 1), hard=True, detail=f"{n_parts} blue components"),
                Check("path_connects_start_to_goal", float(reached), hard=True, detail=f"goal reached: {reached}"),
                Check("path_is_a_line", float(not branches), hard=True, detail=f"branching at cells {branches[:4]}"),
                Check(self.avoid_check, float(not walls_hit), hard=True, detail=f"blue on blocked {walls_hit[:4]}"),
                Check("length_near_shortest", fit, weight=2, detail=f"{steps} steps, shortest {shortest}"),
                Check("start_goal_markers", markers, detail=f"{markers:.1f} of the markers in place"),
            ]
        )
