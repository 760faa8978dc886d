"""Trainer memory and step time: full fine-tuning vs LoRA, each with and without activation checkpointing.

    python benchmarks/memory.py        # ~3 min on 2 CPU cores; writes docs/results/memory.json

The model is Qwen2-shaped, about 100M parameters, built from a config with
random weights (hidden 768, 12 layers, 12 heads, 2 KV heads, MLP 2048, vocab
32000, tied embeddings). Each variant runs `PolicyTrainer.step` (the real
trainer: GRPO, AdamW) in its own fresh process on the same batch: 4 prompts x 2
responses of --seq-len tokens in all, one micro-batch.

What is measured, per variant:
  optimizer_mib    bytes of AdamW's state tensors after a step (exact: summed tensor sizes)
  activation_mib   memory the forward pass of the training loss holds for the backward:
                   memory after the forward minus before it (with the logits)
  forward_peak_mib peak memory during that forward minus before it
  step_peak_mib    peak memory during a training step minus the memory held just before it
                   (held between steps: weights, optimizer state and, full fine-tuning, the
                   last step's gradients, which the step frees and makes again)
  peak_mib         peak memory during a training step, all of it: the trainer's peak (on CPU
                   the process's, Python and libraries included)
  step_seconds     median wall time of the measured steps (the first step is warm-up)
  loss             the loss of that forward: checkpointing must not change it
Memory on CUDA is `torch.cuda.memory_allocated` / `max_memory_allocated`. On CPU,
torch keeps no allocator statistics, so it is the process's resident memory
(RSS, /proc/self/statm; peaks from VmHWM after resetting it through
/proc/self/clear_refs) with glibc's mmap threshold fixed at 128 KiB, so every
tensor of that size or more is its own mapping and returns to the system when
freed: RSS then follows live tensor memory (to within the allocator's small
blocks). One torch thread on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "memory.json"
VARIANTS = {
    "full": dict(lora=False, checkpointing=False),
    "full + checkpointing": dict(lora=False, checkpointing=True),
    "lora": dict(lora=True, checkpointing=False),
    "lora + checkpointing": dict(lora=True, checkpointing=True),
}
MIB = 2**20


class Meter:
    """Current and peak memory of this process on `device` (see the module docstring)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def now(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def reset_peak(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS

    def peak(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        with open("/proc/self/status") as f:
            line = next(ln for ln in f if ln.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024


def build_model(args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, intermediate_size=args.mlp,
        max_position_embeddings=max(512, args.seq_len), tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).train()


def batch(args: argparse.Namespace):
    """4 prompts x 2 responses, --seq-len tokens each (a quarter prompt), one rewarded per group."""
    import torch

    from cadence.rollout.sample import Group, Sample

    gen = torch.Generator().manual_seed(1)
    prompt_len = args.seq_len // 4
    groups = []
    for gid in range(args.batch // 2):
        group = Group(group_id=gid, prompt_id=str(gid))
        prompt = torch.randint(5, args.vocab, (prompt_len,), generator=gen).tolist()
        for j in range(2):
            response = torch.randint(5, args.vocab, (args.seq_len - prompt_len,), generator=gen).tolist()
            group.samples.append(Sample(str(gid), gid, prompt, response, [-1.0] * len(response), float(j), 0, "stop"))
        groups.append(group)
    return groups


def run_variant(args: argparse.Namespace, lora: bool, checkpointing: bool) -> dict:
    """One variant in this process: the forward measurement, then --steps training steps."""
    import torch

    from cadence.algo.config import AlgorithmConfig
    from cadence.models.config import LoraConfig
    from cadence.models.lora import with_lora
    from cadence.train.batch import collate, flatten
    from cadence.train.config import TrainerConfig
    from cadence.train.logprobs import forward_logits, token_logprobs
    from cadence.train.trainer import PolicyTrainer

    torch.set_num_threads(args.threads)
    meter = Meter(args.device)
    model = build_model(args)
    if lora:
        model = with_lora(model, LoraConfig(r=args.lora_r))
    cfg = TrainerConfig(lr=1e-5, micro_batch_size=args.batch, micro_batch_tokens=None,
                        gradient_checkpointing=checkpointing, device=args.device)
    trainer = PolicyTrainer(model, cfg, AlgorithmConfig(), temperature=1.0, pad_id=0)
    groups = batch(args)

    # The forward of the training loss on the starting weights (equal in every variant).
    data = collate(flatten(groups), 0, trainer.device)
    before = meter.now()
    meter.reset_peak()
    logits = forward_logits(trainer.policy, data.input_ids, data.attention_mask)
    loss = -(token_logprobs(logits, data.input_ids, 1.0) * data.mask).sum() / data.mask.sum()
    held, forward_peak = meter.now() - before, meter.peak() - before
    loss.backward()
    loss_value = loss.item()
    del logits, loss
    trainer.optimizer.zero_grad(set_to_none=True)

    seconds, step_peaks, peaks = [], [], []
    for _ in range(args.steps):
        before = meter.now()
        meter.reset_peak()
        start = time.perf_counter()
        metrics = trainer.step(groups)
        seconds.append(time.perf_counter() - start)
        peaks.append(meter.peak())
        step_peaks.append(peaks[-1] - before)
    optimizer_bytes = sum(
        t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values()
        if torch.is_tensor(t)
    )
    return {
        "parameters": sum(p.numel() for p in trainer.policy.parameters()),
        "trainable_parameters": sum(p.numel() for p in trainer.policy.parameters() if p.requires_grad),
        "optimizer_mib": optimizer_bytes / MIB,
        "activation_mib": held / MIB,
        "forward_peak_mib": forward_peak / MIB,
        "step_peak_mib": max(step_peaks[1:] or step_peaks) / MIB,
        "peak_mib": max(peaks[1:] or peaks) / MIB,
        "step_seconds": statistics.median(seconds[1:] or seconds),
        "loss": loss_value,
        "last_step_loss": float(metrics["train/loss"]),
    }


def in_fresh_process(args: argparse.Namespace, name: str) -> dict:
    """Run one variant in a child process, so no variant sees another's freed memory."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "OMP_NUM_THREADS": str(args.threads)}
    argv = [sys.executable, __file__, "--variant", name, *sys.argv[1:]]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def less(new: float, old: float) -> str:
    """How much smaller `new` is than `old`, in percent ('n/a' when nothing was measured: a tiny
    model's tensors can all fit in memory the process already holds)."""
    return f"{100 * (1 - new / old):.1f}%" if old > 0 else "n/a"


def report(results: dict[str, dict]) -> list[str]:
    """The table and the two targets, as lines."""
    lines = [
        "| variant | trainable params | optimizer MiB | activation MiB | forward peak MiB | step peak MiB "
        "| peak MiB | step s | loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['trainable_parameters']:,} | {r['optimizer_mib']:.1f} | {r['activation_mib']:.1f} "
            f"| {r['forward_peak_mib']:.1f} | {r['step_peak_mib']:.1f} | {r.get('peak_mib', float('nan')):.1f} "
            f"| {r['step_seconds']:.2f} | {r['loss']:.6f} |"
        )
    full, lora = results["full"], results["lora"]
    lines.append(f"LoRA optimizer state: {less(lora['optimizer_mib'], full['optimizer_mib'])} less "
                 "than full fine-tuning's (target > 90%)")
    for kind in ("full", "lora"):
        plain, ckpt = results[kind], results[f"{kind} + checkpointing"]
        cut = less(ckpt["activation_mib"], plain["activation_mib"])
        lines.append(f"{kind}: checkpointing holds {cut} less activation memory (target > 50%), "
                     f"loss {plain['loss']:.6f} vs {ckpt['loss']:.6f}, step time x{ckpt['step_seconds'] / plain['step_seconds']:.2f}")
    return lines


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--seq-len", type=int, default=128, help="Tokens per sequence (prompt + response).")
    ap.add_argument("--batch", type=int, default=8, help="Sequences per step (an even number).")
    ap.add_argument("--steps", type=int, default=3, help="Training steps per variant (the first is warm-up).")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--mlp", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a child's one variant
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.variant:
        print(json.dumps(run_variant(args, **VARIANTS[args.variant])))
        return
    results = {name: in_fresh_process(args, name) for name in VARIANTS}
    lines = report(results)
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python benchmarks/memory.py " + " ".join(a for a in sys.argv[1:]),
        "device": args.device, "machine": platform.processor() or platform.machine(),
        "load_average": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "variant")},
        "results": results,
    }, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
