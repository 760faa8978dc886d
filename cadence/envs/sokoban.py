"""Sokoban with its own level generator (gym-sokoban does not run on numpy 2).

A level is a small walled room (default 7x7 with the walls), a few inner walls,
1 or 2 boxes, as many goals, and the player, placed at random from the episode
seed. A breadth-first search over (player, boxes) states keeps only levels that
are solvable, with at least one push, and gives the optimal solution length
(moves, pushes included); the same search is the scripted expert.

Text: ``#`` wall, ``_`` floor, ``.`` goal, ``$`` box, ``*`` box on a goal,
``@`` player, ``+`` player on a goal. Actions: Up, Down, Left, Right (or U, D,
L, R) in ``<answer>...</answer>``. Reward 1 when every box is on a goal.

`positions=True` adds one line under the room saying where things are, as
offsets (rows down, columns right) in a fixed format: ``$-1,+2 .+3,+0`` is
the box one row up and two columns right of the player, and the goal three
rows below the box (with more boxes: every box, then every goal, from the
player). A tiny model reads a sign at a fixed distance from the end of its
prompt far more easily than it finds three symbols in a 2-D grid and works
out where they are from each other. Off by default.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from cadence.data.tasks import stable_hash
from cadence.envs.contract import ResetReturn, StepReturn
from cadence.envs.gym_adapter import parse_discrete_action

ACTIONS = ("Up", "Down", "Left", "Right")
_MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
Cell = tuple[int, int]

RULES = (
    "Sokoban: push every box ($) onto a goal (.). You are @ (+ on a goal), # is wall, _ is "
    "floor, * is a box on a goal. You push a box by walking into it; you cannot pull boxes "
    "or push two at once. Moves: Up, Down, Left, Right. Reply with one move in "
    "<answer>...</answer>, e.g. <answer>Up</answer>."
)


@dataclass(frozen=True)
class Level:
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell
    height: int
    width: int


def _move(level: Level, player: Cell, boxes: frozenset[Cell], action: int):
    """(player, boxes) after `action`, or None when the move is blocked."""
    dr, dc = _MOVES[action]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in level.walls:
        return None
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in level.walls or beyond in boxes:
            return None
        boxes = (boxes - {nxt}) | {beyond}
    return nxt, boxes


def solve(level: Level, player: Cell, boxes: frozenset[Cell], limit: int = 200_000) -> list[int] | None:
    """A shortest action sequence that puts every box on a goal (None: unsolvable or too big)."""
    start = (player, boxes)
    parent: dict = {start: None}
    todo = deque([start])
    while todo and len(parent) < limit:
        state = todo.popleft()
        if state[1] == level.goals:
            path = []
            while parent[state] is not None:
                state, action = parent[state]
                path.append(action)
            return path[::-1]
        for action in range(4):
            nxt = _move(level, *state, action)
            if nxt is not None and nxt not in parent:
                parent[nxt] = (state, action)
                todo.append(nxt)
    return None


def _connected(floor: set[Cell]) -> bool:
    start = next(iter(floor))
    seen, todo = {start}, [start]
    while todo:
        r, c = todo.pop()
        for dr, dc in _MOVES:
            n = (r + dr, c + dc)
            if n in floor and n not in seen:
                seen.add(n)
                todo.append(n)
    return len(seen) == len(floor)


def generate_level(
    seed: int, width: int = 7, height: int = 7, boxes: int | None = None, max_moves: int = 30
) -> tuple[Level, int]:
    """A solvable level from `seed` and its optimal solution length; deterministic in the seed."""
    rng = random.Random(stable_hash("sokoban", seed, width, height, boxes))
    n_boxes = boxes if boxes is not None else rng.choice((1, 2))
    border = {(r, c) for r in range(height) for c in range(width)
              if r in (0, height - 1) or c in (0, width - 1)}  # fmt: skip
    inner = [(r, c) for r in range(1, height - 1) for c in range(1, width - 1)]
    for _ in range(10_000):
        walls = set(border) | set(rng.sample(inner, rng.randint(0, len(inner) // 6)))
        floor = [cell for cell in inner if cell not in walls]
        if len(floor) < 2 * n_boxes + 1 or not _connected(set(floor)):
            continue
        cells = rng.sample(floor, 2 * n_boxes + 1)
        goals, box_cells = frozenset(cells[:n_boxes]), frozenset(cells[n_boxes : 2 * n_boxes])
        level = Level(frozenset(walls), goals, box_cells, cells[-1], height, width)
        if goals == box_cells:
            continue
        solution = solve(level, level.player, level.boxes)
        if solution is not None and len(solution) <= max_moves:
            return level, len(solution)
    raise RuntimeError(f"no solvable {width}x{height} level with {n_boxes} boxes from seed {seed}")


def render(level: Level, player: Cell, boxes: frozenset[Cell]) -> str:
    rows = []
    for r in range(level.height):
        row = []
        for c in range(level.width):
            cell, goal = (r, c), (r, c) in level.goals
            if cell in level.walls:
                row.append("#")
            elif cell == player:
                row.append("+" if goal else "@")
            elif cell in boxes:
                row.append("*" if goal else "$")
            else:
                row.append("." if goal else "_")
        rows.append("".join(row))
    return "\n".join(rows)


class SokobanEnv:
    """Generated Sokoban rooms (see the module docstring)."""

    action_tag = "answer"

    def __init__(
        self,
        width: int = 7,
        height: int = 7,
        boxes: int | None = None,
        max_moves: int = 30,
        rules: bool = True,
        positions: bool = False,
    ) -> None:
        """`rules=False`: the first observation is the room alone (for a small model trained on the game).
        `positions=True`: every observation ends with the positions line (`positions_line`)."""
        if width < 4 or height < 4 or (boxes is not None and boxes < 1):
            raise ValueError("sokoban needs width, height >= 4 and boxes >= 1 (or null: 1-2)")
        self.width, self.height, self.boxes, self.max_moves = width, height, boxes, max_moves
        self.rules, self.positions = rules, positions
        self.level: Level | None = None
        self.player: Cell = (0, 0)
        self.box_cells: frozenset[Cell] = frozenset()

    def render(self) -> str:
        assert self.level is not None, "reset() first"
        return render(self.level, self.player, self.box_cells)

    def positions_line(self) -> str:
        """The box from the player and the goal from the box, e.g. `$-1,+2 .+3,+0` (rows down,
        columns right); with more boxes, each box and then each goal from the player."""
        assert self.level is not None, "reset() first"
        boxes, goals = sorted(self.box_cells), sorted(self.level.goals)
        goal_origin = boxes[0] if len(boxes) == 1 else self.player
        offsets = [("$", self.player, box) for box in boxes] + [(".", goal_origin, goal) for goal in goals]
        return " ".join(f"{mark}{b[0] - a[0]:+d},{b[1] - a[1]:+d}" for mark, a, b in offsets)

    def view(self) -> str:
        """The room, and the positions line when `positions` is on: what every observation shows."""
        return f"{self.render()}\n{self.positions_line()}" if self.positions else self.render()

    def reset(self, seed: int) -> ResetReturn:
        self.level, optimal = generate_level(
            seed, self.width, self.height, self.boxes, self.max_moves
        )
        self.player, self.box_cells = self.level.player, self.level.boxes
        first = f"{RULES}\n{self.view()}" if self.rules else self.view()
        return first, {"optimal_steps": optimal}

    def step(self, action: str) -> StepReturn:
        assert self.level is not None, "reset() first"
        chosen = parse_discrete_action(action, ACTIONS)
        if chosen is None:
            text = f"Invalid move {action!r}: use Up, Down, Left or Right.\n{self.view()}"
            return text, 0.0, False, False, {"invalid_action": True}
        moved = _move(self.level, self.player, self.box_cells, chosen)
        if moved is None:
            text = f"Blocked: you cannot move {ACTIONS[chosen]}.\n{self.view()}"
            return text, 0.0, False, False, {"blocked": True}
        self.player, self.box_cells = moved
        solved = self.box_cells == self.level.goals
        text = f"{self.view()}\nSolved!" if solved else self.view()
        return text, float(solved), solved, False, {"boxes_on_goals": len(self.box_cells & self.level.goals)}

    def expert_action(self) -> str | None:
        """The first move of an optimal solution from here (None: no solution, e.g. deadlocked)."""
        assert self.level is not None, "reset() first"
        path = solve(self.level, self.player, self.box_cells)
        return ACTIONS[path[0]] if path else None
