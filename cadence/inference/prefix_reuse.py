"""Keeping an episode's KV cache between its turns (for `EmbeddedEngine`).

Turn k+1 of an episode asks to complete turn k's context + turn k's output +
the next observation. All of it but the observation was in the engine's cache
when turn k finished, yet without reuse the engine prefills the whole context
again: with the context growing by c tokens a turn, an episode of N turns
prefills about N^2 c / 2 tokens instead of N c. With reuse the engine copies a
finished row's keys and values out of the slot cache (`SlotKVCache.read_row`,
a memory copy, no forward), and the next turn copies them back into its slot
(`place_row`) and prefills only what is new.

- Keyed by `GenRequest.cache_key` (the hub sets it to the `affinity` a caller
  passes: the episode id) and checked by tokens, never trusted blindly: an
  entry holds the token ids its keys and values were computed from, and a
  request reuses the longest common prefix of those ids and its prompt, at
  most all but the prompt's last token (the forward must produce that
  token's logits). A key shared by unrelated prompts costs a miss, never a
  wrong answer; a chat template that re-renders an earlier turn reuses up to
  the first token it changed.
- Consumed: the next turn takes the entry out (its running row now holds the
  context, and leaves a new entry when it finishes). `forget(key)` drops it
  (the hub's `forget(affinity)`, called when an episode ends or is cancelled);
  an aborted request leaves none.
- Bounded: entries are least-recently-retained first out. Running requests
  plus retained contexts are at most `max_batch_size`, the bound the slot
  cache already puts on cached contexts, so reuse adds no memory beyond a full
  batch: when an admission needs room, the oldest entries are evicted.
- Weights: a weight swap drops every entry. Keys and values computed under
  the old weights, read by new-weight queries, give log-probs no trainer
  forward reproduces (why running requests are recomputed at a swap).
  Recomputing retained contexts at the swap would cost the prefill their next
  turn pays anyway, for episodes that may be waiting on their environment or
  never come back, so that turn pays it. Behaviour log-probs stay exact.
- Batching: reused rows admitted in one step share one forward over their last
  S positions, S the longest new suffix among them; a row with a shorter
  suffix recomputes a few of its cached tokens so the batch stays rectangular.
  Fresh prompts go in a forward of their own, so a long new prompt never makes
  a reused row recompute its context.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import Tensor

from cadence.inference.types import GenRequest


@dataclass
class CachedPrefix:
    """The keys and values [layers, heads, n, head_dim] of a context's first n tokens."""

    tokens: list[int]
    keys: Tensor
    values: Tensor

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, n: int) -> CachedPrefix:
        """The first `n` tokens (views, no copy): keys at a position depend only on the tokens up to it."""
        return CachedPrefix(self.tokens[:n], self.keys[:, :, :n], self.values[:, :, :n])


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class RetainedContexts:
    """Finished requests' KV caches by cache key, for their next turn (see module docstring)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, CachedPrefix] = OrderedDict()
        # Kept as a count, not summed over the entries: stats() is read from other threads while the
        # engine's thread changes the entries, and iterating an OrderedDict mid-change raises.
        self._tokens = 0
        self.stats = {
            "reuse_hits": 0,  # requests that continued a retained context
            "reuse_misses": 0,  # requests with a cache key that found none (first turns too)
            "reused_tokens": 0,  # prompt tokens copied in rather than prefilled
            "retained_evicted": 0,  # entries dropped to make room for running requests
            "retained_dropped": 0,  # entries dropped at weight swaps
        }

    def __len__(self) -> int:
        return len(self._entries)

    def tokens(self) -> int:
        """Tokens held over all entries (safe to read from any thread)."""
        return self._tokens

    def _pop(self, key: str) -> CachedPrefix | None:
        entry = self._entries.pop(key, None)
        self._tokens -= 0 if entry is None else len(entry)
        return entry

    def retain(self, key: str, prefix: CachedPrefix) -> None:
        """Keep `prefix` for the next request with `key` (replacing an older entry of that key)."""
        self._pop(key)
        self._entries[key] = prefix
        self._tokens += len(prefix)

    def take(self, req: GenRequest) -> CachedPrefix | None:
        """The cached head of `req`'s prompt under its key, removed from the store; None: a miss."""
        if req.cache_key is None:
            return None
        entry = self._pop(req.cache_key)
        n = 0 if entry is None else common_prefix(entry.tokens, req.prompt_ids)
        n = min(n, len(req.prompt_ids) - 1)
        if entry is None or n < 1:
            self.stats["reuse_misses"] += 1
            return None
        self.stats["reuse_hits"] += 1
        self.stats["reused_tokens"] += n
        return entry.head(n)

    def evict(self, keep: int) -> None:
        """Drop the least recently retained entries until at most `keep` remain."""
        while len(self._entries) > max(keep, 0):
            self._pop(next(iter(self._entries)))
            self.stats["retained_evicted"] += 1

    def forget(self, key: str) -> None:
        self._pop(key)

    def clear(self) -> None:
        self.stats["retained_dropped"] += len(self._entries)
        self._entries.clear()
        self._tokens = 0


def prefill_groups(
    pasts: list[CachedPrefix | None], free: list[int]
) -> list[tuple[list[int], list[int], list[CachedPrefix] | None]]:
    """Split admitted requests into a forward of fresh prompts and one of continued turns.

    `pasts[i]` is request i's cached prefix (None: fresh). Returns, per
    non-empty group, (request indices, their slots, their pasts or None).
    Each group takes the next of the `free` slots in turn, so neither forward
    leaves a gap in the cache's rows.
    """
    fresh = [i for i, p in enumerate(pasts) if p is None]
    again = [i for i, p in enumerate(pasts) if p is not None]
    cut = len(fresh)
    groups = [(fresh, free[:cut], None), (again, free[cut:], [pasts[i] for i in again])]
    return [g for g in groups if g[0]]


def reuse_metrics(engine_stats: dict) -> dict[str, float]:
    """An engine's prompt-reuse counters as run metrics (totals since the engine started).

    `prefill_tokens_saved`: prompt tokens an engine did not run through the model
    because an earlier turn had (embedded: `reused_tokens` from kept contexts;
    vLLM: `cached_prompt_tokens` found in its prefix cache). An engine that
    counts neither (mock) gives no metrics.
    """
    saved = engine_stats.get("reused_tokens", engine_stats.get("cached_prompt_tokens"))
    if saved is None:
        return {}
    prompt = engine_stats.get("prompt_tokens", 0)
    out = {
        "rollout/prompt_tokens_total": float(prompt),
        "rollout/prefill_tokens_total": float(engine_stats.get("prefill_tokens", prompt - saved)),
        "rollout/prefill_tokens_saved_total": float(saved),
        "rollout/prefill_tokens_saved_fraction": saved / max(prompt, 1),
    }
    if "reuse_hits" in engine_stats:  # requests that continued a kept context (embedded only)
        out["rollout/kv_reuse_hits_total"] = float(engine_stats["reuse_hits"])
        out["rollout/kv_reuse_misses_total"] = float(engine_stats["reuse_misses"])
    return out
