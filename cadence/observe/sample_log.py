"""`<run>/samples.jsonl`: a bounded log of trained groups, for browsing samples and episodes.

Every `every`-th step the first `groups` groups the trainer received are
written, one line per sample: token ids, each token decoded, the loss mask
(1 where the token carried loss: the model's own tokens; 0 on observations an
environment appended between turns), the engine's log-probs, reward and the
policy versions that started and finished it. The file is bounded: past
`max_lines` lines it becomes `samples.1.jsonl` (replacing the previous one)
and a new file starts, so a long run keeps between max_lines and 2 x max_lines
recent samples. On resume both files are cut back to the checkpoint's step, as
metrics.jsonl is, so the steps a killed run redoes are not logged twice. Lines carry `prompt_ids`/`response_ids`, so
`cadence rhythm CKPT --from-rollout runs/X/samples.jsonl --index i` plots any of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cadence.observe.metrics import truncate_jsonl
from cadence.rollout.sample import Group, Sample

SAMPLES_FILE = "samples.jsonl"
OLD_SAMPLES_FILE = "samples.1.jsonl"


class SampleLog:
    def __init__(
        self, run_dir: Path, tokenizer: Any, every: int, groups: int = 1, max_lines: int = 5000, resume_step: int = 0
    ) -> None:
        self.path = run_dir / SAMPLES_FILE
        for path in (self.path, run_dir / OLD_SAMPLES_FILE):
            truncate_jsonl(path, resume_step)
        self.tokenizer = tokenizer
        self.every, self.groups, self.max_lines = every, groups, max_lines
        self._lines = _count_lines(self.path)
        self._file = self.path.open("a")

    def log(self, step: int, trainer_version: int, groups: list[Group]) -> None:
        if not self.every or step % self.every:
            return
        lines = [
            json.dumps(self._record(step, trainer_version, group, i, sample), separators=(",", ":"))
            for group in groups[: self.groups]
            for i, sample in enumerate(group.samples)
        ]
        if self._lines + len(lines) > self.max_lines:
            self._rotate()
        self._file.write("".join(line + "\n" for line in lines))
        self._file.flush()
        self._lines += len(lines)

    def _record(self, step: int, trainer_version: int, group: Group, index: int, s: Sample) -> dict[str, Any]:
        mask = s.loss_mask if s.loss_mask is not None else [1] * len(s.response_ids)
        return {
            "step": step,
            "trainer_version": trainer_version,
            "group_id": group.group_id,
            "prompt_id": s.prompt_id,
            "index": index,
            "group_rewards": group.rewards,
            "reward": s.reward,
            "version": s.version,
            "finish_version": s.finish_version,
            "staleness": trainer_version - s.version,
            "finish_reason": s.finish_reason,
            "reward_error": s.reward_error,
            "prompt": self.tokenizer.decode(s.prompt_ids),
            "response": s.response_text or self.tokenizer.decode(s.response_ids),
            "prompt_ids": s.prompt_ids,
            "response_ids": s.response_ids,
            "tokens": [self.tokenizer.decode([t]) for t in s.response_ids],
            "loss_mask": mask,
            "logprobs": [round(x, 4) for x in s.behaviour_logprobs],
            # Multi-turn episodes: (token index, reward) of each turn's end, where the turn was paid.
            "turn_rewards": [[i, r] for i, r in enumerate(s.token_rewards) if r] if s.token_rewards else None,
        }

    def _rotate(self) -> None:
        self._file.close()
        os.replace(self.path, self.path.with_name(OLD_SAMPLES_FILE))
        self._file = self.path.open("a")
        self._lines = 0

    def close(self) -> None:
        self._file.close()


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)
