"""What goes into and comes out of an inference engine, and the engine protocol.

Every engine (embedded, vLLM, mock) speaks these types, so the rollout loop,
the hub and the trainer never care which one is running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from torch import Tensor

from cadence.inference.config import check_temperature

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class SamplingParams:
    """How to sample one response.

    temperature 0 means greedy, any other at least MIN_TEMPERATURE. top_p < 1 samples from the smallest set of
    tokens whose probability reaches top_p. A response ends at EOS (unless
    ignore_eos) or one of `stop_token_ids` (a chat template's end-of-turn
    token), when its decoded text contains one of `stop`, or after
    max_new_tokens tokens.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_temperature(self.temperature)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


@dataclass
class GenRequest:
    """One prompt to complete.

    `version` is the policy version the sample is credited to (for
    staleness); None lets the engine fill in its version when it starts
    generating.

    `cache_key` (an episode id; the hub sets it to the request's `affinity`)
    lets an engine keep this request's KV cache after it finishes and reuse it
    for the next request with the same key (the episode's next turn; see
    `cadence/inference/prefix_reuse.py`). The engine checks the tokens: a key
    shared by unrelated prompts costs a cache miss, never a wrong result.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    version: int | None = None
    cache_key: str | None = None


@dataclass
class GenResult:
    """A finished (or aborted) response.

    token_ids include the token that completed a stop string and the EOS
    token; `text` is the decoded response cut before the stop string, without
    special tokens.

    logprobs[i] is the behaviour log-prob of token_ids[i] (the sample's
    `behaviour_logprobs`, mu in the formulas of `cadence.algo`):
    log_softmax(logits / T)[token] over the full vocabulary, T the request's
    temperature (T = 1 for greedy requests), under the weights that sampled
    the token. With top_p < 1 it is still the full-vocabulary value, not
    renormalised over the nucleus: it is what the trainer computes (with the
    same temperature), so pi_old / mu = 1 on fresh data. Every engine returns
    this; after a weight update mid-request, later tokens are the new
    weights' on the full context (the engines recompute the KV cache).

    `version` is the policy version when the request started, `finish_version`
    the version when it ended (they differ when weights were updated while it
    was in flight).
    """

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str
    version: int
    finish_version: int


@dataclass
class InFlight:
    """A request an engine is generating: what it has produced so far, and how it turns into a result.

    Each engine keeps its own bookkeeping beside these fields (a KV-cache
    slot, a simulated length) in a subclass.
    """

    req: GenRequest
    version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def result(self, reason: FinishReason, text: str, finish_version: int) -> GenResult:
        return GenResult(
            request_id=self.req.request_id,
            prompt_ids=list(self.req.prompt_ids),
            token_ids=list(self.tokens),
            logprobs=list(self.logprobs),
            finish_reason=reason,
            text=text,
            version=self.version,
            finish_version=finish_version,
        )


def cut_at_stop(text: str, stop: list[str]) -> str:
    """`text` up to the earliest of the `stop` strings it holds (all of it when it holds none)."""
    hits = [text.find(s) for s in stop if s in text]
    return text[: min(hits)] if hits else text


@runtime_checkable
class InferenceEngine(Protocol):
    """One model replica that generates with continuous batching.

    The engine is driven from one thread: `step()` does a bounded amount of
    work (admit waiting requests, one decode step) so a caller can interleave
    it with aborts and weight updates between steps.
    """

    version: int

    def add_request(self, req: GenRequest) -> None:
        """Queue a request; it joins the running batch at the next step."""
        ...

    def step(self) -> list[GenResult]:
        """Admit waiting requests, decode one token for each running one, return the finished."""
        ...

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        ...

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Run until all `reqs` are done; results in request order."""
        ...

    def abort(self, request_id: str) -> GenResult | None:
        """Stop a request now; its partial result (finish_reason "abort"), or None if unknown."""
        ...

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Load new policy weights in place and tag later tokens with `version`."""
        ...

    def load(self) -> int:
        """Number of running plus waiting requests (for least-loaded routing)."""
        ...

    def sampling_state(self) -> dict:
        """The random state later samples depend on (for a bit-identical resume).

        Only the sampling randomness: requests in flight, weights and version
        are not part of it. Saved with no request in flight and loaded into an
        engine with the same weights, later requests sample the same tokens.
        """
        ...

    def load_sampling_state(self, state: dict) -> None:
        """Restore what `sampling_state` returned (from this engine or one of the same kind)."""
        ...

    def stats(self) -> dict:
        """Counters: tokens generated, decode steps, busy seconds, ..."""
        ...


def run_to_completion(engine: InferenceEngine, reqs: list[GenRequest]) -> tuple[list[GenResult], list[GenResult]]:
    """Add `reqs`, step `engine` until all of them finish.

    Returns their results in request order, and the results of *other* requests
    that finished meanwhile, which the engine should hand out on its next `step`.
    """
    for req in reqs:
        engine.add_request(req)
    wanted = {req.request_id for req in reqs}
    results: dict[str, GenResult] = {}
    others: list[GenResult] = []
    while len(results) < len(wanted):
        for res in engine.step():
            if res.request_id in wanted:
                results[res.request_id] = res
            else:
                others.append(res)
    return [results[req.request_id] for req in reqs], others
