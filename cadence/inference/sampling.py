"""Token sampling and behaviour log-probs over a batch of logits.

Pure tensor functions, one call per decode step for the whole batch: on a
tiny model the per-step Python overhead is the cost that matters, so nothing
here loops over rows or the vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _effective_temperature(temperature: Tensor) -> Tensor:
    """Greedy rows (temperature 0) score with T = 1, the others with their own T."""
    return torch.where(temperature > 0, temperature, torch.ones_like(temperature))


def sample(
    logits: Tensor, temperature: Tensor, top_p: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """Pick one token per row of `logits` [B, V].

    temperature [B] (0 = greedy) and top_p [B] are per row, so requests with
    different sampling settings share one batch. Returns token ids [B].
    """
    greedy = temperature <= 0
    argmax = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return argmax
    scaled = logits.float() / _effective_temperature(temperature)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    if bool((top_p < 1).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token once the mass before it already reaches top_p; the most
        # likely token always stays.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p[:, None], 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return torch.where(greedy, argmax, sampled)


def token_logprobs(logits: Tensor, temperature: Tensor, tokens: Tensor) -> Tensor:
    """log_softmax(logits / T)[token] per row, T = temperature or 1 for greedy rows.

    This is the behaviour log-prob the trainer's importance ratio divides by,
    so it is the plain tempered distribution, not renormalised over top-p.
    """
    scaled = logits.float() / _effective_temperature(temperature)[:, None]
    picked = scaled.gather(-1, tokens[:, None]).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)
