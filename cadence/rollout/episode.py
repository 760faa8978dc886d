"""One agent episode: observation -> completion -> environment step -> ..., tokens in and out.

An episode runs as one coroutine against the shared `InferenceHub`, so while
it waits for its environment the engine serves every other episode:

    ids = turns.first(first observation)                     the prompt
    repeat:
        out = await hub.generate(ids)                       model tokens: mask 1, log-probs, version
        step = await env.step(out.text)                     (off the event loop)
        ids += out.token_ids + turns.after(out, observation) environment tokens: mask 0, log-prob 0
    until the episode is done, max_turns, or the context budget is spent

`turns` (cadence/rollout/turns.py) is the plain-text format or the
tokenizer's chat template; either way it only makes the ids that go between
the model's own.

The episode becomes ONE training sample: the first observation is its prompt
and everything after it, model and environment tokens alike, is its
response, with `loss_mask` 1 only on the model's tokens. The trainer sees
exactly the ids the engine sampled and the ids appended for each observation;
the decoded text is never tokenised again (verl users lost turn separators
that way), so the trained sequence equals the last turn's context plus its
output, id for id.

Context budget: a turn is only started when the context plus the turn's
max_new_tokens fits in `max_context_tokens`; otherwise the episode ends as
truncated with the rewards it has. Its return is the sum of its step rewards;
`Sample.token_rewards` keeps them per turn (each on its turn's last model
token) for the per-turn advantages (turn_grpo, gae).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from cadence.envs.runner import EnvFailure, EnvRunner
from cadence.inference.hub import InferenceHub
from cadence.inference.types import GenRequest, SamplingParams
from cadence.rollout.sample import Sample
from cadence.rollout.turns import PlainTurns, TurnFormat


@dataclass
class Episode:
    """What one episode produced: its sample, or why it was lost."""

    seed: int
    sample: Sample | None = None
    failure: EnvFailure | None = None
    turns: int = 0
    truncated: bool = False
    rewards: list[float] = field(default_factory=list)
    first_too_long: int | None = None  # the first observation's tokens, when it left no room for a turn

    @property
    def ok(self) -> bool:
        return self.sample is not None


async def run_episode(
    hub: InferenceHub,
    env: EnvRunner,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    seed: int,
    episode_id: str,
    group_id: int = 0,
    turns: TurnFormat = PlainTurns(),
    max_context_tokens: int = 2048,
) -> Episode:
    """Play one episode on `env` (reset with `seed`); see the module docstring."""
    episode = Episode(seed=seed)
    first = await env.reset(seed)
    if isinstance(first, EnvFailure):
        episode.failure = first
        return episode
    prompt = turns.first(tokenizer, first.observation)
    response: list[int] = []
    loss_mask: list[int] = []
    behaviour_logprobs: list[float] = []
    token_rewards: list[float] = []
    versions: list[int] = []
    finish_version: int | None = None
    try:
        while True:
            context = prompt + response
            if len(context) + params.max_new_tokens > max_context_tokens:
                episode.truncated = True
                break
            request_id = f"{episode_id}/{episode.turns}"
            try:
                out = await hub.generate(GenRequest(request_id, context, params), affinity=episode_id)
            except asyncio.CancelledError:  # a redundant straggler: free its engine slot at once
                hub.abort(request_id)
                raise
            episode.turns += 1
            response += out.token_ids
            loss_mask += [1] * len(out.token_ids)
            behaviour_logprobs += out.logprobs
            versions.append(out.version)
            finish_version = out.finish_version
            if out.finish_reason == "abort":  # cancelled (a redundant straggler): nothing to train
                episode.failure = EnvFailure("died", "step", "generation aborted")
                return episode
            step = await env.step(out.text)
            if isinstance(step, EnvFailure):
                episode.failure = step
                return episode
            episode.rewards.append(step.reward)
            token_rewards += [0.0] * len(out.token_ids)
            if out.token_ids:
                token_rewards[-1] = step.reward  # a turn's reward sits on its last model token
            if step.done:
                episode.truncated = step.truncated and not step.terminated
                break
            observation = turns.after(tokenizer, out.token_ids, step.observation)
            # Turns are told apart by the observation tokens between them (cadence.algo.turn_returns).
            assert observation, "a turn format must put at least one token between two turns"
            response += observation
            loss_mask += [0] * len(observation)
            behaviour_logprobs += [0.0] * len(observation)
            token_rewards += [0.0] * len(observation)
    finally:
        hub.forget(episode_id)
    if not versions:  # the first observation alone filled the budget: nothing the model did
        episode.failure = EnvFailure("died", "reset", "first observation exceeds max_context_tokens")
        episode.first_too_long = len(prompt)
        return episode
    episode.sample = Sample(
        prompt_id=f"seed{seed}",
        group_id=group_id,
        prompt_ids=prompt,
        response_ids=response,
        behaviour_logprobs=behaviour_logprobs,
        reward=sum(episode.rewards),
        version=min(versions),  # staleness is judged by the oldest turn
        finish_reason="length" if episode.truncated else "stop",
        finish_version=finish_version,
        loss_mask=loss_mask,
        token_rewards=token_rewards,
    )
    return episode
