"""Algorithm configuration: every knob of the losses, advantages, KL and mismatch code.

Pydantic v2 models with `extra="forbid"`, so a misspelt key in a YAML file is
an error, not a silently ignored setting.

Loss presets. Some losses imply other settings (Dr. GRPO divides by a
constant length and does not divide by the std; GSPO averages per sequence).
A loss registers those as `defaults`; they are applied to every field the
user did *not* set explicitly. An explicit value always wins.

Extending: add a field (with a description) or a sub-model here; catalog.py
holds the names that `loss` and `advantage` accept (losses.py / advantages.py
register new ones).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cadence.algo.aggregation import AggregationMode
from cadence.algo.asyppo import CriticConfig
from cadence.algo.catalog import ADVANTAGES, LOSSES
from cadence.algo.rhythm import CreditMode, RhythmConfig

# `algorithm.name` presets: defaults for fields the user did not set.
#   grpo:   critic-free, group-normalised advantages.
#   ppo:    one critic the size of the policy, GAE, plain PPO clip.
#   asyppo: two mini-critics (a quarter of the policy each), GAE on their mean,
#           uncertainty masks from their disagreement (SPEC section 2), and the
#           paper's E[1/|o| sum_t ...]: a token mean per answer, then the mean
#           over answers (seq-mean-token-mean).
ALGORITHM_PRESETS: dict[str, dict] = {
    "grpo": {},
    "ppo": {
        "loss": "ppo",
        "advantage": "gae",
        "critic": {"num_critics": 1, "critic_fraction": 1.0, "adv_mask_low": 0.0, "entropy_mask_high": 0.0},
    },
    "asyppo": {
        "loss": "ppo",
        "advantage": "gae",
        "aggregation": "seq-mean-token-mean",
        # The paper's beta * I^H_t * H_t term; beta is left open there, 1e-3 is the usual PPO value.
        # Without it (entropy_coef=0) the entropy mask from the critics' disagreement does nothing.
        "entropy_coef": 1e-3,
        "critic": {"num_critics": 2, "critic_fraction": 0.25},
    },
}


# Each high-staleness mode's values from its paper / preset, for fields the user left unset.
MISMATCH_MODE_DEFAULTS: dict[str, dict] = {
    "icepop": {"low": 0.5, "high": 5.0},  # Ring-1T's alpha, beta
    "seq_mis": {"cap": 2.0, "sequence_ratio": "product"},  # verl seq_mis(threshold=2.0)
    "geo_rs": {"low": 0.999, "high": 1.001, "veto": 1e-4},  # verl geo_rs()
}
# Modes that multiply the loss by pi_old/mu (not only mask it): a loss that already divides
# by mu must not get them (the weight would apply twice).
WEIGHTING_MISMATCH_MODES = ("token", "sequence", "icepop", "seq_mis", "m2po")


def _check_eps_low(value: float, field: str) -> float:
    # 1 - eps must stay positive, or the lower clip bound is a non-positive ratio.
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{field}={value} must be in [0, 1): the lower clip bound is 1 - {field}")
    return value


def _check_eps_high(value: float, field: str) -> float:
    # No upper limit: clip-higher style values (DAPO 0.28, CISPO's large eps) are legitimate.
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(
            f"{field}={value} must be a finite number >= 0: the upper clip bound is 1 + {field}"
        )
    return value


class KLConfig(BaseModel):
    """KL(pi_theta || pi_ref) regularisation."""

    model_config = ConfigDict(extra="forbid")

    coef: float = Field(0.0, description="KL coefficient beta; 0 disables the KL term.")
    estimator: Literal["k1", "k2", "k3", "k2_grad"] = Field(
        "k3",
        description="Per-token KL estimator: k1 = log-ratio, k2 = half squared, k3 = GRPO's "
        "(its gradient is forward KL's); k2_grad = k3's value with k2's gradient, the unbiased "
        "gradient of KL(pi_theta || pi_ref) ('low_var_kl' done right; see cadence/algo/kl.py).",
    )
    mode: Literal["loss", "reward"] = Field(
        "loss",
        description="'loss': add coef * KL to the loss (GRPO); 'reward': subtract coef * k from "
        "token rewards before advantages (PPO/REINFORCE++).",
    )
    target: float | None = Field(
        None,
        description="Adaptive KL (Ziegler et al. 2019): after each step coef *= 1 + clip(KL/target - 1, "
        "-0.2, 0.2) * batch_size / horizon. None: coef stays fixed.",
    )
    horizon: int = Field(10000, gt=0, description="Adaptive KL: samples over which coef adapts.")
    max_log_ratio: float = Field(
        20.0,
        description="Clamp |log pi_ref - log pi_theta| to this before exp(), so k3 stays finite.",
    )

    @field_validator("coef")
    @classmethod
    def _coef(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"kl.coef={v} must be >= 0 (use 0 to disable the KL term)")
        return v

    @field_validator("max_log_ratio")
    @classmethod
    def _max_log_ratio(cls, v: float) -> float:
        if v <= 0:
            raise ValueError(f"kl.max_log_ratio={v} must be > 0 (20 is a safe value)")
        return v


class MismatchConfig(BaseModel):
    """Correction for the inference engine's mu differing from the trainer's pi_old."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal[
        "auto", "none", "token", "sequence", "mask", "sequence_mask", "icepop", "seq_mis", "geo_rs", "m2po"
    ] = Field(
        "auto",
        description="'token'/'sequence': multiply the loss by sg(min(pi_old/mu, cap)); "
        "'mask'/'sequence_mask': drop tokens/sequences whose ratio is outside [low, high]; "
        "'icepop': weight pi_old/mu, tokens outside [low, high] (default 0.5, 5) dropped (Ring-1T); "
        "'seq_mis': the sequence weight pi_old(y)/mu(y), sequences above cap dropped (verl seq-mis); "
        "'geo_rs': drop sequences whose geometric-mean ratio is outside [low, high] (default 0.999, "
        "1.001) or with a token ratio below veto (verl geo-rs); 'm2po': weight pi_old/mu on the tokens "
        "M2PO's second-moment mask keeps (m2_threshold); "
        "'auto': 'token' for losses whose ratio is against pi_old (ppo, grpo, dr_grpo, gspo, "
        "reinforce), 'none' for those that weight by mu themselves (tis, cispo, topr, decoupled_ppo); "
        "'none': no correction (stale samples are then trained as if fresh).",
    )
    cap: float = Field(2.0, description="Truncation C of the importance weight pi_old/mu.")
    sequence_ratio: Literal["geometric", "product"] = Field(
        "geometric",
        description="Sequence-level ratio: geometric mean of token ratios, or their product "
        "(the exact sequence weight, which drifts far from 1 on long responses).",
    )
    low: float = Field(0.5, description="Masking modes: lowest pi_old/mu ratio kept.")
    high: float = Field(2.0, description="Masking modes: highest pi_old/mu ratio kept.")
    veto: float | None = Field(
        None,
        description="geo_rs (default 1e-4 there): drop a sequence with any token ratio pi_old/mu "
        "below this. None: no veto.",
    )
    m2_threshold: float = Field(
        0.04, description="m2po: tau_M2, the most mean (log pi_old/mu)^2 the kept tokens may have."
    )

    @model_validator(mode="before")
    @classmethod
    def _mode_defaults(cls, data: object) -> object:
        # A mode's paper values for the fields the user did not set (an explicit value wins).
        if isinstance(data, dict) and data.get("mode") in MISMATCH_MODE_DEFAULTS:
            return {**MISMATCH_MODE_DEFAULTS[data["mode"]], **data}
        return data

    @field_validator("cap")
    @classmethod
    def _cap(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"mismatch.cap={v} must be > 0 (about 2 is usual)")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> MismatchConfig:
        if not 0.0 <= self.low < self.high:
            raise ValueError(
                f"mismatch.low={self.low}, mismatch.high={self.high}: need 0 <= low < high "
                "(e.g. low=0.5, high=2.0)"
            )
        if self.mode in ("icepop", "geo_rs", "mask", "sequence_mask") and not self.low <= 1.0 <= self.high:
            raise ValueError(
                f"mismatch.mode={self.mode!r} with [low, high] = [{self.low}, {self.high}] would reject "
                "fresh samples (ratio 1): need low <= 1 <= high"
            )
        if self.veto is not None and not 0.0 < self.veto < 1.0:
            raise ValueError(f"mismatch.veto={self.veto} must be in (0, 1) (1e-4 is verl's) or null")
        if not self.m2_threshold > 0:
            raise ValueError(f"mismatch.m2_threshold={self.m2_threshold} must be > 0 (M2PO uses 0.04)")
        if self.mode == "geo_rs" and self.sequence_ratio != "geometric":
            raise ValueError(
                "mismatch.mode='geo_rs' is geometric-mean rejection by definition: drop "
                "mismatch.sequence_ratio='product' (or use mode='sequence_mask')"
            )
        return self


class AlgorithmConfig(BaseModel):
    """Which loss and advantage estimator to use, and all their hyper-parameters."""

    model_config = ConfigDict(extra="forbid")

    # --- what to run
    name: Literal["grpo", "ppo", "asyppo"] = Field(
        "grpo",
        description="Algorithm preset: grpo (critic-free), ppo (one policy-sized critic), asyppo "
        "(two mini-critics and a disagreement-aware loss). Sets defaults for loss, advantage, critic.",
    )
    critic: CriticConfig = Field(
        default_factory=CriticConfig, description="Critics for name=ppo/asyppo (ignored by grpo)."
    )
    credit: CreditMode = Field(
        "none",
        description="Attention-rhythm token credit on top of any loss: none, local, global, coupled.",
    )
    rhythm: RhythmConfig = Field(
        default_factory=RhythmConfig, description="Attention-rhythm constants (window, horizon, q...)."
    )
    loss: str = Field("grpo", description="Policy loss; see cadence.algo.losses.describe().")
    advantage: str = Field(
        "grpo",
        description="Advantage estimator; see cadence.algo.advantages.describe(). Agentic runs: "
        "grpo/rloo compare episode returns in a group; turn_grpo gives each turn its discounted "
        "return-to-go, normalised over the group's turns; gae (ppo, asyppo) uses the per-turn rewards.",
    )
    aggregation: AggregationMode = Field(
        "token-mean",
        description="How per-token losses become a scalar: token-mean, seq-mean-token-mean, "
        "seq-mean-token-sum, or seq-mean-token-sum-norm (Dr. GRPO: / max_response_length).",
    )
    max_response_length: int | None = Field(
        None,
        description="Constant normaliser L of 'seq-mean-token-sum-norm' (Dr. GRPO): "
        "the generation budget in tokens.",
    )

    # --- PPO-style clip (ppo, grpo, dr_grpo, decoupled_ppo)
    eps_low: float = Field(0.2, description="Lower clip: ratios below 1 - eps_low are clipped.")
    eps_high: float = Field(0.2, description="Upper clip: ratios above 1 + eps_high are clipped.")
    dual_clip: float | None = Field(
        None,
        description="Dual-clip constant c > 1: caps the loss of A < 0 tokens at -c*A. None: off.",
    )

    # --- GSPO
    gspo_eps_low: float = Field(3e-4, description="GSPO lower clip on the sequence ratio.")
    gspo_eps_high: float = Field(4e-4, description="GSPO upper clip on the sequence ratio.")

    # --- Decoupled PPO
    decoupled_behaviour_cap: float | None = Field(
        None,
        description="Cap C on the behaviour weight pi_old/mu of decoupled_ppo. None: uncapped.",
    )
    decoupled_cap_mode: Literal["truncate", "mask"] = Field(
        "truncate",
        description="decoupled_ppo: 'truncate' uses min(w, C); 'mask' drops tokens with w > C (AReaL).",
    )

    # --- TIS
    tis_cap: float = Field(
        2.0, description="TIS: truncation C of the importance weight pi_old/mu (Yao et al.: 2)."
    )

    # --- CISPO
    cispo_eps_low: float = Field(0.1, description="CISPO: weight clipped below at 1 - eps_low.")
    cispo_eps_high: float = Field(0.1, description="CISPO: weight clipped above at 1 + eps_high.")
    cispo_mask: bool = Field(
        False,
        description="CISPO: also drop tokens with (A>0, r>1+eps_high) or (A<0, r<1-eps_low).",
    )

    # --- TOPR
    topr_reward_threshold: float = Field(
        0.0, description="TOPR: sequences with reward > threshold are 'positive' (no IS weight)."
    )

    # --- regularisers
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient; 0 disables it.")
    kl: KLConfig = Field(default_factory=KLConfig, description="KL to a reference policy.")
    mismatch: MismatchConfig = Field(
        default_factory=MismatchConfig, description="Train/inference mismatch correction."
    )

    # --- advantages
    gamma: float = Field(
        1.0,
        description="Discount factor: per model token in GAE and REINFORCE++ token returns, per "
        "turn in turn_grpo.",
    )
    lam: float = Field(0.95, description="GAE lambda.")
    std_normalize: bool = Field(
        True, description="Divide advantages by the std (GRPO, REINFORCE++); Dr. GRPO sets False."
    )
    std_unbiased: bool = Field(
        True, description="Std with Bessel's correction (n - 1), as torch.std; False divides by n."
    )
    adv_eps: float = Field(1e-6, description="Added to the std before dividing, avoids 0/0.")
    whiten_advantages: bool = Field(
        False,
        description="gae: shift and scale the advantages to mean 0, std 1 over the batch's response "
        "tokens, as verl always does (cadence does not by default: off keeps the critic's scale).",
    )

    # --- field checks
    @field_validator("loss")
    @classmethod
    def _loss_known(cls, v: str) -> str:
        if v not in LOSSES:
            raise ValueError(f"loss={v!r} is not a registered loss; valid: {', '.join(LOSSES)}")
        return v

    @field_validator("advantage")
    @classmethod
    def _advantage_known(cls, v: str) -> str:
        if v not in ADVANTAGES:
            valid = ", ".join(ADVANTAGES)
            raise ValueError(f"advantage={v!r} is not a registered estimator; valid: {valid}")
        return v

    @field_validator("eps_low", "gspo_eps_low", "cispo_eps_low")
    @classmethod
    def _eps_low(cls, v: float, info: ValidationInfo) -> float:
        return _check_eps_low(v, info.field_name)

    @field_validator("eps_high", "gspo_eps_high", "cispo_eps_high")
    @classmethod
    def _eps_high(cls, v: float, info: ValidationInfo) -> float:
        return _check_eps_high(v, info.field_name)

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip(cls, v: float | None) -> float | None:
        if v is not None and not v > 1.0:
            raise ValueError(f"dual_clip={v} must be > 1 (3.0 is common) or None to disable it")
        return v

    @field_validator("decoupled_behaviour_cap")
    @classmethod
    def _behaviour_cap(cls, v: float | None) -> float | None:
        if v is not None and not v > 1.0:
            raise ValueError(
                f"decoupled_behaviour_cap={v} must be > 1 (the weight is 1 on fresh data) or None"
            )
        return v

    @field_validator("max_response_length")
    @classmethod
    def _max_len(cls, v: int | None) -> int | None:
        if v is not None and v <= 0:
            raise ValueError(f"max_response_length={v} must be a positive token count")
        return v

    @field_validator("entropy_coef")
    @classmethod
    def _non_negative(cls, v: float, info: ValidationInfo) -> float:
        if v < 0:
            raise ValueError(f"{info.field_name}={v} must be >= 0")
        return v

    @field_validator("gamma", "lam")
    @classmethod
    def _unit(cls, v: float, info: ValidationInfo) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{info.field_name}={v} must be in [0, 1]")
        return v

    @field_validator("adv_eps")
    @classmethod
    def _adv_eps(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(
                f"adv_eps={v} must be > 0 (1e-6 is usual), or a group with equal rewards divides 0 by 0"
            )
        return v

    # --- cross-field checks
    @model_validator(mode="after")
    def _presets_then_checks(self) -> AlgorithmConfig:
        # Presets first (values from the loss's catalog entry, only for fields the user
        # left unset), so the checks below see the settings that will actually run.
        self._apply_algorithm_preset()
        for name, value in LOSSES[self.loss].defaults.items():
            if name not in self.model_fields_set:
                setattr(self, name, value)
        self._resolve_mismatch()
        self._check_consistency()
        return self

    def _resolve_mismatch(self) -> None:
        """'auto': every loss sees the behaviour policy mu, once. Losses whose own weight is
        against mu need nothing more; the rest get the truncated weight min(pi_old/mu, cap)."""
        if self.mismatch.mode == "auto":
            mode = "none" if LOSSES[self.loss].behaviour_weighted else "token"
            self.mismatch = self.mismatch.model_copy(update={"mode": mode})

    @property
    def ignores_staleness(self) -> bool:
        """True when nothing in the loss corrects for samples from an older policy (mu != pi_old)."""
        weighted = LOSSES[self.loss].behaviour_weighted
        return not weighted and self.mismatch.mode in ("none", "auto")

    def _apply_algorithm_preset(self) -> None:
        preset = ALGORITHM_PRESETS[self.name]
        for field, value in preset.items():
            if field == "critic":
                unset = {k: v for k, v in value.items() if k not in self.critic.model_fields_set}
                self.critic = self.critic.model_copy(update=unset)
            elif field not in self.model_fields_set:
                setattr(self, field, value)

    @property
    def uses_critics(self) -> bool:
        return self.name in ("ppo", "asyppo")

    def _check_consistency(self) -> None:
        if self.aggregation == "seq-mean-token-sum-norm" and self.max_response_length is None:
            raise ValueError(
                "aggregation='seq-mean-token-sum-norm' (Dr. GRPO's default) divides by a constant: "
                "set max_response_length to the generation budget in tokens"
            )
        if not self.tis_cap > 0:
            raise ValueError(f"tis_cap={self.tis_cap} must be > 0 (Yao et al. use 2)")
        if LOSSES[self.loss].behaviour_weighted and self.mismatch.mode in WEIGHTING_MISMATCH_MODES:
            raise ValueError(
                f"loss={self.loss!r} already weights tokens by the behaviour policy mu; mismatch.mode="
                f"{self.mismatch.mode!r} would apply pi_old/mu a second time. Use mismatch.mode='auto' "
                "(or 'none') or a masking mode ('mask', 'sequence_mask', 'geo_rs')"
            )
        if self.mismatch.mode == "m2po" and self.dual_clip is not None:
            raise ValueError(
                "mismatch.mode='m2po' replaces the clip with its second-moment mask (M2PO has no clip); "
                "dual_clip would bound what the mask keeps: set dual_clip to null"
            )
        if self.whiten_advantages and self.advantage != "gae":
            raise ValueError(
                f"whiten_advantages=True whitens GAE advantages; advantage={self.advantage!r} is already "
                "normalised (std_normalize): use advantage='gae' (name='ppo' or 'asyppo') or drop it"
            )
        if self.kl.target is not None and (self.kl.coef == 0 or self.kl.mode != "loss"):
            raise ValueError(
                f"kl.target={self.kl.target} adapts kl.coef from the KL measured in the loss: set "
                "kl.coef > 0 (the starting value) and kl.mode='loss'"
            )
        adv = ADVANTAGES[self.advantage]
        if adv.needs_values and not self.uses_critics:
            raise ValueError(
                f"advantage={self.advantage!r} needs a critic's values: set name='ppo' or name='asyppo'"
            )
        if self.kl.coef > 0 and self.kl.mode == "reward" and not adv.accepts_token_rewards:
            accepting = [name for name, info in ADVANTAGES.items() if info.accepts_token_rewards]
            raise ValueError(
                f"kl.mode='reward' needs an advantage estimator that takes token rewards ({accepting}); "
                f"advantage={self.advantage!r} is sequence-level. Use kl.mode='loss' instead"
            )
