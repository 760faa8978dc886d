"""What keeping an episode's KV cache between turns saves the embedded engine.

    python benchmarks/multiturn_kv.py            # writes docs/results/multiturn_kv.json + docs/agentic.md
    python benchmarks/multiturn_kv.py --quick    # a small smoke run into --workdir, docs untouched

Episodes run as they do in training: one coroutine each on an InferenceHub,
each turn `await hub.generate(context, affinity=episode)`, then the context
grows by the turn's output and an observation. With reuse (the default,
`engine.keep_kv_between_turns`) a turn prefills only what its context added
since the last turn finished; without, it prefills its whole context. Both
variants run the same episodes in one process, in back-to-back pairs (A B,
B A, ...) so a shared machine's load hits both alike, on fresh engines over
the same weights; greedy decoding, so their outputs must match token for
token (the run checks it). Reported per model and number of concurrent episodes:
prompt tokens run through prefill forwards per episode, mean seconds per
turn (submit to result), episode wall time, and the ratios.

Models: the built-in model (`model.path=builtin`, 1.1M parameters, a
character tokenizer) and a larger random-weight Qwen2 (transformers'
Qwen2ForCausalLM from `cadence.models.tiny`; no model hub is reachable here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import InferenceHub
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from cadence.models.tiny import char_tokenizer, tiny_model
from cadence.observe.report import write_doc_table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # as a script or loaded from its path
from harness import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "agentic.md"
RESULTS = ROOT / "docs" / "results" / "multiturn_kv.json"
TABLE = "multiturn-kv"
VARIANTS = {"reuse": True, "no reuse": False}


def load_model(name: str, quick: bool) -> tuple[Any, Any]:
    """(model, tokenizer): the built-in model, or a random-weight Qwen2 of the size asked."""
    if name == "builtin":
        return load_policy("builtin").eval(), load_tokenizer("builtin")
    hidden, layers = (64, 2) if quick else (384, 6)
    model = tiny_model("qwen2", hidden_size=hidden, layers=layers, heads=hidden // 32, max_positions=2048)
    return model, char_tokenizer()


async def episode(
    hub: InferenceHub, eid: int, args: argparse.Namespace, params: SamplingParams
) -> dict[str, Any]:
    """One episode of `args.turns` turns; observations are seeded random printable bytes."""
    rng = random.Random(eid)
    observe = lambda n: [rng.randrange(36, 120) for _ in range(n)]  # noqa: E731
    context, outputs, turn_s = observe(args.first), [], []
    for turn in range(args.turns):
        began = time.perf_counter()
        out = await hub.generate(GenRequest(f"ep{eid}/{turn}", context, params), affinity=f"ep{eid}")
        turn_s.append(time.perf_counter() - began)
        outputs.append(out.token_ids)
        context = context + out.token_ids + observe(args.observation)
    hub.forget(f"ep{eid}")
    return {"turn_s": turn_s, "outputs": outputs}


def run(model: Any, tok: Any, keep_kv: bool, episodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """`episodes` concurrent episodes on a fresh engine; counters, clocks and outputs."""
    engine = EmbeddedEngine(model, tok, max_batch_size=max(episodes, 1), keep_kv=keep_kv)
    hub = InferenceHub([engine])
    params = SamplingParams(max_new_tokens=args.reply, temperature=0.0, ignore_eos=True)

    async def all_episodes() -> list[dict[str, Any]]:
        return await hub.serving(asyncio.gather(*(episode(hub, e, args, params) for e in range(episodes))))

    began = time.perf_counter()
    played = asyncio.run(all_episodes())
    wall = time.perf_counter() - began
    stats = engine.stats()
    turn_s = [t for p in played for t in p["turn_s"]]
    return {
        "wall_s": wall,
        "turn_s_mean": statistics.fmean(turn_s),
        "turn_s_by_index": [statistics.fmean(p["turn_s"][i] for p in played) for i in range(args.turns)],
        "prefill_tokens_per_episode": stats["prefill_tokens"] / episodes,
        "prompt_tokens_per_episode": stats["prompt_tokens"] / episodes,
        "reused_tokens_per_episode": stats["reused_tokens"] / episodes,
        "reuse_hits": stats["reuse_hits"],
        "busy_s": stats["busy_s"],
        "outputs": [p["outputs"] for p in played],
    }


def compare(model_name: str, episodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both variants side by side, `args.repeats` pairs (A B, then B A, ...) after a warm-up.

    Time ratios are the median over pairs of no-reuse / reuse within a pair:
    the two runs of a pair are seconds apart, so a change in the machine's
    load between pairs cancels out.
    """
    model, tok = load_model(model_name, args.quick)
    params = sum(p.numel() for p in model.parameters())
    run(model, tok, True, episodes, args)  # warm-up: first-call costs land on neither variant
    pairs: list[dict[str, dict[str, Any]]] = []
    for i in range(args.repeats):
        order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
        pairs.append({v: run(model, tok, VARIANTS[v], episodes, args) for v in order})
    outputs = [r.pop("outputs") for pair in pairs for r in pair.values()]
    runs = {v: [pair[v] for pair in pairs] for v in VARIANTS}
    row: dict[str, Any] = {
        "model": model_name,
        "parameters": params,
        "episodes": episodes,
        "outputs_equal": all(o == outputs[0] for o in outputs),
        "prompt_tokens_per_episode": runs["reuse"][0]["prompt_tokens_per_episode"],
        "runs": runs,
    }
    for key in ("prefill_tokens_per_episode", "turn_s_mean", "wall_s"):
        row[key] = {v: statistics.median(r[key] for r in runs[v]) for v in VARIANTS}
        row[f"{key}_ratio"] = statistics.median(p["no reuse"][key] / p["reuse"][key] for p in pairs)
    return row


def table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    s = meta["settings"]
    lines = [
        f"{s['turns']} turns per episode: a {s['first']}-token first observation, "
        f"{s['reply']}-token replies, {s['observation']}-token observations "
        f"(final context {s['first'] + s['turns'] * (s['reply'] + s['observation'])} tokens); "
        f"greedy, {meta['threads']} torch thread, {meta['machine']} (load average "
        f"{meta['loadavg_before'][0]:.1f} before, {meta['loadavg_after'][0]:.1f} after), "
        f"{s['repeats']} pairs of runs, alternated; seconds are medians, ratios the median "
        "of the pairs' ratios. From `docs/results/multiturn_kv.json`.",
        "",
        "| model | concurrent episodes | prefill tokens / episode (reuse / none) | fewer | "
        "s per turn (reuse / none) | faster | outputs equal |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "built-in" if r["model"] == "builtin" else f"random Qwen2, {r['parameters'] / 1e6:.1f}M"
        p, t = r["prefill_tokens_per_episode"], r["turn_s_mean"]
        lines.append(
            f"| {name} | {r['episodes']} | {p['reuse']:.0f} / {p['no reuse']:.0f} | "
            f"{r['prefill_tokens_per_episode_ratio']:.1f}x | {t['reuse']:.3f} / {t['no reuse']:.3f} | "
            f"{r['turn_s_mean_ratio']:.2f}x | {'yes' if r['outputs_equal'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run; docs/ untouched")
    parser.add_argument("--workdir", type=Path, default=None, help="where --quick writes its json")
    parser.add_argument("--models", nargs="+", default=["builtin", "qwen2"])
    parser.add_argument("--episodes", type=int, nargs="+", default=None)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    quick = dict(episodes=[2], turns=3, first=12, reply=4, observation=6, repeats=1)
    full = dict(episodes=[1, 4], turns=8, first=64, reply=16, observation=32, repeats=5)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    torch.set_num_threads(args.threads)

    load_before, began = os.getloadavg(), time.perf_counter()
    with torch.inference_mode():
        rows = [compare(m, e, args) for m in args.models for e in args.episodes]
    meta = {
        "command": " ".join(["python benchmarks/multiturn_kv.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: getattr(args, k) for k in ("turns", "first", "reply", "observation", "repeats")},
        "threads": args.threads,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores shared with other jobs",
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - began, 1),
    }
    report = {"meta": meta, "rows": rows}
    out = (args.workdir or Path(".")) / "multiturn_kv.json" if args.quick else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    text = table(rows, meta)
    print(text)
    if not args.quick:
        write_doc_table(DOC, TABLE, text)
    return report


if __name__ == "__main__":
    main()
