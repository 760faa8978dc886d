"""A continuous-batching decode loop over a transformers causal LM.

The zero-install engine and the one tests run against. transformers'
`generate` restarts per batch and `generate_batch` is slow on CPU, so this
is a hand-written loop over one shared `DynamicCache`:

- the batch is a set of rows; row i holds one running request. Rows are
  left-padded to a common cache length; a 2D attention mask marks real
  columns and explicit position_ids (count of real tokens) keep rotary
  positions right whatever the padding;
- newly admitted requests are prefilled together, and their cache rows are
  appended to the running batch (the shorter side is padded on the left);
- finished requests leave with `batch_select_indices`, and leading columns
  that are padding in every remaining row are cut, so the cache stays as
  long as the longest live request, not as long as the engine has run.

The cache holds every token except each row's last sampled one, which is the
next step's input. (DynamicLayer appends with torch.cat, a full copy per
step; writing into preallocated slack was tried and measured slower, because
CPU sdpa copies non-contiguous key/value views anyway.)
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from cadence.inference.sampling import sample, token_logprobs
from cadence.inference.types import FinishReason, GenRequest, GenResult, run_to_completion


@dataclass
class _Seq:
    """A running request: what it has generated so far."""

    req: GenRequest
    version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_window: int = 0  # how many trailing tokens can hold a stop string


class EmbeddedEngine:
    """In-process engine over a Hugging Face causal LM (see module docstring)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch_size: int = 64,
        seed: int = 0,
        static_batching: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        # Static batching (the baseline queue scheduling beats): a new wave is admitted only
        # when every row of the last one has finished, so short answers wait for the longest.
        self.static_batching = static_batching
        self.version = 0
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

        self.pad_id = _first_int(tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        self._new_cache()  # fail early on models this engine cannot batch

        self._waiting: deque[GenRequest] = deque()
        self._running: list[_Seq] = []  # row i of the batch tensors below
        self._cache: DynamicCache | None = None
        self._mask = self._long((0, 0))  # [B, cache_len], 1 = real token
        self._pos = self._long((0,))  # [B] position of the next input token
        self._last = self._long((0,))  # [B] last sampled token, not yet in the cache
        self._temp = torch.zeros(0, device=self.device)  # [B]
        self._top_p = torch.ones(0, device=self.device)  # [B]
        self._held: list[GenResult] = []  # finished outside a `generate` call that ran them
        self._in_step = False
        self._stats = {
            "tokens_generated": 0,
            "prompt_tokens": 0,
            "decode_steps": 0,
            "prefills": 0,
            "requests_finished": 0,
            "busy_s": 0.0,
        }

    # ---- public API -----------------------------------------------------

    def add_request(self, req: GenRequest) -> None:
        """Queue a request; it is prefilled and joins the batch at the next step."""
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
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
                if self._running:
                    rows += self._running
                    t, lp = self._decode()
                    tokens.append(t)
                    logprobs.append(lp)
                free = self.max_batch_size - len(self._running)
                if self._waiting and free > 0 and not (self.static_batching and self._running):
                    admitted = [
                        self._waiting.popleft() for _ in range(min(free, len(self._waiting)))
                    ]
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
                keep = [i for i in range(len(self._running)) if i != row]
                self._keep_rows(keep)
                return self._result(seq, "abort")
        return None

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights into the model in place (strict) and set the version.

        Called between steps. Requests in flight keep their KV cache from the
        old weights and continue with the new ones (their GenResult keeps the
        start version and records the finish version).
        """
        if self._in_step:
            raise RuntimeError("update_weights called during step()")
        with torch.no_grad():
            self.model.load_state_dict(state_dict, strict=True)
        self.version = version

    def load(self) -> int:
        """Number of running plus waiting requests."""
        return len(self._running) + len(self._waiting)

    def stats(self) -> dict:
        """Counters since construction, plus the current batch shape."""
        return {
            **self._stats,
            "running": len(self._running),
            "waiting": len(self._waiting),
            "cache_len": int(self._mask.shape[1]),
            "version": self.version,
        }

    # ---- the batch ------------------------------------------------------

    def _long(self, shape: tuple[int, ...]) -> Tensor:
        return torch.zeros(shape, dtype=torch.long, device=self.device)

    def _new_cache(self) -> DynamicCache:
        """An empty cache; every layer must be a plain full-attention DynamicLayer.

        Left-padded merging and trimming assume every layer sees every column,
        which sliding-window and linear-attention layers do not.
        """
        cache = DynamicCache(config=self.model.config)
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            kinds = sorted({type(layer).__name__ for layer in cache.layers})
            raise NotImplementedError(
                f"EmbeddedEngine needs full-attention layers only, got {kinds}"
            )
        return cache

    def _decode(self) -> tuple[Tensor, Tensor]:
        """One forward for every running row: feed the last token, sample the next."""
        mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=1)
        out = self.model(
            input_ids=self._last[:, None],
            attention_mask=mask,
            position_ids=self._pos[:, None],
            past_key_values=self._cache,
            use_cache=True,
        )
        tokens, logprobs = self._sample(out.logits[:, -1], self._temp, self._top_p)
        self._mask = mask
        self._pos = self._pos + 1
        self._last = tokens
        self._stats["decode_steps"] += 1
        return tokens, logprobs

    def _prefill(self, reqs: list[GenRequest]) -> tuple[list[_Seq], Tensor, Tensor]:
        """Run the prompts of newly admitted requests and append them to the batch."""
        lengths = [len(r.prompt_ids) for r in reqs]
        width = max(lengths)
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        for i, r in enumerate(reqs):  # left padding: the next token goes at the right edge
            ids[i, width - lengths[i] :] = torch.tensor(r.prompt_ids)
            mask[i, width - lengths[i] :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = self._new_cache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        temp = torch.tensor([r.params.temperature for r in reqs], device=self.device)
        top_p = torch.tensor([r.params.top_p for r in reqs], device=self.device)
        tokens, logprobs = self._sample(out.logits[:, -1], temp, top_p)

        self._merge(cache, mask)
        self._pos = torch.cat([self._pos, torch.tensor(lengths, device=self.device)])
        self._last = torch.cat([self._last, tokens])
        self._temp = torch.cat([self._temp, temp])
        self._top_p = torch.cat([self._top_p, top_p])
        rows = [self._new_seq(r) for r in reqs]
        self._running += rows
        self._stats["prefills"] += 1
        self._stats["prompt_tokens"] += sum(lengths)
        return rows, tokens, logprobs

    def _merge(self, cache: DynamicCache, mask: Tensor) -> None:
        """Append a freshly prefilled cache below the running one, left-padding the shorter."""
        if self._cache is None:
            self._cache, self._mask = cache, mask
            return
        width = max(self._mask.shape[1], mask.shape[1])
        for old, new in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_pad_left(old.keys, width, -2), _pad_left(new.keys, width, -2)])
            old.values = torch.cat(
                [_pad_left(old.values, width, -2), _pad_left(new.values, width, -2)]
            )
        self._mask = torch.cat([_pad_left(self._mask, width, 1), _pad_left(mask, width, 1)])

    def _keep_rows(self, keep: list[int]) -> None:
        """Drop every row not in `keep`, then cut columns that are padding in all rows."""
        if not keep:
            self._running = []
            self._cache = None
            self._mask, self._pos, self._last = (
                self._long((0, 0)),
                self._long((0,)),
                self._long((0,)),
            )
            self._temp, self._top_p = self._temp[:0], self._top_p[:0]
            return
        self._running = [self._running[i] for i in keep]
        index = torch.tensor(keep, device=self.device)
        self._cache.batch_select_indices(index)
        self._mask, self._pos, self._last = self._mask[index], self._pos[index], self._last[index]
        self._temp, self._top_p = self._temp[index], self._top_p[index]
        # Rows are left-padded, so the longest row decides how many columns are needed.
        needed = int(self._pos.max())  # real tokens in the cache of the longest row
        cut = self._mask.shape[1] - needed
        if cut > 0:
            self._mask = self._mask[:, cut:]
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]

    # ---- per-request bookkeeping ---------------------------------------

    def _sample(self, logits: Tensor, temp: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor]:
        tokens = sample(logits, temp, top_p, self.generator)
        return tokens, token_logprobs(logits, temp, tokens)

    def _new_seq(self, req: GenRequest) -> _Seq:
        version = self.version if req.version is None else req.version
        # A stop string of n characters spans at most 4n byte-level tokens.
        window = 4 * max((len(s) for s in req.params.stop), default=0) + 4
        return _Seq(req, version, stop_window=window)

    def _record(
        self, rows: list[_Seq], tokens: list[int], logprobs: list[float]
    ) -> list[GenResult]:
        """Append each row's new token, and retire the rows that finished."""
        done: list[GenResult] = []
        keep: list[int] = []
        for i, (seq, tok, lp) in enumerate(zip(rows, tokens, logprobs, strict=True)):
            seq.tokens.append(tok)
            seq.logprobs.append(lp)
            reason = self._finish_reason(seq, tok)
            if reason is None:
                keep.append(i)
            else:
                done.append(self._result(seq, reason))
        self._stats["tokens_generated"] += len(tokens)
        if done:
            self._keep_rows(keep)  # rows == self._running, in order
            self._stats["requests_finished"] += len(done)
        return done

    def _finish_reason(self, seq: _Seq, tok: int) -> FinishReason | None:
        params = seq.req.params
        if tok in self.eos_ids and not params.ignore_eos:
            return "stop"
        if params.stop:
            tail = self.tokenizer.decode(seq.tokens[-seq.stop_window :], skip_special_tokens=True)
            if any(s in tail for s in params.stop):
                return "stop"
        if len(seq.tokens) >= params.max_new_tokens:
            return "length"
        if len(seq.req.prompt_ids) + len(seq.tokens) >= self.max_positions:
            return "length"
        return None

    def _result(self, seq: _Seq, reason: FinishReason) -> GenResult:
        tokens = seq.tokens
        if (
            reason == "stop"
            and tokens
            and tokens[-1] in self.eos_ids
            and not seq.req.params.ignore_eos
        ):
            tokens = tokens[:-1]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if reason == "stop":
            hits = [text.find(s) for s in seq.req.params.stop if s in text]
            if hits:
                text = text[: min(hits)]
        return GenResult(
            request_id=seq.req.request_id,
            prompt_ids=list(seq.req.prompt_ids),
            token_ids=list(seq.tokens),
            logprobs=list(seq.logprobs),
            finish_reason=reason,
            text=text,
            version=seq.version,
            finish_version=self.version,
        )

    def _find(self, request_id: str) -> GenRequest | None:
        for req in self._waiting:
            if req.request_id == request_id:
                return req
        for seq in self._running:
            if seq.req.request_id == request_id:
                return seq.req
        return None


def _pad_left(x: Tensor, width: int, dim: int) -> Tensor:
    """Zero-pad `x` on the left of `dim` up to `width` (zeros are masked out)."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.dim() - dim % x.dim() - 1) + [missing, 0]
    return F.pad(x, pad)


def _first_int(*values: object) -> int:
    return next(v for v in values if isinstance(v, int))


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """EOS ids from the generation config and the tokenizer (either may list several)."""
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    for value in (getattr(gen_cfg, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(value)
    return frozenset(ids)
