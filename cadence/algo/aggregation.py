"""Turn a [B, T] matrix of per-token losses into one scalar.

Notation: l[i, t] per-token loss, m[i, t] in {0, 1} the response mask,
n_i = sum_t m[i, t] the tokens of sequence i, N = sum_i n_i, and S the
number of *valid* sequences (n_i > 0).

| mode                      | scalar                                  |
|---------------------------|-----------------------------------------|
| token-mean                | sum_i sum_t m l / N                     |
| seq-mean-token-mean       | sum_i (sum_t m l / n_i) / S             |
| seq-mean-token-sum        | sum_i (sum_t m l) / S                   |
| seq-mean-token-sum-norm   | sum_i (sum_t m l) / (L * S)             |

`seq-mean-token-sum-norm` is Dr. GRPO's: it divides by a constant L (the
generation budget) instead of each response's own length, so a token weighs
the same in a short and a long answer.

Gradient accumulation. A trainer that splits a batch into micro-batches and
sums their losses must divide every micro-batch by the *whole batch's* N (or
S), not the micro-batch's own: pass them as `token_denominator` /
`seq_denominator` (get them from `batch_denominators(full_mask)`). Then
sum(micro losses) == full-batch loss, exactly, in every mode.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
MODES: tuple[str, ...] = get_args(AggregationMode)


def batch_denominators(mask: Tensor) -> tuple[float, float]:
    """Whole-batch denominators (N, S) to hand to every micro-batch's `aggregate`.

    N = sum_{i,t} m[i, t] (response tokens), S = #{i : sum_t m[i, t] > 0}
    (sequences with at least one response token).
    """
    n_tokens = float(mask.sum().item())
    n_seqs = float((mask.sum(dim=-1) > 0).sum().item())
    return n_tokens, n_seqs


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    token_denominator: float | None = None,
    seq_denominator: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Reduce `per_token` [B, T] to a scalar; see the module docstring for each mode.

    token-mean:              sum(m l) / N
    seq-mean-token-mean:     sum_i (sum_t m l / n_i) / S
    seq-mean-token-sum:      sum_i  sum_t m l        / S
    seq-mean-token-sum-norm: sum_i  sum_t m l        / (L S),  L = norm_length

    N and S default to this batch's counts; pass the full batch's counts when
    this call sees only one micro-batch. Denominators are floored at 1 so an
    all-masked batch gives 0, not NaN.
    """
    if mode not in MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {', '.join(MODES)}")
    if per_token.shape != mask.shape:
        raise ValueError(
            f"per_token shape {tuple(per_token.shape)} != mask shape {tuple(mask.shape)}"
        )
    mask = mask.to(per_token.dtype)
    # where(), not multiply: a masked-out position may hold inf/NaN (e.g. padding logprobs)
    # and 0 * inf would poison the sum.
    masked = torch.where(mask > 0, per_token * mask, torch.zeros_like(per_token))
    seq_tokens = mask.sum(dim=-1)

    if mode == "token-mean":
        n = seq_tokens.sum().item() if token_denominator is None else token_denominator
        return masked.sum() / max(float(n), 1.0)

    s = (seq_tokens > 0).sum().item() if seq_denominator is None else seq_denominator
    s = max(float(s), 1.0)
    if mode == "seq-mean-token-mean":
        # A sequence's own length is fully inside one micro-batch, so n_i needs no global value.
        per_seq = masked.sum(dim=-1) / seq_tokens.clamp(min=1.0)
        return per_seq.sum() / s
    if mode == "seq-mean-token-sum":
        return masked.sum() / s
    # seq-mean-token-sum-norm
    if norm_length is None or norm_length <= 0:
        raise ValueError(
            "aggregation 'seq-mean-token-sum-norm' needs a positive norm_length "
            "(set AlgorithmConfig.max_response_length to the generation budget)"
        )
    return masked.sum() / (float(norm_length) * s)
