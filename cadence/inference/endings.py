"""When a response ends, and the text it turns into (EmbeddedEngine's tokenizer side).

A response ends at an EOS token (unless ignore_eos) or a stop token, once its decoded tail
holds a stop string, at max_new_tokens, or at the model's last position. Its
result keeps every token (the EOS and the token completing a stop string
were sampled: their log-probs belong to the sample); its text drops the EOS
(or stop token) and is cut before the stop string.
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cadence.inference.types import FinishReason, InFlight, SamplingParams, cut_at_stop


def stop_window(params: SamplingParams) -> int:
    """How many trailing tokens can hold a stop string: n characters span at most 4n byte tokens."""
    return 4 * max((len(s) for s in params.stop), default=0) + 4


def finish_reason(
    seq: InFlight,
    window: int,
    eos_ids: frozenset[int],
    tokenizer: PreTrainedTokenizerBase,
    max_positions: int,
) -> FinishReason | None:
    """Why `seq` ends after its last token, or None while it goes on."""
    params, tok = seq.req.params, seq.tokens[-1]
    if ends_turn(tok, params, eos_ids):
        return "stop"
    if params.stop:
        tail = tokenizer.decode(seq.tokens[-window:], skip_special_tokens=True)
        if any(s in tail for s in params.stop):
            return "stop"
    if len(seq.tokens) >= params.max_new_tokens:
        return "length"
    if len(seq.req.prompt_ids) + len(seq.tokens) >= max_positions:
        return "length"
    return None


def response_text(
    seq: InFlight, reason: FinishReason, eos_ids: frozenset[int], tokenizer: PreTrainedTokenizerBase
) -> str:
    """The decoded response, without special tokens, a final EOS or what follows a stop string."""
    tokens = seq.tokens
    params = seq.req.params
    if reason == "stop" and tokens and ends_turn(tokens[-1], params, eos_ids):
        tokens = tokens[:-1]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return cut_at_stop(text, params.stop) if reason == "stop" else text


def ends_turn(token: int, params: SamplingParams, eos_ids: frozenset[int]) -> bool:
    """An EOS token (unless ignore_eos) or one of the request's stop tokens (an end of turn)."""
    return (token in eos_ids and not params.ignore_eos) or token in params.stop_token_ids


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """EOS ids from the generation config and the tokenizer (either may list several)."""
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    for value in (getattr(gen_cfg, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(value)
    return frozenset(ids)


def first_int(*values: object) -> int:
    """The first of `values` that is an int (a pad id from whichever of them is set)."""
    return next(v for v in values if isinstance(v, int))
