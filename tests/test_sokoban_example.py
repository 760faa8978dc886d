"""Sokoban's positions line, the shipped `builtin:sokoban` model and examples/sokoban.yaml."""

from __future__ import annotations

import pytest
import yaml

from cadence.config import load_config
from cadence.envs.sokoban import SokobanEnv
from cadence.models.loading import model_path_problem, resolve_model_path
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train

EXAMPLE, WARM_UP = "examples/sokoban.yaml", "cadence/configs/sft_sokoban.yaml"


def test_the_positions_line_follows_the_player_and_the_box():
    env = SokobanEnv(6, 6, 1, rules=False, positions=True)
    first, _ = env.reset(3)
    room, line = first.rsplit("\n", 1)
    assert room == env.render() and line == env.positions_line()
    cells = {ch: (r, c) for r, row in enumerate(room.splitlines()) for c, ch in enumerate(row)}
    (pr, pc), (br, bc), (gr, gc) = cells["@"], cells["$"], cells["."]
    assert line == f"${br - pr:+d},{bc - pc:+d} .{gr - br:+d},{gc - bc:+d}"  # box from player, goal from box
    moved, *_ = env.step(env.expert_action())
    assert moved.splitlines()[-1] == env.positions_line() != line
    two = SokobanEnv(7, 7, 2, rules=False, positions=True)
    two.reset(3)  # two boxes: every box, then every goal, from the player
    assert two.positions_line() == "$+2,+0 $+2,+1 .-1,+0 .+0,+2" and "@" in two.render().splitlines()[2]
    assert SokobanEnv(6, 6, 1, rules=False).reset(3)[0] == room  # off by default: the room alone


def test_the_example_plays_the_game_as_the_shipped_model_learned_it():
    example, warm_up = (yaml.safe_load(open(path)) for path in (EXAMPLE, WARM_UP))
    shipped = yaml.safe_load((resolve_model_path("builtin:sokoban") / "sft_config.yaml").read_text())
    assert example["model"]["path"] == "builtin:sokoban" and model_path_problem("builtin:sokoban") is None
    for key in ("kwargs", "max_turns", "action_tag"):
        assert example["env"][key] == warm_up["env"][key] == shipped["env"][key], key
    assert warm_up["env"]["short_actions"] and example["rollout"]["max_new_tokens"] == 2  # letter + EOS


@pytest.mark.slow
def test_the_shipped_sokoban_model_trains_from_the_example_and_is_evaluated(tmp_path):
    cfg = load_config(EXAMPLE, [
        "trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "eval.episodes=8",
        "eval.every=0", "logging.progress=false", "logging.tensorboard=false", f"logging.run_dir={tmp_path}/run",
    ])
    summary = train(cfg)
    assert summary.eval_before.prompts == 8 and summary.eval_after.prompts == 8
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps if r["step"] > 0] == [1, 2]
    assert steps[-1]["progress/samples_total"] == 2 * 2 * 4  # 2 steps of 2 rooms x 4 episodes
    assert steps[-1]["rollout/turns_per_episode"] >= 1
    assert steps[-1]["rollout/prefill_tokens_saved_total"] > 0  # later turns continued their context


def test_an_episode_budget_never_passes_the_models_positions():
    """The shipped model knows 1024 positions; the default budget (2048) is capped to it."""
    from cadence.assemble import ConfiguredRolloutWorker

    cfg = load_config(EXAMPLE, ["eval.before=false"])
    assert cfg.rollout.max_context_tokens == 2048
    worker = ConfiguredRolloutWorker(cfg)
    assert worker.producer.max_context_tokens == 1024
    worker.close()
