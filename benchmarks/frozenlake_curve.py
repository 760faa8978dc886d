"""The FrozenLake learning curve: `cadence train --config examples/frozenlake.yaml`, measured.

Runs the example's command as a user would (plus any overrides given here),
then reads the run's own metrics.jsonl into docs/results/frozenlake.json and
docs/results/frozenlake.png: held-out success at every evaluation against
training seconds (the steps' `time/step` summed: rollout waits and updates,
evaluations excluded), with the machine's load average before and after,
since the machine may be shared.

    python benchmarks/frozenlake_curve.py [override ...]   # e.g. seed=1
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
from harness import cpu_model, plot_curve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "examples/frozenlake.yaml"
RESULTS = ROOT / "docs" / "results"


def results_path(overrides: list[str]) -> Path:
    """docs/results/frozenlake.json for the example as it is; a run with overrides (another
    seed, say) keeps its own file beside it: frozenlake_seed=1.json."""
    return RESULTS / ("frozenlake" + "".join(f"_{o}" for o in overrides).replace("/", "-") + ".json")


def curve(records: list[dict]) -> list[dict]:
    """Held-out success at step 0 (before) and at every evaluation, with training seconds so far."""
    points, seconds = [], 0.0
    for r in records:
        seconds += r.get("time/step", 0.0)
        if "eval/pass@1" in r:
            points.append({"step": r["step"], "train_seconds": round(seconds, 1),
                           "held_out_success": r["eval/pass@1"]})
    return points


def hole_probe(model_path: str = "builtin:frozenlake", maps: int = 200) -> dict:
    """Does the model read the holes? Walk the expert through held-out maps and, at every state
    where the hole-blind habit's move differs from the expert's, take the model's next-move
    probabilities in the context a rollout would give it (earlier turns included). Split by
    whether the habit's move steps straight into a hole (visible on the neighbour line) or
    only leads towards one (not visible there)."""
    import torch

    from cadence.envs.expert import hole_blind_action
    from cadence.envs.frozenlake import ACTIONS, FrozenLakeEnv
    from cadence.models.loading import load_policy, load_tokenizer
    from cadence.rollout.turns import PlainTurns

    torch.set_num_threads(1)
    model, tokenizer = load_policy(model_path).eval(), load_tokenizer(model_path)
    config = yaml.safe_load((ROOT / CONFIG).read_text())
    env, turns, eos = FrozenLakeEnv(**config["env"]["kwargs"]), PlainTurns(), tokenizer.eos_token_id
    letter = {a: tokenizer.convert_tokens_to_ids(a[0]) for a in ACTIONS}
    kinds: dict[str, list[tuple[float, float]]] = {"into_hole": [], "towards_hole": []}
    for i in range(maps):
        observation, _ = env.reset(10**9 + i)  # the held-out seeds
        ids = turns.first(tokenizer, observation)
        for _ in range(config["env"]["max_turns"]):
            expert, habit = env.expert_action(), hole_blind_action(env)
            if expert != habit:
                with torch.no_grad():
                    p = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
                r, c = divmod(env.state, env.size)
                below = env.desc[r + 1][c] if habit == "Down" else env.desc[r][c + 1]
                kind = "into_hole" if below == "H" else "towards_hole"
                kinds[kind].append((p[letter[expert]].item(), p[letter[habit]].item()))
            observation, _, terminated, _, _ = env.step(expert)
            if terminated:
                break
            ids += [letter[expert], eos] + turns.after(tokenizer, [eos], observation)
    out: dict = {"model": model_path, "held_out_maps": maps}
    for kind, pairs in kinds.items():
        n = max(len(pairs), 1)
        out[kind] = {"states": len(pairs), "mean_p_expert": round(sum(e for e, _ in pairs) / n, 3),
                     "mean_p_habit": round(sum(h for _, h in pairs) / n, 3),
                     "share_expert_preferred": round(sum(e > h for e, h in pairs) / n, 3)}
    return out


def reference_policies(maps: int = 200) -> dict[str, float]:
    """Held-out success of scripted players, for scale: the habit (walk as if there were no holes),
    the habit unless its move steps straight into a hole (all the neighbour line can tell), the expert."""
    from cadence.envs.expert import hole_blind_action
    from cadence.envs.frozenlake import FrozenLakeEnv

    config = yaml.safe_load((ROOT / CONFIG).read_text())
    env = FrozenLakeEnv(**config["env"]["kwargs"])

    def line_reader(e: FrozenLakeEnv) -> str:
        habit = hole_blind_action(e)
        return e.expert_action() if f"{habit[0]}:H" in e.neighbour_line() else habit

    players = {"habit": hole_blind_action, "habit_unless_into_hole": line_reader,
               "expert": lambda e: e.expert_action()}
    out = {}
    for name, player in players.items():
        wins = 0.0
        for i in range(maps):
            env.reset(10**9 + i)
            for _ in range(config["env"]["max_turns"]):
                _, reward, terminated, _, _ = env.step(player(env))
                if terminated:
                    wins += reward
                    break
        out[name] = wins / maps
    return out


def plot(points: list[dict], path: Path) -> None:
    plot_curve(points, path, "FrozenLake 4x4, builtin:frozenlake, examples/frozenlake.yaml", "held-out success (greedy)")


def main(overrides: list[str]) -> None:
    run_dir = ROOT / "runs" / f"frozenlake-curve-{time.strftime('%Y%m%d-%H%M%S')}"
    command = ["cadence", "train", "--config", CONFIG, *overrides]
    config = yaml.safe_load((ROOT / CONFIG).read_text())  # as the run read it
    load_before, began = os.getloadavg(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "cadence", *command[1:], "logging.progress=false",
                    f"logging.run_dir={run_dir}"], cwd=ROOT, check=True)
    wall, load_after = time.perf_counter() - began, os.getloadavg()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    points = curve(records)
    before, after = points[0]["held_out_success"], points[-1]["held_out_success"]
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
        "reference_policies": reference_policies(),
        "probe_before": hole_probe(),
        "probe_after": hole_probe(str(max((run_dir / "checkpoints").glob("step_*"),
                                          key=lambda d: int(d.name.split("_")[1])))),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, shared with other jobs (see loadavg)",
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = results_path(overrides)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(points, out.with_suffix(".png"))
    print(f"held-out success {before:.3f} -> {after:.3f} ({result['change_points']:+.1f} points) in "
          f"{result['train_seconds']:.0f} s of training; wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
