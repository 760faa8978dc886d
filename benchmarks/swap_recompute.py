"""What a weight swap costs the embedded engine with requests in flight.

At `update_weights` the engine recomputes the KV cache of every running row
(one batched prefill of prompt + response so far) so that later tokens'
log-probs are the new policy's. This prints, per number of live requests N
and context length, the milliseconds of one swap split into loading the
weights and the recompute, next to one decode step of the same batch (the
unit the recompute is paid in).

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


def measure(engine: EmbeddedEngine, state: dict, live: int, context: int, repeats: int) -> dict:
    """Fill the engine with `live` requests of about `context` tokens, then time swaps and steps."""
    prompt = 16
    params = SamplingParams(max_new_tokens=10_000, temperature=1.0, ignore_eos=True)
    for i in range(live):
        engine.add_request(GenRequest(f"r{i}", [5 + i % 200] * prompt, params))
    for _ in range(context - prompt):
        engine.step()
    swap, recompute, step = [], [], []
    for v in range(repeats):
        before = engine.stats()["recompute_s"]
        start = time.perf_counter()
        engine.update_weights(state, version=v + 1)
        swap.append(time.perf_counter() - start)
        recompute.append(engine.stats()["recompute_s"] - before)
        start = time.perf_counter()
        engine.step()
        step.append(time.perf_counter() - start)
    for i in range(live):
        engine.abort(f"r{i}")
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    return {"swap": ms(swap), "recompute": ms(recompute), "step": ms(step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--live", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = tiny_model(hidden_size=args.hidden, layers=args.layers, heads=max(1, args.hidden // 32))
    params = sum(p.numel() for p in model.parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    engine = EmbeddedEngine(model, char_tokenizer(), max_batch_size=max(args.live))
    print(f"{params / 1e6:.1f}M parameters, {args.threads} thread(s); median of {args.repeats}")
    print(f"{'live':>5} {'context':>8} {'swap ms':>9} {'recompute ms':>13} {'step ms':>8} {'steps':>6}")
    for live in args.live:
        for context in args.context:
            r = measure(engine, state, live, context, args.repeats)
            print(
                f"{live:>5} {context:>8} {r['swap']:>9.1f} {r['recompute']:>13.1f} "
                f"{r['step']:>8.1f} {r['recompute'] / r['step']:>6.1f}"
            )


if __name__ == "__main__":
    main()
