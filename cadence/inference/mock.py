"""A model-free engine with controllable response lengths and decode latency.

For scheduler tests and scale simulations: it speaks the `InferenceEngine`
protocol, batches continuously like a real engine (requests wait for a free
row of `max_batch_size`, every running row gets one token per step, a
finished row frees its slot for the next step), and costs what a
memory-bound decode costs:

    step seconds = step_latency_s + per_token_latency_s * running rows
                   + prefill_latency_s * prompt tokens admitted this step
                   + context_latency_s * context tokens of the running rows

(the last term is the KV-cache read: every decode step reads each running
row's whole context, prompt plus tokens so far; 0 by default).

Each request's length is drawn when it is added, from a seeded generator:
"lognormal" (median `median_tokens`, shape `sigma`; sigma = 1 puts the
longest of a thousand responses near 20x the median, the long tail that
makes synchronous rollout wait) or "fixed". It is capped by `max_tokens`
and the request's `max_new_tokens` (finish "length"); an uncapped response
ends with `eos_id` (finish "stop").

Latency is real (`time.sleep`) by default. With `virtual_clock=True` nothing
sleeps: `clock()` is a simulated time advanced by each step's cost, so a
test can run hours of simulated rollout in milliseconds. Either way
`clock()` counts seconds since the engine was made.

Tokens are random ids below `vocab_size`, log-probs are plausible negative
numbers, and `text` comes from `answer_fn(request)` ("" without one): the
tokens and text of a mock response are unrelated. The log-probs stand for
what real engines return (full-vocabulary log_softmax(logits / T)[token],
whatever top_p is; see `GenResult`) but are not computed from anything.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from cadence.inference.types import FinishReason, GenRequest, GenResult, InFlight, run_to_completion

LengthDist = Literal["lognormal", "fixed"]


@dataclass
class _Seq(InFlight):
    """A simulated request: its length and ending are drawn when it is admitted."""

    length: int = 0  # tokens this response will have
    reason: FinishReason = "length"  # how it ends when it reaches `length`


class MockEngine:
    """Continuous-batching engine without a model (see module docstring)."""

    def __init__(
        self,
        max_batch_size: int = 64,
        seed: int = 0,
        length_dist: LengthDist = "lognormal",
        median_tokens: int = 256,
        sigma: float = 1.0,
        max_tokens: int | None = None,
        step_latency_s: float = 0.0,
        per_token_latency_s: float = 0.0,
        prefill_latency_s: float = 0.0,
        virtual_clock: bool = False,
        context_latency_s: float = 0.0,
        vocab_size: int = 32000,
        eos_id: int = 0,
        answer_fn: Callable[[GenRequest], str] | None = None,
        static_batching: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if length_dist not in ("lognormal", "fixed"):
            raise ValueError(f"length_dist must be 'lognormal' or 'fixed', got {length_dist!r}")
        if median_tokens < 1 or sigma < 0 or (max_tokens is not None and max_tokens < 1):
            raise ValueError("median_tokens and max_tokens must be >= 1 and sigma >= 0")
        if min(step_latency_s, per_token_latency_s, prefill_latency_s, context_latency_s) < 0:
            raise ValueError("latencies must be >= 0")
        if not 0 <= eos_id < vocab_size:
            raise ValueError(f"eos_id {eos_id} is not below vocab_size {vocab_size}")
        self.max_batch_size = max_batch_size
        self.static_batching = static_batching
        self.length_dist = length_dist
        self.median_tokens = median_tokens
        self.sigma = sigma
        self.max_tokens = max_tokens
        self.step_latency_s = step_latency_s
        self.per_token_latency_s = per_token_latency_s
        self.prefill_latency_s = prefill_latency_s
        self.context_latency_s = context_latency_s
        self.virtual_clock = virtual_clock
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.answer_fn = answer_fn
        self.version = 0

        self._rng = random.Random(seed)
        self._start = time.monotonic()
        self._virtual_now = 0.0
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._held: list[GenResult] = []
        self._stats = {
            "tokens_generated": 0,
            "prompt_tokens": 0,
            "decode_steps": 0,
            "requests_finished": 0,
            "busy_s": 0.0,
            "weight_updates": 0,
        }

    # ---- the length distribution -----------------------------------------

    def sample_length(self) -> int:
        """One response length from the configured distribution (before any cap)."""
        if self.length_dist == "fixed":
            return self.median_tokens
        # The median of lognormal(mu, sigma) is exp(mu).
        return max(1, round(self._rng.lognormvariate(math.log(self.median_tokens), self.sigma)))

    # ---- public API --------------------------------------------------------

    def clock(self) -> float:
        """Seconds since construction: simulated with `virtual_clock`, else wall time."""
        if self.virtual_clock:
            return self._virtual_now
        return time.monotonic() - self._start

    def add_request(self, req: GenRequest) -> None:
        """Queue a request; its response length is drawn now."""
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        if self._find(req.request_id) is not None:
            raise ValueError(f"request id {req.request_id!r} is already in flight")
        cap = min(req.params.max_new_tokens, self.max_tokens or req.params.max_new_tokens)
        natural = cap + 1 if req.params.ignore_eos else self.sample_length()
        length, reason = (natural, "stop") if natural <= cap else (cap, "length")
        seq = _Seq(req, self.version if req.version is None else req.version, length=length, reason=reason)
        self._waiting.append(seq)

    def step(self) -> list[GenResult]:
        """Admit waiting requests into free rows, add one token to every row, return the finished."""
        done, self._held = self._held, []
        if not self.has_unfinished():
            return done
        prompt_tokens = 0
        # Static batching (the batch-wise baseline): a new wave only once the last one is done.
        admit = not (self.static_batching and self._running)
        while admit and self._waiting and len(self._running) < self.max_batch_size:
            seq = self._waiting.popleft()
            if seq.req.version is None:
                seq.version = self.version
            prompt_tokens += len(seq.req.prompt_ids)
            self._running.append(seq)
        cost = (
            self.step_latency_s
            + self.per_token_latency_s * len(self._running)
            + self.prefill_latency_s * prompt_tokens
        )
        if self.context_latency_s:
            context = sum(len(s.req.prompt_ids) + len(s.tokens) for s in self._running)
            cost += self.context_latency_s * context
        self._advance(cost)

        keep: list[_Seq] = []
        for seq in self._running:
            last = len(seq.tokens) + 1 == seq.length
            if last and seq.reason == "stop":
                tok = self.eos_id
            else:  # any id but EOS
                tok = self._rng.randrange(self.vocab_size - 1)
                tok += tok >= self.eos_id
            seq.tokens.append(tok)
            seq.logprobs.append(-self._rng.expovariate(1.0))
            if last:
                done.append(self._result(seq, seq.reason))
            else:
                keep.append(seq)
        self._stats["tokens_generated"] += len(self._running)
        self._stats["prompt_tokens"] += prompt_tokens
        self._stats["decode_steps"] += 1
        self._stats["requests_finished"] += len(self._running) - len(keep)
        self._stats["busy_s"] += cost
        self._running = keep
        return done

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self._waiting or self._running)

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Run until all `reqs` finish; results in request order (others are held for `step`)."""
        results, others = run_to_completion(self, reqs)
        self._held += others
        return results

    def abort(self, request_id: str) -> GenResult | None:
        """Stop a request now; its partial result, or None if it is unknown."""
        for queue in (self._waiting, self._running):
            for i, seq in enumerate(queue):
                if seq.req.request_id == request_id:
                    del queue[i]
                    if seq.req.version is None and queue is self._waiting:
                        seq.version = self.version
                    return self._result(seq, "abort")
        return None

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """No weights to load: only set the version later tokens are tagged with."""
        self.version = version
        self._stats["weight_updates"] += 1

    def load(self) -> int:
        """Number of running plus waiting requests."""
        return len(self._running) + len(self._waiting)

    def sampling_state(self) -> dict:
        """The generator every length, token and log-prob is drawn from."""
        return {"rng": self._rng.getstate()}

    def load_sampling_state(self, state: dict) -> None:
        """Continue drawing from a `sampling_state()` (lists accepted, as from JSON)."""
        if "rng" not in state:
            raise ValueError("sampling state has no 'rng': pass MockEngine.sampling_state()")
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def stats(self) -> dict:
        """Counters since construction, the batch shape and the clock."""
        return {
            **self._stats,
            "running": len(self._running),
            "waiting": len(self._waiting),
            "version": self.version,
            "clock_s": self.clock(),
        }

    # ---- internals ---------------------------------------------------------

    def _advance(self, seconds: float) -> None:
        if self.virtual_clock:
            self._virtual_now += seconds
        elif seconds > 0:
            time.sleep(seconds)

    def _result(self, seq: _Seq, reason: FinishReason) -> GenResult:
        text = self.answer_fn(seq.req) if self.answer_fn is not None else ""
        return seq.result(reason, text, self.version)

    def _find(self, request_id: str) -> _Seq | None:
        return next(
            (s for s in (*self._waiting, *self._running) if s.req.request_id == request_id), None
        )
