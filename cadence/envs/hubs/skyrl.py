"""skyrl-gym environments (``skyrl-gym``, SkyRL's): ``env.name=skyrl:<id> env.kwargs.data=FILE``.

    env.name=skyrl:gsm8k_multi_turn env.kwargs.data=gsm8k.jsonl

A skyrl-gym environment is made per dataset row, not per seed: SkyRL's rows
(JSONL or Parquet) hold the ``prompt`` (chat messages), the ``reward_spec``
(``{"ground_truth": ...}``) and ``extra_info``. Each episode takes the row
``seed % len(rows)``, makes ``skyrl_gym.make(id, env_config=..., extras=row)``
and starts it with ``init(prompt)``; ``env.kwargs.env_config`` is the
environment's own settings (SkyRL's ``environment.skyrl_gym.<id>`` section).
Observations are chat messages: their contents, joined by blank lines, are the
text the policy sees. The whole response is the action (`action_tag = None`):
skyrl-gym's environments parse it themselves (``#### 42``, ``<sql>...</sql>``).
``done`` is ``terminated``; cadence's ``env.max_turns`` cuts longer episodes.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from cadence.envs.contract import ResetReturn, StepReturn
from cadence.envs.hubs import bind_id, unknown_id


def load_rows(data: str | None) -> list[dict[str, Any]]:
    """SkyRL dataset rows from a .jsonl or .parquet file; ValueError naming env.kwargs.data."""
    if data is None:
        raise ValueError("env.kwargs.data: a skyrl-gym environment plays rows of a dataset; "
                         "set env.kwargs.data=FILE.jsonl (or .parquet) of SkyRL rows")
    path = Path(data).expanduser()
    if not path.is_file():
        raise ValueError(f"env.kwargs.data: file not found: {path}")
    if path.suffix == ".parquet":
        import pandas as pd

        rows = pd.read_parquet(path).to_dict("records")
    else:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        try:
            rows = [json.loads(line) for line in lines]
        except json.JSONDecodeError as exc:
            raise ValueError(f"env.kwargs.data: {path} is not JSONL (or .parquet): {exc}") from None
    if not rows:
        raise ValueError(f"env.kwargs.data: {path} has no rows")
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict) or "prompt" not in row), None)
    if bad is not None:
        raise ValueError(f"env.kwargs.data: row {bad} of {path} has no 'prompt' (SkyRL's dataset format)")
    return rows


def messages_text(messages: Any) -> str:
    """The text of skyrl-gym observations: chat messages' contents, or a plain string as it is."""
    if isinstance(messages, str):
        return messages
    return "\n\n".join(str(m.get("content", "")) for m in messages or [])


class SkyRLEnv:
    """A skyrl-gym environment over a dataset of rows (see the module docstring)."""

    action_tag = None
    skyrl_id = ""

    @staticmethod
    def check_config(data: str | None = None, env_config: dict[str, Any] | None = None) -> None:
        load_rows(data)  # ValueError: no file, a missing file, no rows, a row without a prompt

    def __init__(self, data: str | None = None, env_config: dict[str, Any] | None = None) -> None:
        from omegaconf import OmegaConf  # skyrl-gym's environments read their config as attributes

        self.rows = load_rows(data)
        self.env_config = OmegaConf.create(env_config or {})
        self.env: Any = None

    def reset(self, seed: int) -> ResetReturn:
        import skyrl_gym

        self.close()
        row = self.rows[seed % len(self.rows)]
        extras = {key: value for key, value in row.items() if key not in ("prompt", "env_class")}
        self.env = skyrl_gym.make(self.skyrl_id, env_config=self.env_config, extras=extras)
        prompt, info = self.env.init(row["prompt"])
        return messages_text(prompt), dict(info or {})

    def step(self, action: str) -> StepReturn:
        out = self.env.step(action)
        info = dict(out.get("metadata") or {})
        return messages_text(out["observations"]), float(out["reward"]), bool(out["done"]), False, info

    def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            env.close()


@functools.cache
def env_class(skyrl_id: str) -> type:
    """The environment class of ``skyrl:<skyrl_id>``; ValueError naming the closest ids if unknown."""
    import skyrl_gym

    if skyrl_id not in skyrl_gym.registry:
        raise unknown_id(f"skyrl:{skyrl_id}", skyrl_id, skyrl_gym.registry, "skyrl_gym.pprint_registry()")
    return bind_id(SkyRLEnv, "skyrl_id", skyrl_id)
