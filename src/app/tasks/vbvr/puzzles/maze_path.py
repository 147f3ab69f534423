"""Maze path (planning): draw the shortest path from the green start S to the red goal G through a grid maze.

Problem: a ``(2k+1) x (2k+1)`` block maze (dark wall cells, a DFS maze with a few extra openings, so paths may loop)
with a green start cell and a red goal cell. Solution: a blue polyline through the centres of the free cells of a
BFS-shortest path from S to G. Scorer (``_grid_path.GridPathTask``, shared with ``path_around_obstacles``; cell by
cell, from the blue mask sampled at cell centres and at the boundaries between 4-neighbours): the blue pixels form one
connected component (hard), the blue cell graph joins S to G (hard), no wall cell is blue (hard: ``path_avoids_walls``),
the path length is close to the shortest (soft, weight 2), the S and G markers are where they were (soft).
"""

from __future__ import annotations

import random
from typing import Any

from app.tasks.vbvr.puzzles._grid_path import STEPS, GridPathTask, bfs


class MazePathTask(GridPathTask):
    name = "maze_path"
    faculty = "planning"
    min_image_size = 80

    def __init__(self, image_size: int = 128, cells: int = 5, loops: int = 2) -> None:
        super().__init__(image_size, cells=cells, loops=loops)
        self.cells, self.loops = cells, loops

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"cells": self.cells + 1, "loops": self.loops + 1}  # 15x15 at 128 px is too fine for JPEG

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            "Draw in blue the shortest path through the maze from the green start cell to the red goal cell, "
            "moving between free cells without crossing the dark walls."
        )

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        n = 2 * self.cells + 1
        grid = [["#"] * n for _ in range(n)]
        odd = [(r, c) for r in range(1, n, 2) for c in range(1, n, 2)]
        first = rng.choice(odd)
        grid[first[0]][first[1]] = "."
        stack = [first]
        while stack:  # depth-first carving
            r, c = stack[-1]
            options = [
                (dr, dc)
                for dr, dc in STEPS
                if 0 < r + 2 * dr < n and 0 < c + 2 * dc < n and grid[r + 2 * dr][c + 2 * dc] == "#"
            ]
            if not options:
                stack.pop()
                continue
            dr, dc = rng.choice(options)
            grid[r + dr][c + dc] = grid[r + 2 * dr][c + 2 * dc] = "."
            stack.append((r + 2 * dr, c + 2 * dc))
        inner = [(r, c) for r in range(1, n - 1) for c in range(1, n - 1) if (r + c) % 2 == 1 and grid[r][c] == "#"]
        for r, c in rng.sample(inner, min(self.loops, len(inner))):
            grid[r][c] = "."
        rows = ["".join(row) for row in grid]
        start = rng.choice(odd)
        parent = bfs(rows, start)
        depth = {c: len(self._trace(parent, c)) - 1 for c in odd}
        far = [c for c in odd if depth[c] >= 0.6 * max(depth.values())]
        goal = rng.choice(far)
        return {"grid": rows, "start": list(start), "goal": list(goal)}
