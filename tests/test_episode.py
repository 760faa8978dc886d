"""The episode loop: tokens in and out, loss masks, failures cost one episode."""

from __future__ import annotations

import asyncio

import torch

from cadence.envs.runner import EnvRunner
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import InferenceHub
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from cadence.rollout.episode import run_episode
from cadence.rollout.turns import PlainTurns
from cadence.train.batch import collate


class Echo:
    """Three turns; every observation says which turn it is. Reward 1 on the last."""

    def reset(self, seed: int):
        self.turn = 0
        return f"start {seed}", {}

    def step(self, action: str):
        self.turn += 1
        done = self.turn == 3
        return f"turn {self.turn}", float(done), done, False, {}


class Explodes(Echo):
    def step(self, action: str):
        raise RuntimeError("the environment broke")


class RecordingHub(InferenceHub):
    """Keeps every request's context and result, to compare with the trained sequence."""

    def __init__(self, engines):
        super().__init__(engines)
        self.seen: list[tuple[GenRequest, object]] = []

    async def generate(self, req, affinity=None):
        out = await super().generate(req, affinity)
        self.seen.append((req, out))
        return out


def _setup(env_cls):
    tok = load_tokenizer("builtin")
    hub = RecordingHub([EmbeddedEngine(load_policy("builtin").eval(), tok, seed=0)])
    runner = EnvRunner(env_cls, action_tag=None, step_timeout_s=10)
    return tok, hub, runner


def test_the_trained_sequence_is_the_last_turns_context_plus_its_output_id_for_id():
    tok, hub, runner = _setup(Echo)
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    episode = asyncio.run(hub.serving(run_episode(hub, runner, tok, params, seed=7, episode_id="e0")))
    assert episode.ok and episode.turns == 3 and episode.rewards == [0.0, 0.0, 1.0]
    sample = episode.sample
    last_req, last_out = hub.seen[-1]
    assert sample.prompt_ids + sample.response_ids == last_req.prompt_ids + last_out.token_ids
    # Model tokens are trained on (with the engine's mu), observation tokens are not.
    model_tokens = [t for _, out in hub.seen for t in out.token_ids]
    assert [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m] == model_tokens
    assert [lp for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if m] == [
        lp for _, out in hub.seen for lp in out.logprobs
    ]
    observations = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if not m]
    assert observations == tok("\nturn 1\n\nturn 2\n", add_special_tokens=False).input_ids
    assert sample.reward == 1.0 and sample.finish_reason == "stop"
    # Each turn's reward sits on the turn's last model token (the per-turn advantages read it there).
    turn_ends = [i for i, m in enumerate(sample.loss_mask) if m and (i + 1 == len(sample.loss_mask) or not sample.loss_mask[i + 1])]
    assert [sample.token_rewards[i] for i in turn_ends] == episode.rewards
    assert sum(sample.token_rewards) == sample.reward and len(sample.token_rewards) == len(sample.response_ids)
    # Every turn's context is the previous turn's context, its output and the observation.
    for (req, out), (nxt, _) in zip(hub.seen, hub.seen[1:], strict=False):
        assert nxt.prompt_ids[: len(req.prompt_ids) + len(out.token_ids)] == req.prompt_ids + out.token_ids
    # collate turns the loss mask into the trainer's mask: only model tokens count.
    batch = collate([sample], pad_id=0)
    assert int(batch.mask.sum()) == sum(sample.loss_mask) == len(model_tokens)
    assert torch.equal(batch.mask[0, len(sample.prompt_ids) - 1 :][: len(sample.loss_mask)],
                       torch.tensor(sample.loss_mask, dtype=torch.float32))


def test_a_raising_environment_costs_its_episode_only():
    tok, hub, runner = _setup(Explodes)
    params = SamplingParams(max_new_tokens=3)

    async def both():
        good = EnvRunner(Echo, action_tag=None)
        return await asyncio.gather(
            run_episode(hub, runner, tok, params, seed=1, episode_id="bad"),
            run_episode(hub, good, tok, params, seed=2, episode_id="good"),
        )

    bad, good = asyncio.run(hub.serving(both()))
    assert not bad.ok and bad.failure.kind == "raised" and "broke" in bad.failure.message
    assert good.ok and good.turns == 3


def test_the_context_budget_truncates_an_episode():
    tok, hub, runner = _setup(Echo)
    params = SamplingParams(max_new_tokens=5)
    first = len(tok("start 3\n").input_ids)
    budget = first + 5 + len(tok("\nturn 1\n", add_special_tokens=False).input_ids) + 4  # room for 1 turn
    episode = asyncio.run(hub.serving(run_episode(hub, runner, tok, params, 3, "e", max_context_tokens=budget)))
    assert episode.ok and episode.truncated and episode.turns == 1
    assert episode.sample.finish_reason == "length"
    assert len(episode.sample.prompt_ids) + len(episode.sample.response_ids) <= budget


def test_plain_turns_wrap_observations_in_newlines():
    tok = load_tokenizer("builtin")
    assert PlainTurns().first(tok, "grid") == tok("grid\n").input_ids
    assert PlainTurns().after(tok, [5, 6], "grid") == tok("\ngrid\n", add_special_tokens=False).input_ids
    assert PlainTurns("be brief").first(tok, "grid") == tok("be brief\ngrid\n").input_ids
