"""The built-in environments by name: where each class lives, and one line about it.

Plain data with no imports, below both `cadence.envs` (which builds and lists them) and
`cadence.sandbox` (whose service hosts them by name), so neither reaches up for it.
"""

from __future__ import annotations

# name -> (module:Class, one line for `cadence envs`; its kwargs are read from the class itself)
BUILTIN_ENVS: dict[str, tuple[str, str]] = {
    "frozenlake": (
        "cadence.envs.frozenlake:FrozenLakeEnv",
        "gymnasium FrozenLake on a random map per seed; text grid; Left/Down/Right/Up; "
        "reward 1 at the goal",
    ),
    "sokoban": (
        "cadence.envs.sokoban:SokobanEnv",
        "generated rooms with 1-2 boxes, each checked solvable by BFS; text grid; "
        "Up/Down/Left/Right; reward 1 when every box is on a goal",
    ),
    "code": (
        "cadence.envs.code_env:CodeEnv",
        "a computation task; the model runs Python (```python blocks) and sees the output, "
        "then answers <answer>..</answer>; reward 1 if right",
    ),
    "gymnasium": (
        "cadence.envs.gym_adapter:GymnasiumEnv",
        "any gymnasium env id with a text rendering or text observations",
    ),
    "textarena": (
        "cadence.envs.textarena_adapter:TextArenaEnv",
        "a single-player TextArena game, e.g. id=GuessTheNumber-v0 "
        "(optional extra: pip install 'cadence[envs-textarena]')",
    ),
}
