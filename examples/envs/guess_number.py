"""Guess the number: a complete cadence environment (docs/agentic.md includes this file).

Train on it with a model that can follow its prompt (a local instruction-tuned checkpoint):
    cadence train env.name=python:examples/envs/guess_number.py:GuessNumber env.kwargs.high=50 model.path=PATH

The built-in model was taught 2-digit addition only: it never writes an <answer> tag,
so every episode scores the format penalty, no group has a reward to compare, and after
three steps the run warns "no learning signal ... the model never produced an answer the
reward accepts". For an environment run that learns on the shipped models, see
examples/frozenlake.yaml.
"""

import random


class GuessNumber:
    """Find a secret number between 1 and `high`; the environment says higher or lower."""

    action_tag = "answer"  # the runner passes the text inside the last <answer>...</answer>

    def __init__(self, high: int = 100) -> None:
        self.high = high
        self.secret = 0

    def reset(self, seed: int) -> tuple[str, dict]:
        self.secret = random.Random(seed).randint(1, self.high)  # same seed, same episode
        task = (
            f"I picked a whole number from 1 to {self.high}. Guess it; after each guess I say "
            "'higher' or 'lower'. Reply with your guess in <answer>...</answer>."
        )
        return task, {"secret": self.secret}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        try:
            guess = int(action.strip())
        except ValueError:
            return f"{action!r} is not a whole number.", 0.0, False, False, {"invalid": True}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}  # terminated: the task is done
        hint = "higher" if guess < self.secret else "lower"
        return hint, 0.0, False, False, {}

    def close(self) -> None:
        pass  # nothing to free here: a socket, a subprocess or a browser would be closed here
