"""The Sokoban example, measured: `cadence train --config examples/sokoban.yaml` as a user runs it.

Reads the run's own metrics.jsonl into docs/results/sokoban.json: held-out
success (greedy, room seeds training never uses) before, at every evaluation
and after, against training seconds (the steps' `time/step` summed), the
sampled episodes' reward per step, how many held-out rooms the warm-up's
demonstrations already contained, and the machine's load average before and
after (the machine may be shared).

    python benchmarks/sokoban_curve.py [override ...]
    python benchmarks/sokoban_curve.py --table     # only rewrite the docs table from the json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py beside this script
from frozenlake_curve import curve  # noqa: E402
from harness import run_example  # noqa: E402

from cadence.observe.report import write_doc_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "examples/sokoban.yaml"
WARM_UP = "cadence/configs/sft_sokoban.yaml"
OUT = ROOT / "docs" / "results" / "sokoban.json"
DOC = ROOT / "docs" / "agentic.md"


def rooms_seen_in_warm_up(held_out: int) -> float:
    """Share of the held-out rooms (their first observation) that some warm-up demonstration
    also started from: rooms repeat across seeds, so held-out seeds are not all new rooms."""
    from cadence.envs.sokoban import SokobanEnv

    warm = yaml.safe_load((ROOT / WARM_UP).read_text())
    env = SokobanEnv(**warm["env"]["kwargs"])
    first_seed = warm["env"].get("first_seed", 10**8)
    seen = {env.reset(first_seed + i)[0] for i in range(warm["examples"])}
    return sum(env.reset(10**9 + i)[0] in seen for i in range(held_out)) / held_out


def solved_by_novelty(model_path: str, rooms: int) -> dict:
    """Greedy held-out success split by whether the room was among the warm-up's first rooms:
    does the model play Sokoban or recall demonstrations? Played as a rollout plays them."""
    import torch

    from cadence.envs.sokoban import SokobanEnv
    from cadence.models.loading import load_policy, load_tokenizer
    from cadence.rollout.turns import PlainTurns

    torch.set_num_threads(1)
    warm, example = (yaml.safe_load((ROOT / path).read_text()) for path in (WARM_UP, CONFIG))
    env = SokobanEnv(**example["env"]["kwargs"])
    seen = {env.reset(warm["env"].get("first_seed", 10**8) + i)[0] for i in range(warm["examples"])}
    model, tokenizer = load_policy(model_path).eval(), load_tokenizer(model_path)
    turns, eos = PlainTurns(), tokenizer.eos_token_id
    counts = {"seen": [0, 0], "new": [0, 0]}  # [rooms, solved]
    for i in range(rooms):
        observation, _ = env.reset(10**9 + i)
        kind = "seen" if observation in seen else "new"
        ids, solved = turns.first(tokenizer, observation), False
        for _ in range(example["env"]["max_turns"]):
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=2, do_sample=False, pad_token_id=eos)
            reply = out[0, len(ids):].tolist()
            observation, reward, terminated, truncated, _ = env.step(tokenizer.decode(reply, skip_special_tokens=True))
            if terminated or truncated:
                solved = reward > 0
                break
            ids += reply + turns.after(tokenizer, reply, observation)
        counts[kind][0] += 1
        counts[kind][1] += solved
    return {kind: {"rooms": n, "solved": k, "success": round(k / max(n, 1), 3)} for kind, (n, k) in counts.items()}


def table(result: dict) -> str:
    """The docs table: held-out success at each evaluation, for this run and the earlier runs kept
    (`earlier_run_*` entries, each with a `label`)."""
    runs = [(f"the example (lr {result['config']['trainer']['lr']:g})", result)]
    runs += [(run["label"], run) for key, run in result.items() if key.startswith("earlier_run_")]
    steps = [p["step"] for p in result["curve"]]
    head = " | ".join(["before" if s == 0 else f"step {s}" for s in steps])
    rows = [f"| run | held-out success: {head} | training seconds | load average before / after |",
            "|" + "---|" * (len(steps) + 3)]
    for lr, run in runs:
        success = " | ".join(f"{p['held_out_success']:.2f}" for p in run["curve"])
        load = (f"{run['loadavg_before'][0]:.1f} / {run['loadavg_after'][0]:.1f}" if run.get("loadavg_before")
                else "not recorded")
        rows.append(f"| {lr} | {success} | {run['train_seconds']:.0f} | {load} |")
    return "\n".join(rows)


def main(overrides: list[str]) -> None:
    run = run_example(CONFIG, overrides, "sokoban-curve")
    records = run.records
    points = curve(records)
    before, after = points[0]["held_out_success"], points[-1]["held_out_success"]
    config = yaml.safe_load((ROOT / CONFIG).read_text())
    held_out = config["eval"]["episodes"]
    rewards = [[r["step"], round(r["reward/mean"], 4)] for r in records if r["step"] > 0]
    result = {
        "command": run.command,
        "config": config,
        "held_out_episodes": held_out,
        "held_out_rooms_seen_in_warm_up": round(rooms_seen_in_warm_up(held_out), 3),
        "before": before,
        "after": after,
        "change_points": round(100 * (after - before), 1),
        "train_seconds": points[-1]["train_seconds"],
        "command_wall_seconds": round(run.wall_s, 1),
        "curve": points,
        "reward_mean_per_step": rewards,
        "turns_per_episode_per_step": [[r["step"], round(r["rollout/turns_per_episode"], 2)]
                                       for r in records if r["step"] > 0],
        "prefill_tokens_saved_fraction": round(records[-1].get("rollout/prefill_tokens_saved_fraction", 0.0), 3),
        "by_novelty_before": solved_by_novelty(config["model"]["path"], held_out),
        "by_novelty_after": solved_by_novelty(str(max((run.run_dir / "checkpoints").glob("step_*"),
                                                      key=lambda d: int(d.name.split("_")[1]))), held_out),
        **run.where_and_when(),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    write_doc_table(DOC, "sokoban", table(result))
    print(f"held-out success {before:.3f} -> {after:.3f} ({result['change_points']:+.1f} points) in "
          f"{result['train_seconds']:.0f} s of training; wrote {OUT}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        write_doc_table(DOC, "sokoban", table(json.loads(OUT.read_text())))
    else:
        main(sys.argv[1:])
