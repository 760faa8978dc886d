"""Environments that fail on every episode, for the stop-loud tests (issue 29)."""

from __future__ import annotations


class StepAlwaysRaises:
    def reset(self, seed: int):
        return "go", {}

    def step(self, action: str):
        raise ValueError("the board is broken")


class ResetAlwaysRaises:
    def reset(self, seed: int):
        raise KeyError("no such level")

    def step(self, action: str):
        return "", 0.0, True, False, {}


class HugeFirstObservation:
    def reset(self, seed: int):
        return "x " * 5000, {}

    def step(self, action: str):
        return "", 0.0, True, False, {}
