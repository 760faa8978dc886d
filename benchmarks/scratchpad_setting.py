"""The scratchpad setting of benchmarks/rhythm_credit.py: longer answers where attention structure matters.

The built-in model is fine-tuned (cached under the benchmark's workdir) to write
its column sums before the answer, ``47+38=`` -> ``7+8=15, 4+3+1=8, so 85``
(~23 tokens), with a carry-slip habit on 60% of carrying problems that RL with
the exact-match reward on the last number removes.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

# The scratchpad warm-up: starts from the built-in model, which already reads
# "NN+NN=" prompts, so a few hundred steps teach it the longer answer format.
SFT_STEPS = 600
SFT_LR = 3e-3
SFT_BATCH = 64
SFT_EXAMPLES = 20000
SFT_SLIP = 0.6
SCRATCHPAD_TEST = 200
SCRATCHPAD_OVERRIDES = [
    "task.name=jsonl",
    "reward.extract=last_number",
    'rollout.stop=["\\n"]',  # YAML double quotes: a real newline
    "rollout.max_new_tokens=32",
    "rollout.prompts_per_step=8",  # 64 samples a step: longer responses cost more
]


# ----------------------------------------------------------------------------
# The scratchpad task


def scratchpad(a: int, b: int, slip: bool = False) -> str:
    """Column-by-column working for a + b (a, b < 100), ending with the answer and a newline.

    With ``slip`` a carrying problem forgets the carry in the tens column, so the
    written answer is wrong by ten, but self-consistent with the working.
    """
    a1, a0, b1, b0 = a // 10, a % 10, b // 10, b % 10
    ones = a0 + b0
    carry = 0 if slip else ones // 10
    tens = a1 + b1 + carry
    return f"{a0}+{b0}={ones}, {a1}+{b1}+{carry}={tens}, so {tens * 10 + ones % 10}\n"


def scratchpad_split(seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, test) pairs over all 10,000 problems; the test problems never appear in train."""
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(pairs)
    return pairs[SCRATCHPAD_TEST:], pairs[:SCRATCHPAD_TEST]


def write_jsonl(path: Path, pairs: list[tuple[int, int]]) -> None:
    """Prompts as the built-in task writes them ("07+45="), gold answer the sum."""
    with path.open("w", encoding="utf-8") as handle:
        for a, b in pairs:
            handle.write(json.dumps({"prompt": f"{a:02d}+{b:02d}=", "answer": str(a + b)}) + "\n")


def scratchpad_sft(out: Path, steps: int, seed: int = 0) -> float:
    """Teach the built-in model the scratchpad format (with the carry slip); returns seconds.

    Runs `cadence.recipes.sft.fit`, the loop of `cadence sft`, on examples
    made here: the scratchpad format is not one of cadence's built-in tasks.
    """
    from cadence.models.loading import load_policy, load_tokenizer
    from cadence.recipes.sft import encode_examples, fit

    torch.manual_seed(seed)
    rng = random.Random(seed)
    train_pairs, _ = scratchpad_split()
    pairs = []
    for _ in range(SFT_EXAMPLES):
        a, b = rng.choice(train_pairs)
        slip = (a % 10 + b % 10 >= 10) and rng.random() < SFT_SLIP
        pairs.append((f"{a:02d}+{b:02d}=", scratchpad(a, b, slip)))
    tokenizer, model = load_tokenizer("builtin"), load_policy("builtin")
    data = encode_examples(tokenizer, pairs)
    start = time.perf_counter()
    fit(model, data, tokenizer.pad_token_id, rng, steps=steps, lr=SFT_LR, batch_size=SFT_BATCH)
    seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "scratchpad_sft.json").write_text(
        json.dumps(
            {"steps": steps, "seed": seed, "lr": SFT_LR, "slip": SFT_SLIP, "seconds": seconds}
        )
    )
    return seconds


def prepare_scratchpad(workdir: Path, sft_steps: int) -> tuple[list[str], dict[str, Any]]:
    """Data files and the warmed-up model (reused when already made); run overrides and facts."""
    data = workdir / "scratchpad-data"
    data.mkdir(parents=True, exist_ok=True)
    train_pairs, test_pairs = scratchpad_split()
    write_jsonl(data / "train.jsonl", train_pairs)
    write_jsonl(data / "test.jsonl", test_pairs)
    model = workdir / f"sft-scratchpad-{sft_steps}"
    marker = model / "scratchpad_sft.json"
    if marker.is_file():
        sft_seconds, cached = float(json.loads(marker.read_text())["seconds"]), True
        print(f"scratchpad: reusing {model} (SFT took {sft_seconds:.0f} s when made)")
    else:
        print(f"scratchpad: SFT of the built-in model for {sft_steps} steps -> {model}")
        sft_seconds, cached = scratchpad_sft(model, sft_steps), False
    # Relative to the working directory, so the JSON and the plot titles read
    # "runs/bench-rhythm/..." when run from the repository root as documented.
    model_path, train_file, test_file = (
        os.path.relpath(p) for p in (model, data / "train.jsonl", data / "test.jsonl")
    )
    overrides = [
        f"model.path={model_path}",
        f"task.train_file={train_file}",
        f"task.test_file={test_file}",
        *SCRATCHPAD_OVERRIDES,
    ]
    facts = {
        "model": model_path,
        "sft_steps": sft_steps,
        "sft_seconds": sft_seconds,
        "sft_cached": cached,
    }
    return overrides, facts
