"""A reward function of your own: full credit for the exact answer, partial credit for a near miss.

Train with it (the README's "your own reward" step):
    cadence train reward.name=python:examples/rewards/close_enough.py:score

cadence calls `score(prompt, response)` in separate worker processes; a call that raises,
hangs past reward.timeout_s or returns a non-number scores 0.0 and is counted.
"""


def score(prompt, response: str) -> float:
    # prompt.text: what the policy saw; prompt.answer: the gold answer (a string);
    # prompt.meta: the task's extra fields (a jsonl line's other keys); response: the raw completion
    answer = response.strip()
    if answer == prompt.answer:
        return 1.0
    if answer.isdigit() and prompt.answer.isdigit() and abs(int(answer) - int(prompt.answer)) == 10:
        return 0.2  # the built-in model's habit: a forgotten carry is off by exactly ten
    return 0.0
