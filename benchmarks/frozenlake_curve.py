"""The FrozenLake learning curve: `cadence train --config examples/frozenlake.yaml`, measured.

Runs the example's command as a user would (plus any overrides given here),
then reads the run's own metrics.jsonl into docs/results/frozenlake.json and
docs/results/frozenlake.png: held-out success at every evaluation against
training seconds (the steps' `time/step` summed: rollout waits and updates,
evaluations excluded), with the machine's load average before and after,
since the machine may be shared.

    python benchmarks/frozenlake_curve.py [override ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py beside this script
from harness import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "examples/frozenlake.yaml"
OUT = ROOT / "docs" / "results" / "frozenlake.json"


def curve(records: list[dict]) -> list[dict]:
    """Held-out success at step 0 (before) and at every evaluation, with training seconds so far."""
    points, seconds = [], 0.0
    for r in records:
        seconds += r.get("time/step", 0.0)
        if "eval/pass@1" in r:
            points.append({"step": r["step"], "train_seconds": round(seconds, 1),
                           "held_out_success": r["eval/pass@1"]})
    return points


def first_move_probe(model_path: str = "builtin:frozenlake", maps: int = 200) -> dict:
    """Does the model read the holes? On held-out maps where the expert's first move differs
    from the hole-blind habit's, the probability it gives the expert's move (the warm-up's
    demonstrations chose it 40% of the time there)."""
    import torch

    from cadence.envs.expert import hole_blind_action
    from cadence.envs.frozenlake import FrozenLakeEnv
    from cadence.models.loading import load_policy, load_tokenizer

    torch.set_num_threads(1)
    model, tokenizer = load_policy(model_path).eval(), load_tokenizer(model_path)
    env, probs = FrozenLakeEnv(rules=False), []
    for i in range(maps):
        observation, _ = env.reset(10**9 + i)  # the held-out seeds
        expert = env.expert_action()
        if expert == hole_blind_action(env):
            continue
        with torch.no_grad():
            logits = model(tokenizer(observation + "\n", return_tensors="pt").input_ids).logits[0, -1]
        probs.append(logits.softmax(-1)[tokenizer.convert_tokens_to_ids(expert[0])].item())
    return {"maps": maps, "maps_where_habit_differs": len(probs),
            "mean_p_expert_first_move": round(sum(probs) / len(probs), 3),
            "min": round(min(probs), 3), "max": round(max(probs), 3)}


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([p["train_seconds"] / 60 for p in points], [p["held_out_success"] for p in points], "o-",
            label="held-out success (greedy)")
    ax.set_xlabel("training minutes")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("FrozenLake 4x4, builtin:frozenlake, examples/frozenlake.yaml")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(overrides: list[str]) -> None:
    run_dir = ROOT / "runs" / f"frozenlake-curve-{time.strftime('%Y%m%d-%H%M%S')}"
    command = ["cadence", "train", "--config", CONFIG, *overrides]
    load_before, began = os.getloadavg(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "cadence", *command[1:], "logging.progress=false",
                    f"logging.run_dir={run_dir}"], cwd=ROOT, check=True)
    wall, load_after = time.perf_counter() - began, os.getloadavg()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    points = curve(records)
    before, after = points[0]["held_out_success"], points[-1]["held_out_success"]
    config = yaml.safe_load((ROOT / CONFIG).read_text())
    result = {
        "command": " ".join(command),
        "config": config,
        "held_out_episodes": config["eval"]["episodes"],
        "before": before,
        "after": after,
        "change_points": round(100 * (after - before), 1),
        "train_seconds": points[-1]["train_seconds"],
        "command_wall_seconds": round(wall, 1),
        "curve": points,
        "reward_mean_per_step": [[r["step"], round(r["reward/mean"], 4)] for r in records if r["step"] > 0],
        "warm_up_probe": first_move_probe(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, shared with other jobs (see loadavg)",
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    plot(points, OUT.with_suffix(".png"))
    print(f"held-out success {before:.3f} -> {after:.3f} ({result['change_points']:+.1f} points) in "
          f"{result['train_seconds']:.0f} s of training; wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
