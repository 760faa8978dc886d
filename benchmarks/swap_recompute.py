"""What a weight swap costs the embedded engine with requests in flight.

At `update_weights` the engine recomputes the KV cache of every running row
(batched prefills of prompt + response so far) so that later tokens'
log-probs are the new policy's. This prints, per number of live requests N
and context length, the milliseconds of one swap's recompute next to one
decode step of the same batch (the unit the recompute is paid in), for two
ways of batching it side by side on the same rows:

  one forward        every row padded to the longest (how cadence did it
                     before session 18)
  grouped            rows of similar length share a forward (`recompute_groups`,
                     the engine's default)

With `--spread` (the default) requests join one after another, so their
contexts run from the prompt's length up to the context length, as in an
async run at a swap; `--no-spread` gives every row the same length.

    python benchmarks/swap_recompute.py            # the default tiny model
    python benchmarks/swap_recompute.py --hidden 512 --layers 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.tiny import char_tokenizer, tiny_model

PROMPT = 16
# recompute_forward_tokens of each variant: a forward so dear that every row shares one, and the default
VARIANTS = {"one forward": 1 << 40, "grouped": None}  # None: the engine's default


def fill(engine: EmbeddedEngine, live: int, context: int, spread: bool) -> None:
    """`live` requests of up to `context` tokens; spread: they join evenly over the steps."""
    params = SamplingParams(max_new_tokens=10_000, temperature=1.0, ignore_eos=True)
    steps = context - PROMPT
    joins = [i * steps // live if spread else 0 for i in range(live)]
    for step in range(steps):
        for i in [i for i, j in enumerate(joins) if j == step]:
            engine.add_request(GenRequest(f"r{i}", [5 + i % 200] * PROMPT, params))
        engine.step()


def measure(engine: EmbeddedEngine, state: dict, live: int, context: int, spread: bool, repeats: int) -> dict:
    """Fill the engine, then time each variant's swaps (alternating) and a decode step after each."""
    fill(engine, live, context, spread)
    recompute: dict[str, list[float]] = {name: [] for name in VARIANTS}
    step: list[float] = []
    version, default = engine.version, engine.recompute_forward_tokens
    for _ in range(repeats):
        for name, forward_tokens in VARIANTS.items():
            engine.recompute_forward_tokens = default if forward_tokens is None else forward_tokens
            before = engine.stats()["recompute_s"]
            version += 1
            engine.update_weights(state, version=version)
            recompute[name].append(engine.stats()["recompute_s"] - before)
            start = time.perf_counter()
            engine.step()
            step.append(time.perf_counter() - start)
    engine.recompute_forward_tokens = default
    for i in range(live):
        engine.abort(f"r{i}")
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    return {**{name: ms(xs) for name, xs in recompute.items()}, "step": ms(step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--live", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--spread", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = tiny_model(hidden_size=args.hidden, layers=args.layers, heads=max(1, args.hidden // 32))
    params = sum(p.numel() for p in model.parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    engine = EmbeddedEngine(model, char_tokenizer(), max_batch_size=max(args.live))
    rows = "contexts spread from the prompt to the context length" if args.spread else "every row the same length"
    print(f"{params / 1e6:.1f}M parameters, {args.threads} thread(s), {rows}; median of {args.repeats}")
    print(f"{'live':>5} {'context':>8} {'one forward ms':>15} {'grouped ms':>11} {'ratio':>6} {'step ms':>8}")
    for live in args.live:
        for context in args.context:
            r = measure(engine, state, live, context, args.spread, args.repeats)
            print(
                f"{live:>5} {context:>8} {r['one forward']:>15.1f} {r['grouped']:>11.1f} "
                f"{r['grouped'] / r['one forward']:>6.2f} {r['step']:>8.1f}"
            )


if __name__ == "__main__":
    main()
