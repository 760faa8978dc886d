"""`task.kwargs` of the built-in generated tasks ("arith", "chain"): their schemas and load-time checks.

`TaskConfig` validates its kwargs here, so the checks need none of the task code.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

OptionsT = TypeVar("OptionsT", bound=BaseModel)


def parse_task_options(options_cls: type[OptionsT], kwargs: dict, task: str) -> OptionsT:
    """Validate `task.kwargs` of a built-in task, with messages that name the config path."""
    try:
        return options_cls(**kwargs)
    except ValidationError as exc:
        problems = "; ".join(
            f"task.kwargs.{'.'.join(map(str, e['loc'])) or '(options)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise ValueError(f"invalid {task!r} options: {problems}") from None


def check_test_share(test_size: int, space: int, task: str, fix: str) -> None:
    """Fail if the test split would take more than half of a generated task's problems."""
    if test_size > space // 2:
        raise ValueError(
            f"task.test_size={test_size} would hold out more than half of the {space} "
            f"distinct {task!r} problems; lower it or {fix}"
        )


Operation = Literal["+", "-", "*"]


class ArithOptions(BaseModel):
    """`task.kwargs` for "arith"."""

    model_config = ConfigDict(extra="forbid")

    operations: list[Operation] = Field(
        default_factory=lambda: ["+"],
        min_length=1,
        description="Operators to sample from; '-' may give negative answers.",
    )
    digits: int = Field(2, ge=1, le=9, description="Operands are uniform in [0, 10**digits - 1].")
    pad_operands: bool = Field(
        True, description="Write operands zero-padded to `digits` ('07+45='), so columns line up."
    )
    sft_carry_slip: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="SFT only: share of answers to carrying '+' problems that forget to "
        "carry the one (a noisy-annotator warm-up for RL to correct). Test answers stay exact.",
    )

    @field_validator("operations")
    @classmethod
    def _unique(cls, ops: list[Operation]) -> list[Operation]:
        if len(set(ops)) != len(ops):
            raise ValueError(f"operations must not repeat, got {ops}")
        return ops

    @property
    def space(self) -> int:
        """Number of distinct problems."""
        return (10**self.digits) ** 2 * len(self.operations)


def parse_arith_options(kwargs: dict) -> ArithOptions:
    """Validate `task.kwargs` with messages that name the config path."""
    return parse_task_options(ArithOptions, kwargs, "arith")


def check_arith_config(kwargs: dict, test_size: int) -> None:
    """Fail at load time if the options are invalid or leave too few training problems."""
    space = parse_arith_options(kwargs).space
    check_test_share(test_size, space, "arith", "raise task.kwargs.digits")


LIMIT = 100
"""The chain stops at the first running total >= LIMIT."""


class ChainOptions(BaseModel):
    """`task.kwargs` for "chain"."""

    model_config = ConfigDict(extra="forbid")

    step_min: int = Field(3, ge=1, le=99, description="Smallest step b; the longest chain has ceil(100 / step_min) steps.")
    step_max: int = Field(40, ge=1, le=99, description="Largest step b.")

    @model_validator(mode="after")
    def _order(self) -> ChainOptions:
        if self.step_min > self.step_max:
            raise ValueError(f"step_min ({self.step_min}) must not exceed step_max ({self.step_max})")
        return self

    @property
    def space(self) -> int:
        """Number of distinct problems: start a in [0, 99] times step b in [step_min, step_max]."""
        return LIMIT * (self.step_max - self.step_min + 1)


def parse_chain_options(kwargs: dict) -> ChainOptions:
    """Validate `task.kwargs` with messages that name the config path."""
    return parse_task_options(ChainOptions, kwargs, "chain")


def check_chain_config(kwargs: dict, test_size: int) -> None:
    """Fail at load time if the options are invalid or leave too few training problems."""
    space = parse_chain_options(kwargs).space
    check_test_share(test_size, space, "chain", "widen task.kwargs.step_min/step_max")


class RepoBugsOptions(BaseModel):
    """`task.kwargs` for "repo_bugs"."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(300, ge=2, le=100_000, description="Tasks in all: the test split's, then the train split's.")


def check_repo_bugs_config(kwargs: dict, test_size: int) -> None:
    """Fail at load time if the options are invalid or leave too few training tasks."""
    size = parse_task_options(RepoBugsOptions, kwargs, "repo_bugs").size
    if test_size >= size:
        raise ValueError(f"task.test_size={test_size} leaves none of the {size} 'repo_bugs' tasks to train on; "
                         "lower it or raise task.kwargs.size")
