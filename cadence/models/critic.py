"""Value-head critics: a causal-LM backbone with a scalar head on every position.

AsyPPO (arXiv 2510.01656) replaces PPO's policy-sized critic with two small
critics of the same family as the policy (Qwen3-0.6B critics for a 4B actor).
`ValueModel` is one such critic; `small_critic_config` builds the config of a
critic about a quarter of the policy's size when no pretrained critic is given.

A critic reads the policy's token ids, so it must keep the policy's vocabulary;
only depth and width shrink.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)

from cadence.models.loading import resolve_model_path

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """V(s_t) for every prefix s_t of a token sequence: backbone -> Linear(hidden, 1)."""

    def __init__(self, backbone: PreTrainedModel):
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        hidden = self.config.hidden_size
        self.value_head = nn.Linear(hidden, 1)
        # Small init (as OpenRLHF does): the first values are near 0, so early
        # critic updates are not dominated by a random offset, while the
        # backbone still gets a non-zero gradient from step one.
        nn.init.normal_(self.value_head.weight, std=1.0 / (hidden + 1))
        nn.init.zeros_(self.value_head.bias)
        self.value_head.to(next(backbone.parameters()).dtype)

    # ---- construction -------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str, **kwargs) -> ValueModel:
        """The backbone of any local HF causal-LM checkpoint, with a fresh value head.

        `AutoModel` loads the base model (e.g. `Qwen2Model`) and skips the LM
        head weights. `path` may be `builtin`; `kwargs` go to `from_pretrained`
        (e.g. `dtype=torch.bfloat16`). To restore a saved critic *with* its
        trained head, use `ValueModel.load`.
        """
        return cls(AutoModel.from_pretrained(resolve_model_path(path), **kwargs))

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> ValueModel:
        """A randomly initialised critic (global torch RNG) of the given architecture."""
        return cls(AutoModel.from_config(config))

    @classmethod
    def load(cls, path: str, **kwargs) -> ValueModel:
        """A critic written by `save_pretrained`: backbone plus trained value head."""
        head_file = Path(path) / VALUE_HEAD_FILE
        if not head_file.exists():
            raise FileNotFoundError(
                f"{head_file} not found: {path} is not a saved critic; "
                "use ValueModel.from_pretrained to start a critic from a causal-LM checkpoint"
            )
        model = cls.from_pretrained(path, **kwargs)
        head = load_file(str(head_file))
        model.value_head.load_state_dict(
            {k: v.to(model.value_head.weight.dtype) for k, v in head.items()}
        )
        return model

    def save_pretrained(self, path: str) -> None:
        """Backbone in HF format (loadable by `AutoModel`) plus `value_head.safetensors`."""
        Path(path).mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path)
        head = {k: v.detach().contiguous().cpu() for k, v in self.value_head.state_dict().items()}
        save_file(head, str(Path(path) / VALUE_HEAD_FILE))

    # ---- use ---------------------------------------------------------------

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None
    ) -> Tensor:
        """Values [B, N] in float32: entry t is the value of the prefix ending at token t.

        Without `position_ids`, positions count real tokens only
        (cumsum(mask) - 1), so left padding does not shift them; this is the
        convention HF `generate` uses, and the one the policy sees.
        """
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        hidden = out.last_hidden_state.to(self.value_head.weight.dtype)
        return self.value_head(hidden).squeeze(-1).float()

    def num_parameters(self) -> int:
        """Parameters of backbone and head (shared tensors counted once)."""
        return sum(p.numel() for p in self.parameters())


# ---- a critic config a fraction of the policy's size --------------------------


def _count_params(config: PretrainedConfig, causal_lm: bool) -> int:
    """Parameters of a model built from `config`, on the meta device (no memory, no init)."""
    with torch.device("meta"):
        model = (AutoModelForCausalLM if causal_lm else AutoModel).from_config(config)
    return sum(p.numel() for p in model.parameters())


def _resize(config: PretrainedConfig, heads: int, layers: int) -> PretrainedConfig:
    """Same family and vocabulary; `heads` attention heads of unchanged head_dim, `layers` layers."""
    d = config.to_dict()
    old_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // old_heads
    group = max(1, old_heads // getattr(config, "num_key_value_heads", old_heads))
    kv_heads = max(1, heads // group)
    while heads % kv_heads:
        kv_heads -= 1
    hidden = heads * head_dim
    d.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        intermediate_size=max(1, round(config.intermediate_size * hidden / config.hidden_size)),
    )
    if "num_key_value_heads" in d:
        d["num_key_value_heads"] = kv_heads
    if d.get("layer_types") is not None:
        types = list(d["layer_types"])  # per-layer attention kinds: keep the pattern
        d["layer_types"] = [types[i % len(types)] for i in range(layers)]
    return type(config).from_dict(d)


def small_critic_config(
    policy_config: PretrainedConfig | str, max_fraction: float = 0.25
) -> PretrainedConfig:
    """A same-family config whose critic has at most `max_fraction` of the policy's parameters.

    Compared: `ValueModel` parameters (backbone + head) against the policy's
    causal LM (LM head included, tied weights once). Depth and width shrink
    together: width in whole attention heads (head_dim kept, so RoPE and
    kernels are unchanged; whole KV groups, MLP ratio kept), depth in whole
    layers. Among the shapes under budget we take the one whose smaller
    shrink factor min(layers/L, heads/H) is largest, then the most
    parameters: a balanced scale-down, like Qwen3-0.6B against Qwen3-4B,
    rather than a full-width one-layer stub.

    Parameter count is linear in depth, so two meta-device builds per width
    suffice. Raises ValueError if even one head and one layer is too big
    (the vocabulary embedding alone can exceed the budget for small policies).
    """
    if isinstance(policy_config, str):
        policy_config = AutoConfig.from_pretrained(resolve_model_path(policy_config))
    if not 0 < max_fraction <= 1:
        raise ValueError(f"max_fraction must be in (0, 1], got {max_fraction}")
    budget = max_fraction * _count_params(policy_config, causal_lm=True)
    heads_full = policy_config.num_attention_heads
    layers_full = policy_config.num_hidden_layers

    group = max(1, heads_full // getattr(policy_config, "num_key_value_heads", heads_full))
    step = group if heads_full % group == 0 else 1  # whole KV groups: heads/kv ratio kept
    candidates = []  # (key, heads, layers)
    for heads in range(heads_full, 0, -step):
        one = _count_params(_resize(policy_config, heads, 1), causal_lm=False)
        per_layer = _count_params(_resize(policy_config, heads, 2), causal_lm=False) - one
        hidden = _resize(policy_config, heads, 1).hidden_size
        fixed = one - per_layer + hidden + 1  # embeddings, final norm, value head
        layers = min(layers_full, math.floor((budget - fixed) / per_layer))
        if layers >= 1:
            key = (min(layers / layers_full, heads / heads_full), fixed + layers * per_layer)
            candidates.append((key, heads, layers))
    best = None
    for _, heads, layers in sorted(candidates, reverse=True):
        config = _resize(policy_config, heads, layers)
        if _count_params(config, causal_lm=False) + config.hidden_size + 1 <= budget:
            best = config  # exact count confirms the linear-in-depth estimate
            break
    if best is None:
        raise ValueError(
            f"no critic of the policy's family fits in {max_fraction:.0%} of its parameters "
            f"(budget {budget:,.0f}); raise critic_fraction or give a pretrained critic_path"
        )
    return best
