"""FrozenLake and Sokoban: seeded levels, text grids, action words, rewards, and the expert."""

from __future__ import annotations

import pytest

from cadence.envs.expert import demonstrate, demonstrations
from cadence.envs.frozenlake import ACTIONS, FrozenLakeEnv, shortest_path
from cadence.envs.gym_adapter import parse_discrete_action
from cadence.envs.sokoban import Level, SokobanEnv, generate_level, render, solve

# ------------------------------------------------------------------ frozenlake


def grid(observation: str) -> list[str]:
    return [line for line in observation.splitlines() if line and set(line) <= set("SFHGP")]


def test_frozenlake_map_is_the_seeds_and_drawn_as_plain_text():
    env = FrozenLakeEnv(size=5)
    first, info = env.reset(7)
    again, _ = env.reset(7)
    other = {tuple(grid(env.reset(s)[0])) for s in range(8)}
    assert first == again and len(other) > 1  # same seed, same map; seeds differ
    rows = grid(first)
    assert len(rows) == 5 and all(len(r) == 5 for r in rows) and rows[0][0] == "P"
    assert "\x1b" not in first and "<answer>" in first
    assert info["optimal_steps"] == len(shortest_path(env.desc, 0)) >= 8


def test_frozenlake_moves_by_word_or_letter_and_pays_one_at_the_goal():
    env = FrozenLakeEnv(size=4)
    env.reset(3)
    path = shortest_path(env.desc, 0)
    spellings = [("{}", "{}.", "{}", "'{}'")[i % 4].format(
        (ACTIONS[a], ACTIONS[a][0], ACTIONS[a].lower(), ACTIONS[a].upper())[i % 4]
    ) for i, a in enumerate(path)]  # fmt: skip
    rewards = []
    for action in spellings:
        obs, reward, terminated, truncated, info = env.step(action)
        assert "invalid_action" not in info
        rewards.append(reward)
    assert rewards == [0.0] * (len(path) - 1) + [1.0] and terminated and not truncated
    assert "goal" in obs and grid(obs)[3][3] == "P"


def test_frozenlake_hole_ends_the_episode_without_reward_and_bad_words_are_invalid():
    env = FrozenLakeEnv(size=4)
    seed = next(s for s in range(200) if (env.reset(s), env.desc[0][1] == "H")[1])
    obs, reward, terminated, _, info = env.step("jump")
    assert info["invalid_action"] and reward == 0 and not terminated and "Invalid" in obs
    assert env.reset(seed)[1]["optimal_steps"] == 6
    obs, reward, terminated, _, _ = env.step("Right")
    assert (reward, terminated) == (0.0, True) and "hole" in obs and grid(obs)[0][1] == "P"


def test_frozenlake_neighbour_line_names_what_each_move_reaches():
    env = FrozenLakeEnv(size=4, rules=False, neighbours=True)
    seed = next(s for s in range(200) if (env.reset(s), env.desc[1][0] == "H" and env.desc[0][1] == "F")[1])
    first, _ = env.reset(seed)
    assert first.splitlines()[-1] == "U:# L:# R:F D:H" and grid(first) == env.render().splitlines()
    obs, *_ = env.step("R")  # one to the right: the start is on the left now
    assert obs.splitlines()[-1] == f"U:# L:S R:{env.desc[0][2]} D:{env.desc[1][1]}"
    assert env.step("jump")[0].splitlines()[-1] == obs.splitlines()[-1]  # an invalid move shows it again
    assert FrozenLakeEnv(size=4, rules=False).reset(seed)[0] == grid_only(env, seed)  # off by default


def grid_only(env: FrozenLakeEnv, seed: int) -> str:
    env.reset(seed)
    return env.render()


def test_parse_discrete_action():
    names = ("Left", "Down", "Right", "Up")
    assert [parse_discrete_action(a, names) for a in ("left", " UP ", "r", "3", "'Down'")] == [0, 3, 2, 3, 1]
    assert parse_discrete_action("leftwards", names) is None
    assert parse_discrete_action("7", names) is None
    assert parse_discrete_action("p", ("push left", "push right")) is None  # ambiguous letter


# ------------------------------------------------------------------ sokoban


def level_from(text: str) -> Level:
    rows = text.strip().splitlines()
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    pick = lambda chars: frozenset(k for k, v in cells.items() if v in chars)  # noqa: E731
    (player,) = pick("@+")
    return Level(pick("#"), pick(".*+"), pick("$*"), player, len(rows), len(rows[0]))


def test_sokoban_solver_on_hand_made_levels():
    corridor = level_from("######\n#@$_.#\n######")
    assert solve(corridor, corridor.player, corridor.boxes) == [3, 3]  # Right, Right
    around = level_from("#####\n#_._#\n#_$_#\n#_@_#\n#####")
    assert solve(around, around.player, around.boxes) == [0]  # one push up
    # the box must go right but the player starts right of it: walk round (D, L, L, U), push twice
    detour = level_from("######\n#_$@.#\n#____#\n######")
    assert solve(detour, detour.player, detour.boxes) == [1, 2, 2, 0, 3, 3]
    stuck = level_from("#####\n#$_.#\n#@__#\n#####")  # box in a corner: unsolvable
    assert solve(stuck, stuck.player, stuck.boxes) is None


@pytest.mark.parametrize("boxes", [1, 2])
def test_generated_levels_are_seeded_solvable_and_need_a_push(boxes):
    for seed in range(6):
        level, optimal = generate_level(seed, boxes=boxes)
        again, _ = generate_level(seed, boxes=boxes)
        assert level == again and len(level.boxes) == len(level.goals) == boxes
        assert level.boxes != level.goals and level.player not in level.walls | level.boxes
        solution = solve(level, level.player, level.boxes)
        assert solution is not None and len(solution) == optimal >= 1
    assert generate_level(0, boxes=boxes)[0] != generate_level(1, boxes=boxes)[0]


def test_sokoban_push_blocked_and_text():
    env = SokobanEnv()
    env.reset(0)
    env.level = level_from("######\n#@$_.#\n######")
    env.player, env.box_cells = env.level.player, env.level.boxes
    assert env.render() == "######\n#@$_.#\n######"
    obs, reward, terminated, _, info = env.step("Up")
    assert info["blocked"] and "Blocked" in obs and reward == 0 and not terminated
    assert env.step("Right")[0] == "######\n#_@$.#\n######"
    obs, reward, terminated, truncated, _ = env.step("R")
    assert obs == "######\n#__@*#\n######\nSolved!" and (reward, terminated, truncated) == (1.0, True, False)


def test_render_symbols_for_player_and_boxes_on_goals():
    level = level_from("#####\n#+*$#\n#___#\n#####")
    assert level.goals == {(1, 1), (1, 2)}
    assert render(level, level.player, level.boxes) == "#####\n#+*$#\n#___#\n#####"


# ------------------------------------------------------------------ expert


@pytest.mark.parametrize("name", ["frozenlake", "sokoban"])
def test_expert_demonstrations_win_in_the_optimal_number_of_steps(name):
    env_cls = {"frozenlake": FrozenLakeEnv, "sokoban": SokobanEnv}[name]
    demos = demonstrations(name, range(8))
    for demo in demos:
        optimal = env_cls().reset(demo.seed)[1]["optimal_steps"]
        assert demo.solved and demo.total_reward == 1.0 and len(demo.turns) == optimal
        assert all(t.response.startswith("<answer>") for t in demo.turns)
        assert demo.turns[0].observation == env_cls().reset(demo.seed)[0]
    messages = demos[0].messages()
    assert [m["role"] for m in messages[:2]] == ["user", "assistant"]
    assert len(messages) == 2 * len(demos[0].turns)


def test_expert_needs_an_expert_action():
    class NoExpert:
        def reset(self, seed):
            return "", {}

    with pytest.raises(TypeError, match="no scripted expert"):
        demonstrate(NoExpert(), 0)
