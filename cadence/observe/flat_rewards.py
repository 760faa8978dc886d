"""A run with no learning signal says so early: the warning for groups whose rewards are all equal.

Group-relative advantages (GRPO, RLOO, ...) are a sample's reward against its
group's: a group whose samples all got the same reward contributes nothing. A run
whose every group is like that for its first steps is training on zeros, most often
because the model never produces an answer the reward accepts (the wrong model for
the task or environment). It is not stopped (a short run or a test can see this
legitimately, and a model may find its first reward later); it is told, in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tqdm import tqdm

WATCHED_STEPS = 3  # the first steps of a run that are watched


def flat_reward_cause(group_rewards: Sequence[Sequence[float]]) -> str | None:
    """None when some group's rewards differ (there is a signal); else the likely cause, one line."""
    if any(len(set(rewards)) > 1 for rewards in group_rewards):
        return None
    values = {rewards[0] for rewards in group_rewards if rewards}
    if len(values) > 1:
        return ("each prompt's responses all got the same reward (rewards differ only between prompts): "
                "sampling gives no variety within a group; raise rollout.temperature or rollout.group_size")
    if not values:
        return None
    value = values.pop()
    if value >= 1:
        return f"every response got reward {value:.3f}: the model already solves every prompt, nothing is left to learn"
    if value <= 0:
        return (f"every response got reward {value:.3f}: the model never produced an answer the reward accepts; "
                "check that the model can follow the prompt's format (model.path) and that the reward "
                "scores what you expect (cadence eval)")
    return f"every response got reward {value:.3f}: the reward does not tell the responses apart"


class FlatRewardWatch:
    """Watches the first `steps` training steps a run takes; if every group of every one of them
    had equal rewards, writes one warning line (once) naming the likely cause."""

    def __init__(self, steps: int = WATCHED_STEPS, echo: Callable[[str], None] = tqdm.write) -> None:
        self.steps, self.echo = steps, echo
        self.seen = 0

    def update(self, groups: Sequence) -> str | None:
        """Take one step's groups (each with `.samples`, each with `.reward`); the warning when it fires."""
        if self.seen >= self.steps:
            return None
        self.seen += 1
        cause = flat_reward_cause([[s.reward for s in g.samples] for g in groups])
        if cause is None:
            self.seen = self.steps  # a signal: nothing to warn about in this run's first steps
            return None
        if self.seen < self.steps:
            return None
        message = (f"warning: no learning signal in the first {self.steps} steps, every group's rewards are "
                   f"equal so their advantages are 0: {cause}")
        self.echo(message)
        return message
