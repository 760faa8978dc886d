"""The FrozenLake warm-up (`cadence sft` on the scripted expert) and the model it shipped."""

from __future__ import annotations

import random

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from cadence.config import load_config
from cadence.envs.expert import demonstrate, demonstrations, hole_blind_action
from cadence.envs.frozenlake import FrozenLakeEnv
from cadence.envs.sokoban import SokobanEnv
from cadence.models.loading import model_path_problem, resolve_model_path
from cadence.models.tiny import char_tokenizer
from cadence.observe.metrics import read_jsonl
from cadence.recipes.sft import encode_episodes, encode_turns, load_sft_config, sft
from cadence.recipes.train_rlvr import train
from cadence.rollout.turns import PlainTurns

WARM_UP_TURNS = "cadence/configs/sft_frozenlake_turns.yaml"  # stage 1
WARM_UP = "cadence/configs/sft_frozenlake.yaml"  # stage 2, from stage 1's model


def test_an_episode_is_laid_out_as_a_rollout_lays_it_out_with_the_loss_on_the_replies():
    tokenizer = char_tokenizer()
    demo = demonstrations("frozenlake", [7], {"rules": False})[0]
    assert demo.solved and len(demo.turns) >= 2
    (ids, mask), = encode_episodes(tokenizer, [demo])
    eos = tokenizer.eos_token_id
    # What run_episode builds: first observation, then reply + EOS and the next observation, turn by turn.
    expected = PlainTurns().first(tokenizer, demo.turns[0].observation)
    for k, turn in enumerate(demo.turns):
        if k:
            expected += PlainTurns().after(tokenizer, [eos], turn.observation)
        expected += tokenizer(turn.response, add_special_tokens=False).input_ids + [eos]
    assert ids == expected
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tokenizer.decode(trained) == "".join(t.response + tokenizer.eos_token for t in demo.turns)


def test_bare_short_replies_are_the_moves_letter():
    tagged, bare = (demonstrations("frozenlake", [7], tag=tag, short=short)[0] for tag, short in
                    (("answer", False), (None, True)))
    assert [t.response for t in bare.turns] == [t.response[len("<answer>")] for t in tagged.turns]
    assert {t.response for t in bare.turns} <= set("LDRU")


def test_a_sloppy_demonstrator_walks_as_if_there_were_no_holes():
    env = FrozenLakeEnv(rules=False)
    fell = 0
    for seed in range(40):
        demo = demonstrate(env, seed, max_turns=10, slip=1.0, rng=random.Random(seed))
        env.reset(seed)
        for turn in demo.turns:  # replay: every move is the hole-blind one
            assert turn.response == f"<answer>{hole_blind_action(env)}</answer>"
            env.step(hole_blind_action(env))
        fell += not demo.solved
        assert demonstrate(env, seed, max_turns=10).solved  # the expert itself always wins
    assert 0 < fell < 40  # the habit fails on some maps, not all
    with pytest.raises(ValueError, match="no habitual mistake"):
        demonstrate(SokobanEnv(), 0, slip=0.5)


def test_the_sloppy_demonstrator_slips_on_its_share_of_moves_and_is_the_expert_otherwise():
    env = FrozenLakeEnv(rules=False, neighbours=True)
    slipped = differs = 0
    for seed in range(300):
        demo = demonstrate(env, seed, max_turns=10, slip=0.6, rng=random.Random(seed))
        env.reset(seed)
        for turn in demo.turns:  # replay: every move is the expert's or the habit's
            expert, habit = env.expert_action(), hole_blind_action(env)
            move = turn.response[len("<answer>"):-len("</answer>")]
            assert move in (expert, habit)
            if expert != habit:
                differs += 1
                slipped += move == habit
            env.step(move)
    assert differs > 100 and 0.5 < slipped / differs < 0.7  # 60% of the moves where it matters


def test_turn_examples_are_each_observation_alone_then_the_reply():
    tokenizer = char_tokenizer()
    demo = demonstrations("frozenlake", [7], {"rules": False, "neighbours": True}, tag=None, short=True)[0]
    rows = encode_turns(tokenizer, [demo])
    assert len(rows) == len(demo.turns)
    for (ids, mask), turn in zip(rows, demo.turns, strict=True):
        assert ids == tokenizer(turn.observation + "\n" + turn.response).input_ids + [tokenizer.eos_token_id]
        assert mask == [0] * (len(ids) - 2) + [1, 1]  # the letter and EOS


def test_the_frozenlake_warm_up_runs_and_saves_a_checkpoint_plain_transformers_loads(tmp_path):
    small = ["steps=2", "examples=8", "batch_size=4", "threads=1"]
    first = sft(load_sft_config(WARM_UP_TURNS, [*small, f"output={tmp_path / 'turns'}"]))
    out = sft(load_sft_config(WARM_UP, [*small, f"model.path={first}", f"output={tmp_path / 'fl'}"]))
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tokenizer) and (out / "sft_config.yaml").is_file()
    ids = tokenizer("SFFF\nFHFH\nFFFH\nHFFG\n", return_tensors="pt").input_ids
    assert ids.shape[1] < model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] <= ids.shape[1] + 3


def test_builtin_frozenlake_is_shipped_and_unknown_builtins_are_named():
    assert model_path_problem("builtin:frozenlake") is None
    assert (resolve_model_path("builtin:frozenlake") / "sft_config.yaml").is_file()
    assert "builtin:frozenlake" in model_path_problem("builtin:frozen")


@pytest.mark.slow
def test_the_shipped_frozenlake_model_trains_from_the_example_and_is_evaluated(tmp_path):
    cfg = load_config("examples/frozenlake.yaml", [
        "trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "eval.episodes=8",
        "eval.every=0", "logging.progress=false", "logging.tensorboard=false", f"logging.run_dir={tmp_path}/run",
    ])
    summary = train(cfg)
    assert summary.eval_before.prompts == 8 and summary.eval_after.prompts == 8
    assert summary.eval_before.pass_at_1 > 0  # the warm-up already solves some held-out maps
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps if r["step"] > 0] == [1, 2]
    assert steps[-1]["progress/samples_total"] == 2 * 2 * 4  # 2 steps of 2 maps x 4 episodes
    assert steps[-1]["rollout/turns_per_episode"] >= 1
    assert (summary.run_dir / "checkpoints" / "step_2").exists()
