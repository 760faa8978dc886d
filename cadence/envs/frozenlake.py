"""FrozenLake as a text environment: gymnasium's dynamics on a fresh random map per seed.

The map comes from gymnasium's `generate_random_map(size, p, seed=episode seed)`
(it always has a path from S to G). The observation is the grid as text with
the player drawn as ``P``; actions are Left, Down, Right, Up (or L, D, R, U) in
``<answer>...</answer>``. Reward 1 on reaching G; falling into a hole ends
the episode with 0. `slippery=False` by default, so a plan stays a plan.

`neighbours=True` adds one line under the grid naming the cell one move away
in each direction, always in the same format: ``U:# L:F R:F D:H`` (``#`` is
the wall). A tiny model finds the player in a 2-D text grid easily enough but
not what lies below it; on this line "Down leads into a hole" is one character
at a fixed distance from the end of the prompt. Off by default.
"""

from __future__ import annotations

from collections import deque

from cadence.envs.contract import ResetReturn, StepReturn
from cadence.envs.gym_adapter import parse_discrete_action

ACTIONS = ("Left", "Down", "Right", "Up")  # gymnasium's action ids 0..3
_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
# The neighbour line's order: Down last and Right before it, the two moves towards G (always
# bottom-right), so what they reach is the last thing a model reads before it answers.
NEIGHBOUR_ORDER = (3, 0, 2, 1)  # Up, Left, Right, Down

RULES = (
    "You are on a frozen lake, at P. Reach the goal G without stepping into a hole H "
    "(F is safe ice, S the start). Moves: Left, Down, Right, Up. Reply with one move "
    "in <answer>...</answer>, e.g. <answer>Right</answer>."
)


def shortest_path(desc: list[str], start: int) -> list[int] | None:
    """Action ids of a shortest walk from cell `start` to G avoiding holes (None: no path)."""
    rows, cols = len(desc), len(desc[0])
    parent: dict[int, tuple[int, int] | None] = {start: None}
    todo = deque([start])
    while todo:
        cell = todo.popleft()
        r, c = divmod(cell, cols)
        if desc[r][c] == "G":
            path = []
            while parent[cell] is not None:
                cell, action = parent[cell]  # type: ignore[misc]
                path.append(action)
            return path[::-1]
        for action, (dr, dc) in _MOVES.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and desc[nr][nc] != "H":
                nxt = nr * cols + nc
                if nxt not in parent:
                    parent[nxt] = (cell, action)
                    todo.append(nxt)
    return None


class FrozenLakeEnv:
    """gymnasium's FrozenLake on `generate_random_map(size, p, seed)`, as text."""

    action_tag = "answer"

    def __init__(
        self, size: int = 4, p: float = 0.8, slippery: bool = False, rules: bool = True, neighbours: bool = False
    ) -> None:
        """`rules=False`: the first observation is the grid alone (a small model trained on the
        game, like `builtin:frozenlake`, cannot read the rules and only pays for their tokens).
        `neighbours=True`: every observation ends with the neighbour line (`neighbour_line`)."""
        if size < 2 or not 0 < p <= 1:
            raise ValueError(f"frozenlake needs size >= 2 and 0 < p <= 1, got size={size}, p={p}")
        self.size, self.p, self.slippery, self.rules = size, p, slippery, rules
        self.neighbours = neighbours
        self.env = None
        self.desc: list[str] = []
        self.state = 0

    def render(self) -> str:
        """The grid with the player as P."""
        rows = [list(row) for row in self.desc]
        r, c = divmod(self.state, self.size)
        rows[r][c] = "P"
        return "\n".join("".join(row) for row in rows)

    def neighbour_line(self) -> str:
        """What one move in each direction reaches, e.g. `U:# L:# R:F D:H` (# = the wall)."""
        r, c = divmod(self.state, self.size)
        cells = []
        for action in NEIGHBOUR_ORDER:
            dr, dc = _MOVES[action]
            nr, nc = r + dr, c + dc
            inside = 0 <= nr < self.size and 0 <= nc < self.size
            cells.append(f"{ACTIONS[action][0]}:{self.desc[nr][nc] if inside else '#'}")
        return " ".join(cells)

    def view(self) -> str:
        """The grid, and the neighbour line when `neighbours` is on: what every observation shows."""
        return f"{self.render()}\n{self.neighbour_line()}" if self.neighbours else self.render()

    def reset(self, seed: int) -> ResetReturn:
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        self.desc = generate_random_map(size=self.size, p=self.p, seed=seed)
        self.env = GymFrozenLake(desc=self.desc, is_slippery=self.slippery)
        self.state, _ = self.env.reset(seed=seed)
        optimal = len(shortest_path(self.desc, self.state) or [])
        first = f"{RULES}\n{self.view()}" if self.rules else self.view()
        return first, {"optimal_steps": optimal}

    def step(self, action: str) -> StepReturn:
        chosen = parse_discrete_action(action, ACTIONS)
        if chosen is None:
            text = f"Invalid move {action!r}: use Left, Down, Right or Up.\n{self.view()}"
            return text, 0.0, False, False, {"invalid_action": True}
        self.state, reward, terminated, truncated, _ = self.env.step(chosen)  # type: ignore[union-attr]
        r, c = divmod(self.state, self.size)
        cell = self.desc[r][c]
        note = {"G": "You reached the goal!", "H": "You fell into a hole."}.get(cell, "")
        text = f"{self.view()}\n{note}".rstrip()
        return text, float(reward), bool(terminated), bool(truncated), {"cell": cell}

    def expert_action(self) -> str | None:
        """The first move of a shortest safe path from here (None if there is none)."""
        path = shortest_path(self.desc, self.state)
        return ACTIONS[path[0]] if path else None
