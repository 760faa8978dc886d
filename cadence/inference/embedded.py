"""A continuous-batching decode loop over a transformers causal LM.

The zero-install engine and the one tests run against. transformers'
`generate` restarts per batch and `generate_batch` is slow on CPU, so this
is a hand-written loop over one shared KV cache (`SlotKVCache`):

- the batch is a set of row slots (`SlotBatch`, slot_batch.py: the forwards);
  each running request holds one. Rows are left-padded to a common cache
  window; a 2D attention mask marks real columns and explicit position_ids
  (count of real tokens) keep rotary positions right whatever the padding;
- a decode step writes one column in place into preallocated buffers that
  grow geometrically, not a `torch.cat` of the whole cache per step. (CPU
  sdpa then reads strided views that are no longer hot in cache, so its own
  time goes up, by much less than the copies it replaces: measured 1.5-1.9x
  faster overall with a full batch of long-tailed requests, level for a
  draining one);
- newly admitted requests are prefilled together, straight into free slots
  (right-aligned at the window's edge, widening it on the left if a prompt
  is longer than the window);
- a finished request only releases its slot: it is masked out and the next
  admitted request reuses it. Slots no waiting request will fill are closed
  by moving the last rows into them (a row copy each), and leading columns
  that are padding in every live row are dropped, so the window stays as
  long as the longest live request, not as long as the engine has run.

Rows are sampled in admission order whatever slot they sit in, so seeded
sampling draws the same random numbers as a batch that appends new rows and
deletes finished ones.

A weight update with requests in flight (interruptible generation) keeps
their tokens and start version but recomputes their cache under the new
weights (batched prefills of prompt + response so far; vLLM preempts them to
the same end): old-weight keys read by new-weight queries are a state no
trainer forward reproduces. Tokens sampled before the swap keep the old
policy's log-probs: it sampled them. Log-probs (mu) are log_softmax(logits /
T)[token] over the full vocabulary, also with top_p < 1 (see `GenResult`).

An episode's turns (requests with one `cache_key`) keep their KV cache between
turns, so a turn prefills only its new tokens (see `prefix_reuse.py`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cadence.inference.endings import eos_ids, finish_reason, first_int, response_text, stop_window
from cadence.inference.prefix_reuse import CachedPrefix, RetainedContexts, prefill_groups
from cadence.inference.sampling import sample, token_logprobs
from cadence.inference.slot_batch import SlotBatch, recompute_groups
from cadence.inference.types import (
    FinishReason,
    GenRequest,
    GenResult,
    InFlight,
    run_to_completion,
)


@dataclass
class _Seq(InFlight):
    """A running request: what it has generated so far, and where it lives in the cache."""

    stop_window: int = 0  # how many trailing tokens can hold a stop string
    slot: int = -1  # its row in the KV cache


class EmbeddedEngine:
    """In-process engine over a Hugging Face causal LM (see module docstring)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch_size: int = 64,
        seed: int = 0,
        static_batching: bool = False,
        keep_kv: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        # Static batching (the baseline queue scheduling beats): a new wave is admitted only
        # when every row of the last one has finished, so short answers wait for the longest.
        self.static_batching = static_batching
        self.keep_kv = keep_kv  # keep finished requests' KV for their cache_key's next turn
        self.version = 0
        # A weight swap recomputes running rows' caches in forwards of rows of similar length:
        # at most this many padded tokens per forward, ...
        self.recompute_chunk_tokens = 1 << 15
        # ... each forward costing as much as this many more tokens (measured on CPU for the
        # built-in model: a 1-token forward costs ~3.3 ms, a token in a long one ~0.06 ms).
        self.recompute_forward_tokens = 64
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

        self.vocab_size = model.get_input_embeddings().num_embeddings  # prompt ids must be below it
        self.pad_id = first_int(tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        self.eos_ids = eos_ids(model, tokenizer)
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        self._batch = SlotBatch(self.model, max_batch_size, self.pad_id, self.device)

        self._waiting: deque[GenRequest] = deque()
        self._running: list[_Seq] = []  # in admission order, the order rows are sampled in
        self._order: tuple[Tensor, Tensor, Tensor] | None = None  # slots, temp, top_p of _running
        self._order_stale = True
        self._held: list[GenResult] = []  # finished outside a `generate` call that ran them
        self._retained = RetainedContexts()
        self._in_step = False
        self._stats = {
            "tokens_generated": 0,
            "prompt_tokens": 0,
            "prefill_tokens": 0,  # prompt tokens run through the model (not copied from a turn before)
            "decode_steps": 0,
            "prefills": 0,
            "requests_finished": 0,
            "recomputes": 0,  # weight swaps that rebuilt running rows' caches
            "recomputed_tokens": 0,
            "recompute_forwards": 0,
            "recompute_padded_tokens": 0,  # recomputed_tokens plus the padding of their forwards
            "recompute_s": 0.0,
            "busy_s": 0.0,
        }

    # ---- public API -----------------------------------------------------

    def add_request(self, req: GenRequest) -> None:
        """Queue a request; it is prefilled and joins the batch at the next step."""
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        if not 0 <= min(req.prompt_ids) <= max(req.prompt_ids) < self.vocab_size:
            bad = next(i for i in req.prompt_ids if not 0 <= i < self.vocab_size)
            raise ValueError(f"request {req.request_id!r}: token id {bad} is not in the model's vocabulary "
                             f"(0 .. {self.vocab_size - 1})")
        if self._find(req.request_id) is not None:
            raise ValueError(f"request id {req.request_id!r} is already in flight")
        self._waiting.append(req)

    def step(self) -> list[GenResult]:
        """Decode one token for each running request, admit waiting ones, return the finished."""
        done, self._held = self._held, []
        if not self.has_unfinished():
            return done
        self._in_step = True
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                rows: list[_Seq] = []
                tokens, logprobs = [], []
                free = self.max_batch_size - len(self._running)
                admit = 0
                if self._waiting and free > 0 and not (self.static_batching and self._running):
                    admit = min(free, len(self._waiting))
                self._close_holes(keep=admit)
                if self._running:
                    rows += self._running
                    t, lp = self._decode()
                    tokens.append(t)
                    logprobs.append(lp)
                if admit:
                    admitted = [self._waiting.popleft() for _ in range(admit)]
                    new_rows, t, lp = self._prefill(admitted)
                    rows += new_rows
                    tokens.append(t)
                    logprobs.append(lp)
                done += self._record(rows, torch.cat(tokens).tolist(), torch.cat(logprobs).tolist())
        finally:
            self._in_step = False
            self._stats["busy_s"] += time.perf_counter() - start
        return done

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self._waiting or self._running)

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Run until all `reqs` finish; results in request order.

        Requests already in flight keep running; their results are held for
        the next `step()` call rather than lost.
        """
        results, others = run_to_completion(self, reqs)
        self._held += others
        return results

    def abort(self, request_id: str) -> GenResult | None:
        """Stop a request now and return what it generated, or None if it is unknown."""
        for i, req in enumerate(self._waiting):
            if req.request_id == request_id:
                del self._waiting[i]
                seq = _Seq(req, self.version if req.version is None else req.version)
                return self._result(seq, "abort")
        for row, seq in enumerate(self._running):
            if seq.req.request_id == request_id:
                with torch.inference_mode():  # the cache tensors are inference tensors
                    self._release([row])
                return self._result(seq, "abort")
        return None

    def forget(self, cache_key: str) -> None:
        """Drop the KV cache kept for `cache_key` (its episode ended)."""
        self._retained.forget(cache_key)

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights into the model in place (strict), recompute running rows' caches.

        Called between steps. Requests in flight keep their tokens, log-probs
        and start version (interruptible generation; their GenResult records
        the finish version too), but their KV cache is recomputed under the
        new weights, so every later token is sampled from, and scored by, the
        new policy on the full context, as a trainer forward would.
        """
        if self._in_step:
            raise RuntimeError("update_weights called during step()")
        with torch.no_grad():
            self.model.load_state_dict(state_dict, strict=True)
        self.version = version
        self._retained.clear()  # computed under the old weights (see prefix_reuse.py)
        with torch.inference_mode():  # the cache tensors are inference tensors
            self._recompute_cache()

    def load(self) -> int:
        """Number of running plus waiting requests."""
        return len(self._running) + len(self._waiting)

    def sampling_state(self) -> dict:
        """The sampling generator's state: every random draw comes from it, nothing else counts."""
        return {"generator": self.generator.get_state()}

    def load_sampling_state(self, state: dict) -> None:
        """Continue sampling from a `sampling_state()` (same weights, same requests: same tokens)."""
        if "generator" not in state:
            raise ValueError(
                "sampling state has no 'generator': pass EmbeddedEngine.sampling_state()"
            )
        self.generator.set_state(state["generator"].cpu())

    def stats(self) -> dict:
        """Counters since construction, plus the current batch shape."""
        return {
            **self._stats,
            **self._retained.stats,
            "retained": len(self._retained),
            "retained_tokens": self._retained.tokens(),
            "running": len(self._running),
            "waiting": len(self._waiting),
            "cache_len": self._batch.cache.width,
            "version": self.version,
        }

    # ---- the batch ------------------------------------------------------

    def _sampling_order(self) -> tuple[Tensor, Tensor, Tensor] | None:
        """Slots of the running rows in admission order, with their temperatures and top-p.

        None when that order is simply slots 0..n-1 (no gather needed).
        """
        if self._order_stale:
            slots = [seq.slot for seq in self._running]
            if slots == list(range(self._batch.rows)):
                self._order = None
            else:
                index = torch.tensor(slots, device=self.device)
                self._order = (index, self._batch.inputs.temp[index], self._batch.inputs.top_p[index])
            self._order_stale = False
        return self._order

    def _decode(self) -> tuple[Tensor, Tensor]:
        """One forward for every slot: feed the last token, sample the next for the running rows."""
        logits = self._batch.decode()
        n, inputs = self._batch.rows, self._batch.inputs
        order = self._sampling_order()
        if order is None:
            tokens, logprobs = self._sample(logits, inputs.temp[:n], inputs.top_p[:n])
            inputs.last[:n] = tokens
        else:
            index, temp, top_p = order
            tokens, logprobs = self._sample(logits[index], temp, top_p)
            inputs.last[index] = tokens
        self._stats["decode_steps"] += 1
        return tokens, logprobs

    def _prefill(self, reqs: list[GenRequest]) -> tuple[list[_Seq], Tensor, Tensor]:
        """Run the prompts of newly admitted requests, writing their cache into free slots.

        Fresh prompts go in one forward, turns that continue a retained
        context in another (see prefix_reuse.py); sampling is one draw over
        all of them in admission order, as without reuse.
        """
        lengths = [len(r.prompt_ids) for r in reqs]
        pasts = [self._retained.take(r) if self.keep_kv else None for r in reqs]
        self._retained.evict(keep=self.max_batch_size - len(self._running) - len(reqs))
        free = self._batch.free_slots(len(reqs))
        slots, logits = [0] * len(reqs), None
        for group, group_slots, group_pasts in prefill_groups(pasts, free):
            part, computed = self._batch.fill([reqs[i].prompt_ids for i in group], group_slots, group_pasts)
            self._stats["prefill_tokens"] += computed
            logits = part.new_empty((len(reqs), part.shape[1])) if logits is None else logits
            logits[group] = part
            for i, slot in zip(group, group_slots, strict=True):
                slots[i] = slot
        temp = torch.tensor([r.params.temperature for r in reqs], device=self.device)
        top_p = torch.tensor([r.params.top_p for r in reqs], device=self.device)
        tokens, logprobs = self._sample(logits, temp, top_p)
        self._batch.inputs.set(slots, tokens, lengths, [r.params for r in reqs])
        self._order_stale = True
        new_rows = [self._new_seq(r, slot) for r, slot in zip(reqs, slots, strict=True)]
        self._running += new_rows
        self._stats["prefills"] += 1
        self._stats["prompt_tokens"] += sum(lengths)
        return new_rows, tokens, logprobs

    def _recompute_cache(self) -> None:
        """Rebuild the cache of every running row under the current weights (after a swap).

        Batched prefills of prompt + response so far, minus the last sampled
        token (the next step's input, as always), into slots 0..n-1; the old
        cache and its holes are dropped. Rows of similar length share a
        forward (`recompute_groups`), so a short row is not padded to the
        longest running one; sampling keeps admission order (`_sampling_order`).
        """
        seqs = self._running
        if not seqs:
            return
        start = time.perf_counter()
        contexts = [seq.req.prompt_ids + seq.tokens[:-1] for seq in seqs]
        lengths = [len(c) for c in contexts]
        groups = recompute_groups(lengths, self.recompute_chunk_tokens, self.recompute_forward_tokens)
        slots = self._batch.refill(contexts, groups)
        for seq, slot in zip(seqs, slots, strict=True):
            seq.slot = slot
        last = torch.tensor([seq.tokens[-1] for seq in seqs], device=self.device)
        self._batch.inputs.set(slots, last, lengths, [seq.req.params for seq in seqs])
        self._order_stale = True
        self._stats["recomputes"] += 1
        self._stats["recomputed_tokens"] += sum(lengths)
        self._stats["recompute_forwards"] += len(groups)
        self._stats["recompute_padded_tokens"] += sum(len(g) * max(lengths[i] for i in g) for g in groups)
        self._stats["recompute_s"] += time.perf_counter() - start

    def _release(self, rows: list[int]) -> None:
        """Take rows (indices into `_running`) out of the batch; their slots become holes."""
        gone = set(rows)
        slots = [self._running[i].slot for i in rows]
        self._running = [seq for i, seq in enumerate(self._running) if i not in gone]
        self._order_stale = True
        if not self._running:  # nothing left: start the next batch from an empty cache
            self._batch.clear()
        else:
            self._batch.release(slots)

    def _close_holes(self, keep: int) -> None:
        """Leave at most `keep` holes (this step's admissions fill them); close the rest.

        Trailing holes are dropped; others get the batch's last row (one row copied).
        """
        if len(self._batch.holes) <= keep:
            return
        by_slot = {seq.slot: seq for seq in self._running}
        for src, dst in self._batch.close_holes(keep):
            by_slot[src].slot = dst
        self._order_stale = True

    # ---- per-request bookkeeping ---------------------------------------

    def _sample(self, logits: Tensor, temp: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor]:
        tokens = sample(logits, temp, top_p, self.generator)
        return tokens, token_logprobs(logits, temp, tokens)

    def _new_seq(self, req: GenRequest, slot: int) -> _Seq:
        version = self.version if req.version is None else req.version
        return _Seq(req, version, stop_window=stop_window(req.params), slot=slot)

    def _record(
        self, rows: list[_Seq], tokens: list[int], logprobs: list[float]
    ) -> list[GenResult]:
        """Append each row's new token, and retire the rows that finished."""
        done: list[GenResult] = []
        finished: list[int] = []
        for i, (seq, tok, lp) in enumerate(zip(rows, tokens, logprobs, strict=True)):
            seq.tokens.append(tok)
            seq.logprobs.append(lp)
            reason = finish_reason(
                seq, seq.stop_window, self.eos_ids, self.tokenizer, self.max_positions
            )
            if reason is not None:
                finished.append(i)
                done.append(self._result(seq, reason))
                self._retain(seq)
        self._stats["tokens_generated"] += len(tokens)
        if done:
            self._release(finished)  # rows == self._running, in order
            self._stats["requests_finished"] += len(done)
        return done

    def _retain(self, seq: _Seq) -> None:
        """Copy a finished row's KV cache out for its cache key's next turn."""
        if self.keep_kv and seq.req.cache_key is not None:
            context = seq.req.prompt_ids + seq.tokens[:-1]  # the last token never went in
            keys, values = self._batch.cache.read_row(seq.slot, len(context))
            self._retained.retain(seq.req.cache_key, CachedPrefix(context, keys, values))

    def _result(self, seq: _Seq, reason: FinishReason) -> GenResult:
        text = response_text(seq, reason, self.eos_ids, self.tokenizer)
        return seq.result(reason, text, self.version)

    def _find(self, request_id: str) -> GenRequest | None:
        for req in self._waiting:
            if req.request_id == request_id:
                return req
        for seq in self._running:
            if seq.req.request_id == request_id:
                return seq.req
        return None

