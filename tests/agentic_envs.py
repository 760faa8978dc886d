"""Small environments for the agentic end-to-end tests (loaded as env.name=python:tests/agentic_envs.py:...)."""


class Parity:
    """Two turns; each turn pays 1 when the response's character codes add up to an odd
    number, so returns vary within a group even for an untrained model and every loss has a
    gradient to follow."""

    def reset(self, seed: int) -> tuple[str, dict]:
        self.turn = 0
        return f"say something ({seed})", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        return "again", float(sum(map(ord, action)) % 2), self.turn == 2, False, {}
