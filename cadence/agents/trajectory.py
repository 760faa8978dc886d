"""Token-exact trajectories from an agent's requests.

The endpoint records, for every completion it returns, the prompt ids it
rendered, the ids the engine sampled, their log-probs (the behaviour policy's)
and the policy version. An agent run's requests form a tree:

- A request whose prompt ids start with an earlier completion's prompt +
  sampled ids, id for id, continues it (the deepest such completion is its
  parent). The ids in between are what the agent inserted (tool results, user
  turns, the template's turn markup): they join the sequence with loss mask 0
  and log-prob 0, never re-tokenised from text.
- A request that continues nothing starts a new root. Two causes, told apart
  by the messages (counted in metrics):
    "rewrite"  the agent changed its history (summarised, truncated, edited):
               the previous request's messages are not a prefix of this one's;
    "rerender" the messages only grew, yet the ids differ: the chat template
               renders earlier turns differently from what was sampled (e.g.
               thinking stripped from past turns, a stop string the agent cut).
  The rule is the same for both: the earlier sequence ends as its own sample
  and the new request starts another; all share the run's reward. Nothing is
  re-tokenised, so every trained id is one the engine sampled.

Samples: a chain of first children is one sample. A completion that continues
a parent which already has a continuation (an `n > 1` choice, a retried turn)
is a branch: its sample starts there, with everything before it as prompt. So
every sampled id is trained in exactly one sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadence.inference.types import GenResult
from cadence.rollout.sample import Sample

BREAKS = ("rewrite", "rerender")


@dataclass
class Completion:
    """One completion the engine sampled for a request, and where it sits in the run."""

    prompt_ids: list[int]
    result: GenResult
    parent: Completion | None
    first_child: Completion | None = None

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.result.token_ids


@dataclass
class Trajectory:
    """Every completion of one agent run, stitched into samples on demand."""

    run_id: str
    completions: list[Completion] = field(default_factory=list)
    last_messages: list[dict] | None = None
    counts: dict[str, int] = field(default_factory=lambda: {
        "requests": 0, "completions": 0, "stitched": 0, "rewrite": 0, "rerender": 0, "inserted_tokens": 0,
    })

    def record(self, prompt_ids: list[int], results: list[GenResult], messages: list[dict] | None) -> None:
        """Keep one request's completions (its `n` choices share `prompt_ids`)."""
        parent = self._parent(prompt_ids)
        self.counts["requests"] += 1
        if parent is not None:
            self.counts["stitched"] += 1
            self.counts["inserted_tokens"] += len(prompt_ids) - len(parent.full_ids)
        elif self.completions:
            grew = messages is not None and self.last_messages is not None and (
                messages[: len(self.last_messages)] == self.last_messages)
            self.counts["rerender" if grew else "rewrite"] += 1
        for result in results:
            node = Completion(list(prompt_ids), result, parent)
            if parent is not None and parent.first_child is None:
                parent.first_child = node
            self.completions.append(node)
            self.counts["completions"] += 1
        self.last_messages = messages

    def samples(self, reward: float, group_id: int, prompt_id: str) -> list[Sample]:
        """One sample per chain of first children; all carry the run's reward."""
        continued = {id(c.parent) for c in self.completions if c.parent is not None and c.parent.first_child is c}
        leaves = [c for c in self.completions if id(c) not in continued]
        return [self._sample(leaf, reward, group_id, prompt_id) for leaf in leaves]

    def _parent(self, prompt_ids: list[int]) -> Completion | None:
        """The completion this prompt continues id for id (the longest one), if any."""
        best, best_len = None, -1
        for node in self.completions:
            start, tokens = len(node.prompt_ids), node.result.token_ids
            end = start + len(tokens)
            # The sampled ids first: short, and they tell completions of one prompt apart.
            if best_len < end <= len(prompt_ids) and prompt_ids[start:end] == tokens \
                    and prompt_ids[:start] == node.prompt_ids:
                best, best_len = node, end
        return best

    def _sample(self, leaf: Completion, reward: float, group_id: int, prompt_id: str) -> Sample:
        chain = [leaf]
        while chain[0].parent is not None and chain[0].parent.first_child is chain[0]:
            chain.insert(0, chain[0].parent)
        head = chain[0]
        response: list[int] = []
        behaviour_logprobs: list[float] = []
        mask: list[int] = []
        done = len(head.prompt_ids)
        for node in chain:
            inserted = node.prompt_ids[done:]
            response += inserted + node.result.token_ids
            behaviour_logprobs += [0.0] * len(inserted) + node.result.logprobs
            mask += [0] * len(inserted) + [1] * len(node.result.token_ids)
            done = len(node.full_ids)
        return Sample(
            prompt_id=prompt_id,
            group_id=group_id,
            prompt_ids=list(head.prompt_ids),
            response_ids=response,
            behaviour_logprobs=behaviour_logprobs,
            reward=reward,
            version=min(n.result.version for n in chain),
            finish_reason=leaf.result.finish_reason,
            response_text=leaf.result.text,
            finish_version=max(n.result.finish_version for n in chain),
            loss_mask=mask,
        )
