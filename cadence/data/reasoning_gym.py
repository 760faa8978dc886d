"""Any reasoning-gym dataset as a task ("rg:<dataset>").

Why the seed arithmetic: most reasoning-gym datasets build entry `idx` from
``Random(seed + idx)``, so datasets with seeds 1 and 2 share all but one entry.
Train therefore uses seeds ``seed, seed+1, ...`` and test starts 2**31 away,
and train additionally skips any question that appears in the test split
(small generators do repeat questions).

`Prompt.meta["entry"]` is the untouched dataset entry: scorers compare against
its metadata, and some (arc_agi, rearc) score 1.0 only against the original
tuples, not a JSON round-trip of them.
"""

from __future__ import annotations

from typing import Any

from cadence.data.config import RG_PREFIX, TaskConfig, check_rg_dataset
from cadence.data.tasks import Extract, Prompt, Split, check_split

TEST_SEED_OFFSET = 2**31
_MAX_DRAWS_FACTOR = 10  # train gives up after 10 n + 100 draws that mostly hit the test split


class ReasoningGymTask:
    """Prompts from `reasoning_gym.create_dataset(name, size=..., seed=..., **kwargs)`."""

    default_reward = "reasoning_gym"
    default_extract: Extract = "answer_tag"
    stop: tuple[str, ...] = ()

    def __init__(
        self,
        dataset: str,
        kwargs: dict[str, Any] | None = None,
        *,
        test_size: int = 200,
        seed: int = 0,
        prompt_suffix: str = "",
    ) -> None:
        self.kwargs = dict(kwargs or {})
        check_rg_dataset(dataset, self.kwargs)
        self.dataset = dataset
        self.name = RG_PREFIX + dataset
        self.test_size = test_size
        self.seed = seed
        self.prompt_suffix = prompt_suffix
        self._test_cache: dict[int, list[dict[str, Any]]] = {}

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> ReasoningGymTask:
        """Build from a validated `TaskConfig` named "rg:<dataset>"."""
        return cls(
            cfg.name[len(RG_PREFIX) :],
            cfg.kwargs,
            test_size=cfg.test_size,
            seed=cfg.seed,
            prompt_suffix=cfg.prompt_suffix,
        )

    def _entries(self, seed: int, size: int) -> list[dict[str, Any]]:
        import reasoning_gym

        ds = reasoning_gym.create_dataset(self.dataset, size=size, seed=seed % 2**32, **self.kwargs)
        return [ds[i] for i in range(size)]

    def _test_entries(self, seed: int) -> list[dict[str, Any]]:
        if seed not in self._test_cache:
            entries, seen = [], set()
            if self.test_size:
                for entry in self._entries(seed + TEST_SEED_OFFSET, self.test_size):
                    if entry["question"] not in seen:
                        seen.add(entry["question"])
                        entries.append(entry)
            self._test_cache[seed] = entries
        return self._test_cache[seed]

    def _prompt(self, entry: dict[str, Any], prompt_id: str) -> Prompt:
        answer = entry.get("answer")
        return Prompt(
            id=prompt_id,
            text=entry["question"] + self.prompt_suffix,
            # A few datasets (boxnet, graph_color, ...) have no single gold answer.
            answer="" if answer is None else str(answer),
            meta={"entry": entry},
        )

    def prompts(self, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """Train: `n` entries from seeds ``seed + i``, skipping test questions. Test: the
        first min(n, test_size) distinct entries starting at ``seed + 2**31``."""
        split = check_split(split)
        seed = self.seed if seed is None else seed
        if split == "test":
            return [
                self._prompt(e, f"{self.name}:test:{seed}:{i}")
                for i, e in enumerate(self._test_entries(seed)[:n])
            ]
        held_out = {e["question"] for e in self._test_entries(seed)}
        out: list[Prompt] = []
        drawn = 0
        while len(out) < n:
            if drawn > _MAX_DRAWS_FACTOR * n + 100:
                raise RuntimeError(
                    f"{self.name}: only {len(out)} of {n} train prompts after {drawn} draws; "
                    "the generator keeps repeating test questions (lower task.test_size)"
                )
            # A fresh dataset per chunk continues the Random(seed + idx) stream.
            for entry in self._entries(seed + drawn, n - len(out)):
                if entry["question"] not in held_out:
                    out.append(self._prompt(entry, f"{self.name}:train:{seed}:{drawn}"))
                drawn += 1
        return out
