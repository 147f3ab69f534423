"""Path around obstacles (planning): draw a shortest path from the green start to the red goal around dark obstacles.

Problem: an open ``n x n`` grid (thin grid lines) with dark rectangular obstacle blocks, a green start cell in the left
column and a red goal cell in the right column; the straight L-shaped route is always blocked. Solution: a blue polyline
through the cell centres of a BFS-shortest 4-connected path (any shortest path is accepted). Scorer (shared with
``maze_path``: ``_grid_path.GridPathTask``): the blue pixels form one connected component (hard), the blue cell graph
joins start to goal (hard), no obstacle cell is blue (hard: ``path_avoids_obstacles``), the length is close to the
shortest (soft, weight 2), the start and goal markers are in place (soft).
"""

from __future__ import annotations

import random
from typing import Any

from app.tasks.vbvr.puzzles._grid_path import GridPathTask, shortest_path


class PathAroundObstaclesTask(GridPathTask):
    name = "path_around_obstacles"
    faculty = "planning"
    min_image_size = 80
    grid_lines = True
    blocked_perturbation, avoid_check = "path_hits_obstacle", "path_avoids_obstacles"

    def __init__(self, image_size: int = 128, size: int = 8, density: float = 0.25) -> None:
        super().__init__(image_size, size=size, density=density)
        self.size, self.density = size, density

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"size": self.size + 4, "density": self.density + 0.05}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            "Draw in blue a shortest path from the green start cell to the red goal cell, moving between "
            "neighbouring cells (no diagonals) and never entering a dark obstacle."
        )

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        n = self.size
        for _ in range(10_000):  # rejection sampling: reachable goal, blocked straight route, a path that must bend
            cells = [["."] * n for _ in range(n)]
            while sum(row.count("#") for row in cells) < min(self.density, 0.6) * n * n:
                h, w = rng.randint(1, 2), rng.randint(1, 3)
                r, c = rng.randrange(n - h + 1), rng.randrange(1, n - w)
                for dr in range(h):
                    for dc in range(w):
                        cells[r + dr][c + dc] = "#"
            start, goal = (rng.randrange(n), 0), (rng.randrange(n), n - 1)
            grid = ["".join(row) for row in cells]
            path = shortest_path(grid, start, goal)
            if path is None or self._through_blocked(grid, start, goal) is None:
                continue
            if len(path) - 1 > abs(start[0] - goal[0]) + abs(start[1] - goal[1]):
                return {"grid": grid, "start": list(start), "goal": list(goal)}
        raise ValueError(f"no solvable {n}x{n} layout with density {self.density}")
